"""Every table, channel and statement the PostgreSQL broker uses, built from one prefix (as `keys.Keys` for Redis).

The tables are UNLOGGED (nothing in them matters after a crash: a lost event is a replay gap, a lost cancel
is also stored for its run) and are made by the broker itself at start, so the broker needs nothing from
storage's migrations. Several deployments can share a database when their prefixes differ.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^a-z0-9_]")


class PgNames:
    """The names and SQL of one deployment, all under `<prefix>_broker_`."""

    def __init__(self, prefix: str) -> None:
        base = _UNSAFE.sub("_", prefix.lower())[:40] or "threadline"
        self.streams = f'"{base}_broker_streams"'
        self.events = f'"{base}_broker_events"'
        self.cancels = f'"{base}_broker_cancels"'
        self.leases = f'"{base}_broker_leases"'
        self.windows = f'"{base}_broker_windows"'
        #: The one NOTIFY channel (payloads: see `PostgresBroker._dispatch`), and the listener's application_name.
        self.channel = f"{base}_broker"
        self.listener_name = f"{base}:listener"

    def ddl(self) -> str:
        """Create what is missing (run under an advisory lock: concurrent CREATE IF NOT EXISTS can collide)."""
        return f"""
        CREATE UNLOGGED TABLE IF NOT EXISTS {self.streams} (
            run_id text PRIMARY KEY,
            seq bigint NOT NULL DEFAULT 0,          -- the newest event's number
            last_ms bigint NOT NULL DEFAULT 0,      -- the newest event's time (never decreases)
            dropped_seq bigint NOT NULL DEFAULT 0,  -- the newest event the bounded buffer dropped
            dropped_ms bigint NOT NULL DEFAULT 0,
            ended_at timestamptz,
            touched_at timestamptz NOT NULL DEFAULT now());
        CREATE INDEX IF NOT EXISTS {self.streams[:-1]}_ended" ON {self.streams} (ended_at);
        CREATE UNLOGGED TABLE IF NOT EXISTS {self.events} (
            run_id text NOT NULL,
            seq bigint NOT NULL,
            ms bigint NOT NULL,
            event text NOT NULL,
            data bytea NOT NULL,
            size integer NOT NULL,                  -- what it counts for in the byte budgets (event_bytes)
            PRIMARY KEY (run_id, seq));
        CREATE UNLOGGED TABLE IF NOT EXISTS {self.cancels} (
            run_id text PRIMARY KEY,
            action text NOT NULL,
            sent_at timestamptz NOT NULL DEFAULT now());
        CREATE UNLOGGED TABLE IF NOT EXISTS {self.leases} (
            scope text NOT NULL,
            lease text NOT NULL,
            expires_at timestamptz NOT NULL,
            PRIMARY KEY (scope, lease));
        CREATE UNLOGGED TABLE IF NOT EXISTS {self.windows} (
            key text PRIMARY KEY,                   -- a rate limit's key (its budget and identity)
            win bigint NOT NULL,                    -- the current window: floor(epoch seconds / its length)
            cur bigint NOT NULL,                    -- hits counted in it
            prev bigint NOT NULL,                   -- and in the one before
            at float8 NOT NULL,                     -- epoch seconds of the last hit (the database's clock)
            taken boolean NOT NULL,                 -- whether the last hit was counted
            expires_at timestamptz NOT NULL);       -- when the key counts for nothing any more
        """

    @property
    def append(self) -> str:
        """Append the events of several runs at once: `runs` and `counts` name each run once with how many it
        gets; `event_runs`, `idx` (1, 2, … within its run), `events`, `data`, `sizes` are the events, in
        order. Their (run, ms, seq). The streams' rows are updated in the order of their ids: two processes
        appending to the same runs lock them in the same order."""
        return f"""
        WITH r AS (SELECT * FROM unnest(%(runs)s::text[], %(counts)s::int[]) AS r(run_id, n)),
        s AS (
            INSERT INTO {self.streams} AS s (run_id, seq, last_ms) SELECT run_id, n, %(ms)s FROM r ORDER BY run_id
            ON CONFLICT (run_id) DO UPDATE SET seq = s.seq + EXCLUDED.seq,
                last_ms = GREATEST(s.last_ms, EXCLUDED.last_ms), touched_at = now()
            RETURNING run_id, seq, last_ms)
        INSERT INTO {self.events} (run_id, seq, ms, event, data, size)
        SELECT u.run_id, s.seq - r.n + u.idx, s.last_ms, u.event, u.data, u.size
        FROM unnest(%(event_runs)s::text[], %(idx)s::int[], %(events)s::text[], %(data)s::bytea[],
                    %(sizes)s::int[]) AS u(run_id, idx, event, data, size)
            JOIN s USING (run_id) JOIN r USING (run_id)
        RETURNING run_id, ms, seq"""

    @property
    def trim(self) -> str:
        """Keep the run's newest `keep` events; remember the newest one dropped (for `resume_gap`)."""
        return f"""
        WITH d AS (
            DELETE FROM {self.events} WHERE run_id = %(run)s
                AND seq <= (SELECT seq FROM {self.streams} WHERE run_id = %(run)s) - %(keep)s
            RETURNING ms, seq),
        top AS (SELECT max(seq) AS seq, max(ms) AS ms FROM d)
        UPDATE {self.streams} AS s SET dropped_seq = top.seq, dropped_ms = top.ms
        FROM top WHERE s.run_id = %(run)s AND top.seq IS NOT NULL AND top.seq > s.dropped_seq"""

    @property
    def end(self) -> str:
        """Mark the run's stream ended (again: only renews its retention)."""
        return f"""
        INSERT INTO {self.streams} AS s (run_id, ended_at) VALUES (%(run)s, now())
        ON CONFLICT (run_id) DO UPDATE SET ended_at = now(), touched_at = now()"""

    notify = "SELECT pg_notify(%(channel)s, %(payload)s)"

    @property
    def read(self) -> str:
        """Whether the stream had ended, then the events after a cursor (ms, seq), oldest first, at most
        `limit` (one row of NULLs when there are none). One snapshot: every event before the end is in it.
        `floor`: a seq that every event after the cursor is past (the cursor's own seq when it is the id of
        one of the run's events, as ids grow with seq; else 0): the index starts there, where the row
        comparison alone made each read walk the run's events from its first."""
        return f"""
        SELECT x.ended, e.ms, e.seq, e.event, e.data
        FROM (SELECT coalesce((SELECT ended_at IS NOT NULL FROM {self.streams} WHERE run_id = %(run)s), false)
              AS ended) x
        LEFT JOIN LATERAL (
            SELECT ms, seq, event, data FROM {self.events}
            WHERE run_id = %(run)s AND seq > %(floor)s AND (ms, seq) > (%(ms)s, %(seq)s)
            ORDER BY seq LIMIT %(limit)s) e ON true"""

    @property
    def context(self) -> str:
        """Events kept up to a cursor (included), after another (excluded), oldest first."""
        return f"""
        SELECT ms, seq, event, data FROM {self.events}
        WHERE run_id = %(run)s AND (ms, seq) <= (%(ms)s, %(seq)s) AND seq > %(from)s
        ORDER BY seq LIMIT %(limit)s"""

    @property
    def newest(self) -> str:
        return f"SELECT last_ms, seq FROM {self.streams} WHERE run_id = %(run)s"

    @property
    def stream(self) -> str:
        return f"SELECT dropped_ms, dropped_seq FROM {self.streams} WHERE run_id = %(run)s"

    @property
    def buffered_bytes(self) -> str:
        return f"SELECT coalesce(sum(size), 0) FROM {self.events} WHERE run_id = %(run)s"

    @property
    def store_cancel(self) -> str:
        return f"""
        INSERT INTO {self.cancels} AS c (run_id, action) VALUES (%(run)s, %(action)s)
        ON CONFLICT (run_id) DO UPDATE SET action = %(action)s, sent_at = now()"""

    @property
    def take_cancel(self) -> str:
        return f"DELETE FROM {self.cancels} WHERE run_id = %(run)s RETURNING action"

    #: Serializes the takes of one scope (the two-key advisory lock: its own key space, apart from storage's).
    #: Its own statement, before the count: a statement's snapshot is taken when it starts, and one that took
    #: the lock inside itself could miss a lease committed while it waited for it.
    lock_scope = "SELECT pg_advisory_xact_lock(%(class)s::int, hashtext(%(scope)s))"

    @property
    def take_lease(self) -> str:
        """A lease in the scope, if fewer than `limit` live ones are held (run after `lock_scope`)."""
        return f"""
        INSERT INTO {self.leases} (scope, lease, expires_at)
        SELECT %(scope)s, %(lease)s, now() + make_interval(secs => %(secs)s)
        WHERE (SELECT count(*) FROM {self.leases} WHERE scope = %(scope)s AND expires_at > now()) < %(limit)s
        RETURNING lease"""

    @property
    def renew_leases(self) -> str:
        """Renew leases (parallel arrays of scopes and ids); one swept meanwhile is held again."""
        return f"""
        INSERT INTO {self.leases} AS l (scope, lease, expires_at)
        SELECT u.scope, u.lease, now() + make_interval(secs => %(secs)s)
        FROM unnest(%(scopes)s::text[], %(leases)s::text[]) AS u(scope, lease)
        ON CONFLICT (scope, lease) DO UPDATE SET expires_at = EXCLUDED.expires_at"""

    @property
    def drop_lease(self) -> str:
        return f"DELETE FROM {self.leases} WHERE scope = %(scope)s AND lease = %(lease)s"

    #: A rate limit's sliding window counter (the `limits` library's strategy: the current window's hits plus
    #: the previous window's, weighted by how much of it still overlaps the last `expiry` seconds), shifted
    #: to the database's current window. Read by `window_take` and `window_read` below, on the row `s`.
    _NOW = "extract(epoch FROM clock_timestamp())::float8"
    _PREV = "CASE s.win WHEN {w} THEN s.prev WHEN {w} - 1 THEN s.cur ELSE 0 END"
    _CUR = "CASE s.win WHEN {w} THEN s.cur ELSE 0 END"

    @property
    def window_take(self) -> str:
        """Count `amount` hits of `key` if the weighted count stays within `limit`, in one statement (the
        row's lock serializes concurrent takes of one key); the row after it: (taken, prev, cur, at)."""
        prev, cur = self._PREV.format(w="EXCLUDED.win"), self._CUR.format(w="EXCLUDED.win")
        weighted = (f"floor(({prev}) * (%(expiry)s - (EXCLUDED.at - EXCLUDED.win * %(expiry)s)) / %(expiry)s"
                    f" + ({cur}))")
        ok = f"({weighted} + %(amount)s <= %(limit)s)"
        return f"""
        INSERT INTO {self.windows} AS s (key, win, cur, prev, at, taken, expires_at)
        SELECT %(key)s, floor(n.now / %(expiry)s)::bigint, CASE WHEN %(amount)s <= %(limit)s THEN %(amount)s
               ELSE 0 END, 0, n.now, %(amount)s <= %(limit)s,
               to_timestamp((floor(n.now / %(expiry)s) + 2) * %(expiry)s)
        FROM (SELECT {self._NOW} AS now) n
        ON CONFLICT (key) DO UPDATE SET
            win = EXCLUDED.win, prev = {prev}, cur = {cur} + CASE WHEN {ok} THEN %(amount)s ELSE 0 END,
            at = EXCLUDED.at, taken = {ok}, expires_at = EXCLUDED.expires_at
        RETURNING taken, prev, cur, at"""

    @property
    def window_read(self) -> str:
        """`key`'s counts shifted to the current window, and the database's time: (prev, cur, now); none if
        the key was never hit."""
        w = "floor(n.now / %(expiry)s)::bigint"
        return f"""
        SELECT {self._PREV.format(w=w)}, {self._CUR.format(w=w)}, n.now
        FROM (SELECT {self._NOW} AS now) n JOIN {self.windows} s ON s.key = %(key)s"""

    @property
    def window_clear(self) -> str:
        return f"DELETE FROM {self.windows} WHERE key = %(key)s"

    @property
    def windows_reset(self) -> str:
        return f"WITH d AS (DELETE FROM {self.windows} RETURNING 1) SELECT count(*) FROM d"

    @property
    def sweep(self) -> str:
        """Forget streams `retain` seconds after their end, or `live` seconds after the last event of a run
        that never ended (its process died); cancels nobody took after `retain`; expired leases and rate windows."""
        return f"""
        WITH gone AS (
            DELETE FROM {self.streams} WHERE ended_at < now() - make_interval(secs => %(retain)s)
                OR (ended_at IS NULL AND touched_at < now() - make_interval(secs => %(live)s))
            RETURNING run_id),
        forgotten AS (DELETE FROM {self.events} WHERE run_id IN (SELECT run_id FROM gone)),
        expired AS (DELETE FROM {self.leases} WHERE expires_at < now()),
        idle AS (DELETE FROM {self.windows} WHERE expires_at < now())
        DELETE FROM {self.cancels} WHERE sent_at < now() - make_interval(secs => %(retain)s)"""
