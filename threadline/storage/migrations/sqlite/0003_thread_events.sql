-- Protocol v2 events of a thread (POST /threads/{id}/stream/events), numbered per thread by `seq`.
-- `thread_event_counters` hands out the numbers: one row per thread, bumped in the transaction that
-- inserts the events, so numbers are never reused and commit in order. Only the newest events of
-- a thread are kept (storage.base.THREAD_EVENTS_KEPT); older ones are deleted as new ones arrive.
-- `namespace` and `params` are JSON text, stored as the wire has them.
CREATE TABLE IF NOT EXISTS thread_events (
    thread_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    run_id TEXT,
    method TEXT NOT NULL,
    channel TEXT NOT NULL,
    namespace TEXT NOT NULL DEFAULT '[]',
    params TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
);
CREATE TABLE IF NOT EXISTS thread_event_counters (
    thread_id TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL
);
