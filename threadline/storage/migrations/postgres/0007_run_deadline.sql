-- A run's deadline (issue 16, run timeouts): set when it first starts, kept when it is retried, so a run
-- whose worker died still ends `timeout` once it passes, whichever process sweeps it (`recover_runs`).
-- NULL: no timeout applies.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS deadline_at TIMESTAMPTZ;

-- Who created the run, when a cap on active runs per identity applies (`Quota`): counted inside the
-- enqueue transaction, under advisory locks.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS identity TEXT;
CREATE INDEX IF NOT EXISTS runs_active_identity ON runs (identity) WHERE status IN ('pending', 'running');
