-- The trigger of 0008 stamped `state_updated_at` with a second UPDATE of the row after each write of its
-- `values` or `interrupts`, and SQLite writes a row whole: a thread holding 1 MB of values was written twice
-- at every state update and every run's end. The thread's state write (`store_thread_state`) now stamps it
-- in the same statement; the trigger stays for any other write of those columns, and fires only when the
-- write left the stamp as it was.
DROP TRIGGER IF EXISTS threads_state_updated_on_update;
CREATE TRIGGER threads_state_updated_on_update AFTER UPDATE OF "values", interrupts ON threads
WHEN NEW.state_updated_at IS OLD.state_updated_at
BEGIN
    UPDATE threads SET state_updated_at = NEW.updated_at WHERE thread_id = NEW.thread_id;
END;
