-- Which checkpoint a thread's cached `values` are the state of, so that a state update can send the row only
-- the top-level keys it changed (`store_thread_state`'s patch: `values || changed - removed`) instead of the
-- whole state (1 MB of JSON parsed, compressed and stored again for a one-key update). Set by the state write
-- that names its checkpoint; any other write of `values` (a run's end, PATCH /threads, a copy) forgets it,
-- here, so that a patch is applied only onto the values of the checkpoint it was computed against. A write
-- that names the checkpoint the row already names forgets it too (the trigger cannot tell it from a write that
-- does not name one): the next update then writes the whole values once.
ALTER TABLE threads ADD COLUMN IF NOT EXISTS values_checkpoint_id TEXT;
CREATE OR REPLACE FUNCTION threadline_thread_values_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.values_checkpoint_id IS NOT DISTINCT FROM OLD.values_checkpoint_id THEN
        NEW.values_checkpoint_id := NULL;
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS threads_values_checkpoint ON threads;
CREATE TRIGGER threads_values_checkpoint BEFORE UPDATE OF "values" ON threads
    FOR EACH ROW EXECUTE FUNCTION threadline_thread_values_checkpoint();
