-- A thread's cached `values` kept as `json`, the text as written, instead of `jsonb`. Thread reads answer with
-- them, and PostgreSQL wrote 1 MB of jsonb out as text in 4.5-6 ms of its CPU (the `json` text: 1.4 ms), for
-- every GET /threads/{id} and every thread of a search. A run's end writes them whole, and `json` takes its
-- text in less than `jsonb` builds its tree (a 1 MB write 6.2-6.7 against 8.3-11.7 ms). The keys come back in
-- the state's order, as on SQLite (jsonb ordered them by length). What is given up: a state update wrote only
-- the keys it changed (`values || changed`, migration 0013) and now writes the whole text, and a search by
-- values parses the key it compares (`("values" -> key)::jsonb`). Numbers in bench/README (session 20).
-- The patch's bookkeeping goes: the checkpoint the row's values are of, and its trigger. The stamping
-- trigger names the column and is made again around the change of its type. Rewrites the table once.
DROP TRIGGER IF EXISTS threads_state_updated ON threads;
DROP TRIGGER IF EXISTS threads_values_checkpoint ON threads;
DROP FUNCTION IF EXISTS threadline_thread_values_checkpoint();
ALTER TABLE threads DROP COLUMN IF EXISTS values_checkpoint_id;
ALTER TABLE threads ALTER COLUMN "values" TYPE json USING "values"::json;
DO $$
BEGIN
    EXECUTE 'ALTER TABLE threads ALTER COLUMN "values" SET COMPRESSION lz4';
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'threads.values keeps its compression: %', SQLERRM;
END $$;
CREATE TRIGGER threads_state_updated BEFORE INSERT OR UPDATE OF "values", interrupts ON threads
    FOR EACH ROW WHEN (NEW.state_updated_at IS DISTINCT FROM NEW.updated_at)
    EXECUTE FUNCTION threadline_thread_state_updated();
