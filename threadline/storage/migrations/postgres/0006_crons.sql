-- Crons: scheduled runs (threadline/storage/crons.py holds every statement on this table).
-- `next_run_date` is the tick the cron fires at next; a scheduler claims it by setting `claim_until` (a lease)
-- with a conditional UPDATE, creates the tick's run, then moves `next_run_date` on, so any number of processes
-- share the work and each tick fires once. `user_id`: who created it (its identity; null without
-- authentication) and `auth_user` (the whole caller, as authentication gave it): the cron's runs run as that caller.
CREATE TABLE IF NOT EXISTS crons (
    cron_id TEXT PRIMARY KEY,
    -- Deleting an assistant or a thread deletes its crons, in the same transaction (as LangGraph's server).
    assistant_id TEXT NOT NULL REFERENCES assistants(assistant_id) ON DELETE CASCADE,
    thread_id TEXT REFERENCES threads(thread_id) ON DELETE CASCADE,
    user_id TEXT,
    auth_user JSONB,
    schedule TEXT NOT NULL,
    timezone TEXT,
    end_time TIMESTAMPTZ,
    enabled BOOLEAN NOT NULL DEFAULT TRUE,
    on_run_completed TEXT,
    payload JSONB NOT NULL DEFAULT '{}',
    metadata JSONB NOT NULL DEFAULT '{}',
    next_run_date TIMESTAMPTZ,
    claim_until TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS crons_due ON crons (next_run_date) WHERE enabled;
CREATE INDEX IF NOT EXISTS crons_thread ON crons (thread_id);
CREATE INDEX IF NOT EXISTS crons_assistant ON crons (assistant_id);
