-- A thread's cached `values` (and a run's `output`, below) kept as `json`, the text as written, instead of
-- `jsonb`. Thread reads answer with them, and PostgreSQL wrote 1 MB of jsonb out as text in 4.5-6 ms of its CPU (the `json` text: 1.4 ms), for
-- every GET /threads/{id} and every thread of a search. A run's end writes them whole, and `json` takes its
-- text in less than `jsonb` builds its tree (a 1 MB write 6.2-6.7 against 8.3-11.7 ms). The keys come back in
-- the state's order, as on SQLite (jsonb ordered them by length). What is given up: a state update wrote only
-- the keys it changed (`values || changed`, migration 0013) and now writes the whole text, and a search by
-- values parses the key it compares (`("values" -> key)::jsonb`). Numbers in bench/README (session 20).
-- The patch's bookkeeping goes: the checkpoint the row's values are of, and its trigger. The stamping
-- trigger names the column and is made again around the change of its type.
--
-- A run's `output` too: for a thread run it is the same values again, written at every run's end (1 MB of
-- jsonb built for nothing but to be written out as text when /wait or a join reads it). The run's end takes
-- it as `json` now (`threadline_finish_run`, else as in 0017; the jsonb signature stays, converting).
--
-- Rewrites `threads` and `runs` once. A change of type drops a column's compression: lz4 is set again after
-- the migrations (`storage/postgres.py: _LZ4_COLUMNS`, as for LangGraph's blobs).
DROP TRIGGER IF EXISTS threads_state_updated ON threads;
DROP TRIGGER IF EXISTS threads_values_checkpoint ON threads;
DROP FUNCTION IF EXISTS threadline_thread_values_checkpoint();
ALTER TABLE threads DROP COLUMN IF EXISTS values_checkpoint_id;
ALTER TABLE threads ALTER COLUMN "values" TYPE json USING "values"::json;
CREATE TRIGGER threads_state_updated BEFORE INSERT OR UPDATE OF "values", interrupts ON threads
    FOR EACH ROW WHEN (NEW.state_updated_at IS DISTINCT FROM NEW.updated_at)
    EXECUTE FUNCTION threadline_thread_state_updated();

ALTER TABLE runs ALTER COLUMN output TYPE json USING output::json;
CREATE FUNCTION threadline_finish_run(
    p_run_id text, p_status text, p_error jsonb, p_output json, p_worker text, p_attempt integer)
    RETURNS SETOF runs
LANGUAGE plpgsql AS $$
DECLARE
    done runs;
BEGIN
    UPDATE runs SET status = p_status, error = p_error, output = p_output, lease_expires_at = NULL,
                    updated_at = now()
        WHERE run_id = p_run_id
          AND (p_worker IS NULL OR (worker_id = p_worker AND attempt = p_attempt AND status = 'running'))
        RETURNING * INTO done;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run not finished' USING ERRCODE = 'TL410';
    END IF;
    done.output := NULL;
    RETURN NEXT done;
END
$$;
-- The signature before, which workers of the older version still call during an upgrade: their runs end.
CREATE OR REPLACE FUNCTION threadline_finish_run(
    p_run_id text, p_status text, p_error jsonb, p_output jsonb, p_worker text, p_attempt integer)
    RETURNS SETOF runs
LANGUAGE sql AS $$
    SELECT * FROM threadline_finish_run(p_run_id, p_status, p_error, p_output::json, p_worker, p_attempt)
$$;
