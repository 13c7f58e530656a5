-- A run's deadline (issue 16, run timeouts): set when it first starts, kept when it is retried, so a run
-- whose worker died still ends `timeout` once it passes (`recover_runs`). NULL: no timeout applies.
ALTER TABLE runs ADD COLUMN deadline_at TEXT;
