-- A thread's `values` and a run's `output` go last in their rows. SQLite stores a row as one record and a
-- value past a page in a chain of overflow pages, which a read of any later column walks page by page: a thread
-- of 1 MB of values cost about 0.5-0.8 ms to read without them (its status, metadata, interrupts, stamps, as
-- every request on the thread does), 0.05 ms with them last (bench/README.md, "Large state on SQLite"). Tables
-- cannot reorder their columns in place: each is built anew, its rows copied, its indexes and triggers made
-- again as the migrations before left them. No other table or trigger names these two. The run sequence
-- (AUTOINCREMENT) carries over, so a run's `seq` is never given out twice.
CREATE TABLE threads_new (
    thread_id TEXT PRIMARY KEY,
    status TEXT NOT NULL DEFAULT 'idle',
    metadata TEXT NOT NULL DEFAULT '{}',
    config TEXT NOT NULL DEFAULT '{}',
    interrupts TEXT NOT NULL DEFAULT '{}',
    error TEXT,
    ttl_strategy TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    ttl_minutes REAL,
    expires_at TEXT,
    state_updated_at TEXT,
    "values" TEXT
);
INSERT INTO threads_new (thread_id, status, metadata, config, interrupts, error, ttl_strategy, created_at,
                         updated_at, ttl_minutes, expires_at, state_updated_at, "values")
SELECT thread_id, status, metadata, config, interrupts, error, ttl_strategy, created_at, updated_at, ttl_minutes,
       expires_at, state_updated_at, "values" FROM threads;
DROP TABLE threads;
ALTER TABLE threads_new RENAME TO threads;
CREATE INDEX threads_expires_at ON threads (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX threads_state_updated_at ON threads (state_updated_at);
CREATE TRIGGER threads_expiry_on_insert AFTER INSERT ON threads
WHEN NEW.ttl_minutes IS NOT NULL
BEGIN
    UPDATE threads SET expires_at = strftime('%Y-%m-%dT%H:%M:%f', NEW.updated_at,
                                             '+' || printf('%.3f', NEW.ttl_minutes * 60) || ' seconds') || '+00:00'
    WHERE thread_id = NEW.thread_id;
END;
CREATE TRIGGER threads_expiry_on_update AFTER UPDATE OF updated_at, ttl_minutes ON threads
WHEN NEW.ttl_minutes IS NOT NULL OR OLD.ttl_minutes IS NOT NULL
BEGIN
    UPDATE threads SET expires_at = CASE WHEN NEW.ttl_minutes IS NULL THEN NULL ELSE
        strftime('%Y-%m-%dT%H:%M:%f', NEW.updated_at,
                 '+' || printf('%.3f', NEW.ttl_minutes * 60) || ' seconds') || '+00:00' END
    WHERE thread_id = NEW.thread_id;
END;
CREATE TRIGGER threads_state_updated_on_insert AFTER INSERT ON threads
WHEN NEW.state_updated_at IS NULL
BEGIN
    UPDATE threads SET state_updated_at = NEW.updated_at WHERE thread_id = NEW.thread_id;
END;
CREATE TRIGGER threads_state_updated_on_update AFTER UPDATE OF "values", interrupts ON threads
WHEN NEW.state_updated_at IS OLD.state_updated_at
BEGIN
    UPDATE threads SET state_updated_at = NEW.updated_at WHERE thread_id = NEW.thread_id;
END;
CREATE TRIGGER crons_of_deleted_thread AFTER DELETE ON threads
BEGIN
    DELETE FROM crons WHERE thread_id = OLD.thread_id;
END;

CREATE TABLE runs_new (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    thread_id TEXT NOT NULL,
    assistant_id TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    kwargs TEXT NOT NULL DEFAULT '{}',
    multitask_strategy TEXT NOT NULL DEFAULT 'reject',
    available_at TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    worker_id TEXT,
    error TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    lease_expires_at TEXT,
    deadline_at TEXT,
    identity TEXT,
    quota_slots INTEGER NOT NULL DEFAULT 0,
    output TEXT
);
INSERT INTO runs_new (seq, run_id, thread_id, assistant_id, status, metadata, kwargs, multitask_strategy,
                      available_at, attempt, worker_id, error, created_at, updated_at, lease_expires_at,
                      deadline_at, identity, quota_slots, output)
SELECT seq, run_id, thread_id, assistant_id, status, metadata, kwargs, multitask_strategy, available_at, attempt,
       worker_id, error, created_at, updated_at, lease_expires_at, deadline_at, identity, quota_slots, output
FROM runs;
-- The next seq stays past every seq ever given, deleted runs' included (the copy sets it only to the highest kept).
DELETE FROM sqlite_sequence WHERE name = 'runs_new';
INSERT INTO sqlite_sequence (name, seq) SELECT 'runs_new', seq FROM sqlite_sequence WHERE name = 'runs';
DROP TABLE runs;
ALTER TABLE runs_new RENAME TO runs;
CREATE INDEX runs_queue ON runs (status, seq);
CREATE INDEX runs_thread ON runs (thread_id, seq);
CREATE UNIQUE INDEX runs_one_running_per_thread ON runs (thread_id) WHERE status = 'running';
CREATE INDEX runs_active_identity ON runs (identity) WHERE status IN ('pending', 'running');
