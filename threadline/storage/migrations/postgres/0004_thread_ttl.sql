-- Thread TTLs (langgraph.json `checkpointer.ttl`, and `ttl` on thread create and update).
-- A thread with `ttl_minutes` expires that long after its last update: `expires_at` follows
-- `updated_at` through a trigger, so every write path (runs, state updates, patches) extends it
-- without each having to know, and the sweep finds expired threads through an index.
ALTER TABLE threads RENAME COLUMN ttl TO ttl_strategy;
ALTER TABLE threads ADD COLUMN IF NOT EXISTS ttl_minutes DOUBLE PRECISION;
ALTER TABLE threads ADD COLUMN IF NOT EXISTS expires_at TIMESTAMPTZ;
CREATE INDEX IF NOT EXISTS threads_expires_at ON threads (expires_at) WHERE expires_at IS NOT NULL;
CREATE OR REPLACE FUNCTION threadline_thread_expiry() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.expires_at := CASE WHEN NEW.ttl_minutes IS NULL THEN NULL
                           ELSE NEW.updated_at + make_interval(secs => NEW.ttl_minutes * 60) END;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS threads_expiry ON threads;
CREATE TRIGGER threads_expiry BEFORE INSERT OR UPDATE OF updated_at, ttl_minutes ON threads
    FOR EACH ROW EXECUTE FUNCTION threadline_thread_expiry();
