-- `state_updated_at` on threads, as LangGraph's server shows it (and `threads.search` sorts by it): when the
-- thread's state (its `values` or pending `interrupts`) was last written, else when it was created. A trigger
-- stamps it from the row's own `updated_at`, so every write path (runs ending, state updates, copies, prunes)
-- keeps it without knowing, and a metadata patch leaves it alone.
ALTER TABLE threads ADD COLUMN IF NOT EXISTS state_updated_at TIMESTAMPTZ;
UPDATE threads SET state_updated_at = updated_at WHERE state_updated_at IS NULL;
CREATE INDEX IF NOT EXISTS threads_state_updated_at ON threads (state_updated_at);
CREATE OR REPLACE FUNCTION threadline_thread_state_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.state_updated_at := COALESCE(NEW.state_updated_at, NEW.updated_at);
    ELSE
        NEW.state_updated_at := NEW.updated_at;
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS threads_state_updated ON threads;
CREATE TRIGGER threads_state_updated BEFORE INSERT OR UPDATE OF "values", interrupts ON threads
    FOR EACH ROW EXECUTE FUNCTION threadline_thread_state_updated();
