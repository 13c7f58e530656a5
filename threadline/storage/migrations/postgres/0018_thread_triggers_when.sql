-- The thread row's triggers fire only when they change something, as SQLite's do since its migration 0012.
-- A PL/pgSQL trigger copies the row it is handed and forms it again, and a state write's row holds the whole
-- `values` uncompressed: on a 1 MB state each of the two triggers a state write fired cost about 1.4 ms of
-- PostgreSQL's time, more than the `values || changed` it followed (1.9 ms; bench/README, session 19). The
-- state writes name the new checkpoint and stamp `state_updated_at` with `updated_at` themselves, so neither
-- fires for them now; a write that does not still gets what the triggers did. The functions are unchanged.
DROP TRIGGER IF EXISTS threads_state_updated ON threads;
CREATE TRIGGER threads_state_updated BEFORE INSERT OR UPDATE OF "values", interrupts ON threads
    FOR EACH ROW WHEN (NEW.state_updated_at IS DISTINCT FROM NEW.updated_at)
    EXECUTE FUNCTION threadline_thread_state_updated();

DROP TRIGGER IF EXISTS threads_values_checkpoint ON threads;
CREATE TRIGGER threads_values_checkpoint BEFORE UPDATE OF "values" ON threads
    FOR EACH ROW WHEN (NEW.values_checkpoint_id IS NOT NULL
                       AND NEW.values_checkpoint_id IS NOT DISTINCT FROM OLD.values_checkpoint_id)
    EXECUTE FUNCTION threadline_thread_values_checkpoint();

DROP TRIGGER IF EXISTS threads_expiry ON threads;
CREATE TRIGGER threads_expiry BEFORE INSERT OR UPDATE OF updated_at, ttl_minutes ON threads
    FOR EACH ROW WHEN (NEW.expires_at IS DISTINCT FROM CASE WHEN NEW.ttl_minutes IS NULL THEN NULL
                       ELSE NEW.updated_at + make_interval(secs => NEW.ttl_minutes * 60) END)
    EXECUTE FUNCTION threadline_thread_expiry();
