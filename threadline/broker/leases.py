"""The leases one process holds in its broker (`Broker.take_lease`), renewed for as long as it holds them.

A count shared by every process of a deployment (the open streams of one identity, against
`max_streams_per_identity`) is a set of leases in the broker: a process takes one per stream and drops it when
the stream ends. A process killed with its streams open cannot drop them; they expire `seconds` after its last
renewal instead of counting for ever. Each process renews what it holds every third of `seconds`, in one
exchange; a renewal the broker cannot take (an outage) is tried again at the next tick, and a lease that
expired meanwhile is held again by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from threadline.broker.base import Broker
from threadline.errors import Unavailable

log = logging.getLogger("threadline.broker")

Release = Callable[[], Awaitable[None]]


class Leases:
    """This process's leases in `broker`, each living `seconds` past its last renewal."""

    def __init__(self, broker: Broker, seconds: float, *,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.broker, self.seconds = broker, seconds
        self._sleep = sleep  # what the renewals wait on between ticks: a test drives it instead of waiting
        self.held: dict[str, set[str]] = {}  # scope → leases
        self._renewing: asyncio.Task[None] | None = None

    async def take(self, scope: str, limit: int) -> Release | None:
        """A lease in `scope` if fewer than `limit` are held there deployment-wide: the function that gives it
        back (once; later calls do nothing); None when the scope is full. Raises Unavailable."""
        lease = await self.broker.take_lease(scope, limit, self.seconds)
        if lease is None:
            return None
        self.held.setdefault(scope, set()).add(lease)
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew(), name="threadline-lease-renewal")
        released = False

        async def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            ids = self.held.get(scope)
            if ids is not None:  # no longer renewed from now on, whatever becomes of the drop
                ids.discard(lease)
                if not ids:
                    del self.held[scope]
            # Shielded: a release in a `finally` of a cancelled stream still reaches the broker. One that fails
            # (the broker away) leaves the lease to expire.
            with contextlib.suppress(Unavailable):
                await asyncio.shield(self.broker.drop_lease(scope, lease))

        return release

    async def _renew(self) -> None:
        while self.held:
            await self._sleep(self.seconds / 3)
            held = {scope: set(ids) for scope, ids in self.held.items()}
            try:
                await self.broker.renew_leases(held, self.seconds)
            except Unavailable as exc:  # counted in the broker's outage record; tried again next tick
                log.debug("leases not renewed (%s); trying again in %.1f s", exc, self.seconds / 3)

    async def close(self) -> None:
        """Stop renewing (what is still held expires by itself)."""
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing
