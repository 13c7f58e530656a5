"""Rate limits per identity: one budget for creating runs, one for every other request (issue 16).

Budgets are `limits` rate strings (`"10/second"`, `"600 per minute"`), counted with its sliding-window
counter: in this process on the embedded default, in Redis on PostgreSQL + Redis, and in PostgreSQL when it
is the only service (`broker/windows.py`), so every API process of a deployment draws on the same budget.
A spent budget answers 429 with `Retry-After` and the RateLimit header fields of
draft-ietf-httpapi-ratelimit-headers in their separate form (`RateLimit-Limit`, `RateLimit-Remaining`,
`RateLimit-Reset`, seconds). `GET /ok` and `/metrics` are never limited: probes and scrapes must not be
throttled. When that store cannot answer, a request is let through (and logged): a limiter must not take the
API down with it.

Who is limited is `identity_of(request)`, the one seam: the authenticated caller's identity, else the client's
address (`X-Forwarded-For` counts only when the peer is a configured trusted proxy). So `RateLimit` runs inside
authentication (`api/app.py`): an authenticated request draws on its identity's budget, wherever it comes from.
A request whose credentials are refused never reaches it; `AuthFailures`, outside authentication, counts those
against their address's budget, and once an address has spent it, refuses its requests with 429 before the
authenticator is asked (valid credentials from that address included, until the window refills), so a flood of
bad credentials, or a guess at keys, is bounded by address. See docs/configuration.md, "Rate limits".
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
from limits import RateLimitItem, parse
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from starlette.requests import HTTPConnection, Request

from threadline.api.auth import AUTHENTICATED, REFUSED
from threadline.api.metrics import metrics_of
from threadline.broker.base import Broker
from threadline.errors import ConfigError

log = logging.getLogger("threadline.api")

#: POSTs that create runs: the run-creation budget. Everything else draws on the request budget.
RUN_CREATION = re.compile(r"^(/threads/[^/]+)?/runs(/stream|/wait|/batch)?/?$")
NEVER_LIMITED = frozenset({"/ok", "/metrics"})
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def trusted_networks(spec: str) -> tuple[Network, ...]:
    """`trusted_proxies` (comma-separated addresses or CIDR blocks) parsed once."""
    try:
        return tuple(ipaddress.ip_network(part.strip(), strict=False) for part in spec.split(",") if part.strip())
    except ValueError as exc:
        raise ConfigError(f"trusted_proxies: {exc}") from exc


def _trusted(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def from_trusted_proxy(request: HTTPConnection, trusted: str) -> bool:
    """Whether the request's peer is one of `trusted_proxies`, whose forwarding headers may be believed."""
    peer = request.client.host if request.client else ""
    return bool(trusted) and _trusted(peer, trusted_networks(trusted))


def client_address(request: HTTPConnection, trusted: str = "") -> str:
    """The client's address: the peer's, unless the peer is a trusted proxy; then the nearest address in
    `X-Forwarded-For` that is not a trusted proxy (read from the right, where trusted proxies append)."""
    peer = request.client.host if request.client else "unknown"
    networks = trusted_networks(trusted) if trusted else ()
    if not networks or not _trusted(peer, networks):
        return peer
    hops = [h.strip() for h in ",".join(request.headers.getlist("x-forwarded-for")).split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, networks):
            return hop
    return hops[0] if hops else peer


#: Where the authentication layer (`api/auth.py: Authenticate`) leaves the caller in the scope, and marks a refusal.
AUTH_USER_KEY = AUTHENTICATED
#: Set in the scope of a request the app makes to itself while serving another (the web console's API calls,
#: `ui/client.py`): the request budget was spent by the request being served, so these are not charged again.
#: A scope key, not a header: no client can set it. A run created so still spends the run-creation budget.
ON_BEHALF = "threadline.on_behalf"


def identity_of(request: HTTPConnection) -> str:
    """Who a request counts against, for rate limits, quotas and stream caps. The seam for authentication:
    the authenticated caller's `identity` (the scope's `threadline.auth_user`, or `request.state.identity`)
    wins; else the client address. A layer only sees the caller if it runs after authentication."""
    user = request.scope.get(AUTH_USER_KEY) or request.scope.get("user")
    given = getattr(request.state, "identity", None) or getattr(user, "identity", None)
    if given:
        return f"user:{given}"
    settings = getattr(request.app.state, "settings", None) if request.scope.get("app") is not None else None
    return "ip:" + client_address(request, getattr(settings, "trusted_proxies", "") or "")


@dataclass(frozen=True)
class Budget:
    name: str  # "runs" or "requests"
    item: RateLimitItem


class RateLimiter:
    """The budgets of one app. The shared budgets are counted where the deployment's broker counts them
    (`Broker.rate_counters`: this process's memory on the embedded default, Redis, or PostgreSQL when it is
    the only service), so every API process of a deployment spends one budget."""

    def __init__(self, runs: str, requests: str, *, auth_failures: str = "") -> None:
        self.budgets = {name: Budget(name, _parse(name, spec)) for name, spec in
                        (("runs", runs), ("requests", requests)) if spec}
        #: Refused credentials per address, on by default (`rate_limit_auth_failures`). Counted in this
        #: process's memory, whatever the backend: checking it costs every unauthenticated request, which a
        #: round trip to a shared store would make dear; so each API process allows the budget once.
        self.failures = Budget("auth_failures", _parse("auth_failures", auth_failures)) if auth_failures else None
        self.failure_strategy = SlidingWindowCounterRateLimiter(MemoryStorage())
        #: Before the app has a runtime (and so a broker), the shared budgets are counted in this process.
        self._local = SlidingWindowCounterRateLimiter(MemoryStorage())
        self._shared: tuple[Broker, SlidingWindowCounterRateLimiter] | None = None

    @classmethod
    def of(cls, settings: Any) -> RateLimiter:
        return cls(settings.rate_limit_runs, settings.rate_limit_requests,
                   auth_failures=settings.rate_limit_auth_failures)

    def strategy(self, scope: Any) -> SlidingWindowCounterRateLimiter:
        """The shared budgets' counter: in the storage of the broker of the app serving `scope`."""
        app = scope.get("app")
        runtime = getattr(app.state, "runtime", None) if app is not None else None
        broker = getattr(runtime, "broker", None)
        if broker is None:
            return self._local
        if self._shared is None or self._shared[0] is not broker:  # (a new runtime: a restarted app)
            self._shared = broker, SlidingWindowCounterRateLimiter(broker.rate_counters)
        return self._shared[1]

    @property
    def enabled(self) -> bool:
        return bool(self.budgets)

    def budget_for(self, method: str, path: str) -> Budget | None:
        if path in NEVER_LIMITED:
            return None
        if method == "POST" and RUN_CREATION.match(path):
            return self.budgets.get("runs")
        return self.budgets.get("requests")

    async def hit(self, scope: Any, budget: Budget, identity: str, *, spend: bool = True) -> tuple[bool, int, int]:
        """Spend one of `identity`'s `budget` (or, without `spend`, only look whether one is left):
        (allowed, remaining, seconds until it refills)."""
        strategy = self.failure_strategy if budget is self.failures else self.strategy(scope)
        try:
            if await (strategy.hit if spend else strategy.test)(budget.item, budget.name, identity):
                return True, -1, 0
            stats = await strategy.get_window_stats(budget.item, budget.name, identity)
        except Exception as exc:  # noqa: BLE001 - the store away: let the request through rather than fail it
            log.warning("rate limit not checked (%s: %s); request allowed", type(exc).__name__, exc)
            return True, -1, 0
        return False, max(stats.remaining, 0), max(1, math.ceil(stats.reset_time - time.time()))


def _parse(name: str, spec: str) -> RateLimitItem:
    try:
        return parse(spec)
    except ValueError as exc:
        raise ConfigError(f"rate_limit_{name} {spec!r} is not a rate such as '10/second' or '600 per minute'"
                          ) from exc


class RateLimit:
    """ASGI middleware: refuses a request whose identity spent its budget with 429."""

    def __init__(self, app: Any, limiter: RateLimiter) -> None:
        self.app = app
        self.limiter = limiter
        self.templates = _Templates()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        budget = self.limiter.budget_for(scope.get("method", "GET"), scope.get("path", "")) \
            if scope["type"] == "http" and self.limiter.enabled else None
        if budget is None or (budget.name == "requests" and scope.get(ON_BEHALF)):
            await self.app(scope, receive, send)
            return
        allowed, remaining, reset = await self.limiter.hit(scope, budget, identity_of(Request(scope)))
        if allowed:
            await self.app(scope, receive, send)
            return
        metrics = metrics_of(scope)
        if metrics is not None:
            metrics.rate_limited(self.templates.of(scope), budget.name)
        await _refuse(send, budget, remaining, reset)


class AuthFailures:
    """ASGI middleware outside authentication (`api/auth.py: Authenticate`): a request the authenticator refused
    spends one of its address's budgets (`rate_limit_auth_failures`, and the one the request would have drawn
    on if rate limits are set), and a request from an address that has spent one is refused with 429 before it
    is authenticated. Authenticated requests never spend them: `RateLimit`, inside authentication, counts them
    against their identity."""

    def __init__(self, app: Any, limiter: RateLimiter) -> None:
        self.app = app
        self.limiter = limiter
        self.templates = _Templates()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        budgets = self._budgets(scope)
        if not budgets:
            await self.app(scope, receive, send)
            return
        address = identity_of(Request(scope))  # not authenticated yet: the client's address
        for budget in budgets:
            allowed, remaining, reset = await self.limiter.hit(scope, budget, address, spend=False)
            if not allowed:
                metrics = metrics_of(scope)
                if metrics is not None:
                    metrics.rate_limited(self.templates.of(scope), budget.name)
                await _refuse(send, budget, remaining, reset)
                return
        await self.app(scope, receive, send)
        if scope.get(REFUSED):
            for budget in budgets:
                await self.limiter.hit(scope, budget, address)

    def _budgets(self, scope: Any) -> list[Budget]:
        path = scope.get("path", "")
        if scope["type"] != "http" or AUTHENTICATED in scope or path in NEVER_LIMITED:
            return []
        shared = self.limiter.budget_for(scope.get("method", "GET"), path) if self.limiter.enabled else None
        return [b for b in (self.limiter.failures, shared) if b is not None]


class _Templates:
    """Route templates (`/threads/{thread_id}/runs`) of the app's OpenAPI paths, to label a refused request,
    which is refused before routing. Unknown paths are `unmatched`: label values stay bounded."""

    def __init__(self) -> None:
        self._compiled: list[tuple[re.Pattern[str], str]] | None = None

    def of(self, scope: Any) -> str:
        if self._compiled is None:
            try:
                paths = list(scope["app"].openapi().get("paths", {}))
            except Exception:  # noqa: BLE001 - no schema to read: every path is labelled "unmatched"
                paths = []
            self._compiled = [(re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(t)) + "/?$"), t)
                              for t in paths]
        path = scope.get("path", "")
        return next((template for pattern, template in self._compiled if pattern.match(path)), "unmatched")


async def _refuse(send: Any, budget: Budget, remaining: int, reset: int) -> None:
    what = {"runs": "run creation", "auth_failures": "failed authentication"}.get(budget.name, "requests")
    message = f"Rate limit exceeded for {what} ({budget.item}): retry in {reset} s"
    body = orjson.dumps({"detail": message, "code": "rate_limited", "message": message})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(reset).encode()), (b"ratelimit-limit", str(budget.item.amount).encode()),
               (b"ratelimit-remaining", str(remaining).encode()), (b"ratelimit-reset", str(reset).encode())]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
