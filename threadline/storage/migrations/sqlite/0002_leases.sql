-- A claim lasts until lease_expires_at unless its worker heartbeats; `attempt` is the fencing token.
ALTER TABLE runs ADD COLUMN lease_expires_at TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS runs_one_running_per_thread ON runs (thread_id) WHERE status = 'running';
