-- A run's end answers the run without its `output` (NULL in the row it returns), as `finish_run` does on SQLite
-- (`statements.RUN_COLUMNS_BUT_OUTPUT`): the worker that ends the run has the output, which for a thread run is
-- the whole state again. Sent back, 1 MB of jsonb was turned into text by PostgreSQL, carried and parsed by the
-- worker for nothing, on every run on a large thread.
CREATE OR REPLACE FUNCTION threadline_finish_run(
    p_run_id text, p_status text, p_error jsonb, p_output jsonb, p_worker text, p_attempt integer)
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
