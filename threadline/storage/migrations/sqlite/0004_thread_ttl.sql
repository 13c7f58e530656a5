-- Thread TTLs (langgraph.json `checkpointer.ttl`, and `ttl` on thread create and update).
-- A thread with `ttl_minutes` expires that long after its last update: `expires_at` follows
-- `updated_at` through triggers, so every write path (runs, state updates, patches) extends it
-- without each having to know, and the sweep finds expired threads through an index.
-- Timestamps are ISO-8601 UTC text as elsewhere; `expires_at` has millisecond precision.
ALTER TABLE threads RENAME COLUMN ttl TO ttl_strategy;
ALTER TABLE threads ADD COLUMN ttl_minutes REAL;
ALTER TABLE threads ADD COLUMN expires_at TEXT;
CREATE INDEX IF NOT EXISTS threads_expires_at ON threads (expires_at) WHERE expires_at IS NOT NULL;
CREATE TRIGGER IF NOT EXISTS threads_expiry_on_insert AFTER INSERT ON threads
WHEN NEW.ttl_minutes IS NOT NULL
BEGIN
    UPDATE threads SET expires_at = strftime('%Y-%m-%dT%H:%M:%f', NEW.updated_at,
                                             '+' || printf('%.3f', NEW.ttl_minutes * 60) || ' seconds') || '+00:00'
    WHERE thread_id = NEW.thread_id;
END;
CREATE TRIGGER IF NOT EXISTS threads_expiry_on_update AFTER UPDATE OF updated_at, ttl_minutes ON threads
BEGIN
    UPDATE threads SET expires_at = CASE WHEN NEW.ttl_minutes IS NULL THEN NULL ELSE
        strftime('%Y-%m-%dT%H:%M:%f', NEW.updated_at,
                 '+' || printf('%.3f', NEW.ttl_minutes * 60) || ' seconds') || '+00:00' END
    WHERE thread_id = NEW.thread_id;
END;
