-- Protocol v2 events of a thread (POST /threads/{id}/stream/events), numbered per thread by `seq`.
-- `thread_event_counters` hands out the numbers: the appender's UPDATE of the thread's counter row
-- holds that row's lock until its transaction commits, so concurrent appenders on one thread (any
-- process) take consecutive ranges one after the other and commit in `seq` order: a reader that has
-- seen seq n never later finds a smaller one appear. Only the newest events of a thread are kept
-- (storage.base.THREAD_EVENTS_KEPT). `namespace` and `params` are JSON text, stored as the wire has them.
CREATE TABLE IF NOT EXISTS thread_events (
    thread_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    run_id TEXT,
    method TEXT NOT NULL,
    channel TEXT NOT NULL,
    namespace TEXT NOT NULL DEFAULT '[]',
    params TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, seq)
);
CREATE TABLE IF NOT EXISTS thread_event_counters (
    thread_id TEXT PRIMARY KEY,
    last_seq BIGINT NOT NULL
);
