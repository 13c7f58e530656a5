"""Every Redis key, channel and client name the Redis broker uses, built from one key prefix.

Several deployments can share a Redis database as long as their prefixes differ; everything of one
deployment matches `Keys(prefix).everything` (a SCAN pattern).
"""

from __future__ import annotations

import re

_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def glob_escape(text: str) -> str:
    """`text` as a literal inside a Redis glob pattern (PSUBSCRIBE, SCAN MATCH)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


class Keys:
    """The names of one deployment, all under `<prefix>:`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        #: SCAN pattern of every key of this deployment.
        self.everything = f"{glob_escape(prefix)}:*"
        #: Channel of worker wake-ups (one PUBLISH per wake-up; payload: the sender's id). Sent by versions
        #: before the wake-up tokens; still listened to, so that their enqueues wake workers during an upgrade.
        self.wake_channel = f"{prefix}:wake"
        #: List of wake-up tokens: one pushed per wake-up, taken (BLPOP) by one waiting claimer of any process.
        self.wake_tokens = f"{prefix}:wake:tokens"
        #: Pattern of the per-run "run done" channels.
        self.done_pattern = f"{glob_escape(prefix)}:done:*"
        #: Pattern of the per-run cancel channels.
        self.cancel_pattern = f"{glob_escape(prefix)}:cancel:*"
        #: Prefix of the rate-limit counters (`threadline.api.ratelimit`; the `limits` library names the rest).
        self.rate_limits = f"{prefix}:ratelimit"

    # Keys.

    def events(self, run_id: str) -> str:
        """Stream of the run's events: fields `e` (event name) and `d` (data), at most `buffer_events`."""
        return f"{self.prefix}:run:{run_id}:events"

    def end(self, run_id: str) -> str:
        """Stream holding one entry once the run's stream has ended (its existence is the flag)."""
        return f"{self.prefix}:run:{run_id}:end"

    def early_cancel(self, run_id: str) -> str:
        """String: the cancel action sent to a run, kept for a worker that has not registered yet."""
        return f"{self.prefix}:run:{run_id}:cancel"

    def leases(self, scope: str) -> str:
        """Sorted set of the live leases of one scope (`Broker.take_lease`): member the lease, score when it
        expires (Redis's own clock, in ms); the set itself expires with its newest lease."""
        return f"{self.prefix}:leases:{scope}"

    # Channels.

    def done_channel(self, run_id: str) -> str:
        return f"{self.prefix}:done:{run_id}"

    def cancel_channel(self, run_id: str) -> str:
        return f"{self.prefix}:cancel:{run_id}"

    def parse_channel(self, channel: str) -> tuple[str, str]:
        """`(kind, run_id)` of a channel of ours: kind is "wake", "done" or "cancel" ("" when not ours)."""
        if channel == self.wake_channel:
            return "wake", ""
        for kind in ("done", "cancel"):
            head = f"{self.prefix}:{kind}:"
            if channel.startswith(head):
                return kind, channel[len(head):]
        return "", ""

    # Client names (CLIENT LIST shows them; operators and tests find the listener by it).

    @property
    def listener_name(self) -> str:
        """Client name of each broker's pub/sub connection (no spaces allowed)."""
        return f"{self.prefix.replace(' ', '_')}:listener"

    @property
    def reads_name(self) -> str:
        """Client name of each broker's stream-reading connection (`broker/redis_reads.py`)."""
        return f"{self.prefix.replace(' ', '_')}:reads"
