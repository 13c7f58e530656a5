-- Crons: scheduled runs (threadline/storage/crons.py holds every statement on this table).
-- `next_run_date` is the tick the cron fires at next; a scheduler claims it by setting `claim_until` (a lease)
-- with a conditional UPDATE, creates the tick's run, then moves `next_run_date` on. `user_id`: who created it
-- (its identity; null without authentication) and `auth_user` (the whole caller, as authentication gave it):
-- the cron's runs run as that caller.
CREATE TABLE IF NOT EXISTS crons (
    cron_id TEXT PRIMARY KEY,
    assistant_id TEXT NOT NULL,
    thread_id TEXT,
    user_id TEXT,
    auth_user TEXT,
    schedule TEXT NOT NULL,
    timezone TEXT,
    end_time TEXT,
    enabled INTEGER NOT NULL DEFAULT 1,
    on_run_completed TEXT,
    payload TEXT NOT NULL DEFAULT '{}',
    metadata TEXT NOT NULL DEFAULT '{}',
    next_run_date TEXT,
    claim_until TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS crons_due ON crons (next_run_date) WHERE enabled = 1;
CREATE INDEX IF NOT EXISTS crons_thread ON crons (thread_id);
CREATE INDEX IF NOT EXISTS crons_assistant ON crons (assistant_id);
-- Deleting an assistant or a thread deletes its crons, in the same transaction (as LangGraph's server; a
-- trigger, where foreign keys may be off).
CREATE TRIGGER IF NOT EXISTS crons_of_deleted_thread AFTER DELETE ON threads
BEGIN
    DELETE FROM crons WHERE thread_id = OLD.thread_id;
END;
CREATE TRIGGER IF NOT EXISTS crons_of_deleted_assistant AFTER DELETE ON assistants
BEGIN
    DELETE FROM crons WHERE assistant_id = OLD.assistant_id;
END;
