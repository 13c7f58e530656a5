-- A run's deadline (issue 16, run timeouts): set when it first starts, kept when it is retried, so a run
-- whose worker died still ends `timeout` once it passes (`recover_runs`). NULL: no timeout applies.
ALTER TABLE runs ADD COLUMN deadline_at TEXT;

-- Who created the run, when a cap on active runs per identity applies (`Quota`): counted inside the
-- enqueue transaction.
ALTER TABLE runs ADD COLUMN identity TEXT;
CREATE INDEX IF NOT EXISTS runs_active_identity ON runs (identity) WHERE status IN ('pending', 'running');
