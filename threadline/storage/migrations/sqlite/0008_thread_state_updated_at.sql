-- `state_updated_at` on threads, as LangGraph's server shows it (and `threads.search` sorts by it): when the
-- thread's state (its `values` or pending `interrupts`) was last written, else when it was created. Triggers
-- stamp it from the row's own `updated_at`, so every write path (runs ending, state updates, copies, prunes)
-- keeps it without knowing, and a metadata patch leaves it alone.
ALTER TABLE threads ADD COLUMN state_updated_at TEXT;
UPDATE threads SET state_updated_at = updated_at;
CREATE INDEX IF NOT EXISTS threads_state_updated_at ON threads (state_updated_at);
CREATE TRIGGER IF NOT EXISTS threads_state_updated_on_insert AFTER INSERT ON threads
WHEN NEW.state_updated_at IS NULL
BEGIN
    UPDATE threads SET state_updated_at = NEW.updated_at WHERE thread_id = NEW.thread_id;
END;
CREATE TRIGGER IF NOT EXISTS threads_state_updated_on_update AFTER UPDATE OF "values", interrupts ON threads
BEGIN
    UPDATE threads SET state_updated_at = NEW.updated_at WHERE thread_id = NEW.thread_id;
END;
