-- A run's end that refuses in the database (issue 28): `finish_run`'s fenced update, raising TL410 when it
-- updated no run (not the caller's to end: another attempt holds it, or it has ended, or it is gone). The
-- update can then go in the same pipeline as the thread's reconciliation and the COMMIT (`scripts.finish_run`):
-- one round trip, where waiting for the update's rows before deciding to commit cost two; a refusal aborts the
-- pipeline, so the reconciliation is rolled back with it, as the script's `Undo` rolls it back on SQLite.
CREATE OR REPLACE FUNCTION threadline_finish_run(
    p_run_id text, p_status text, p_error jsonb, p_output jsonb, p_worker text, p_attempt integer)
    RETURNS SETOF runs
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY UPDATE runs SET status = p_status, error = p_error, output = p_output, lease_expires_at = NULL,
                                 updated_at = now()
        WHERE run_id = p_run_id
          AND (p_worker IS NULL OR (worker_id = p_worker AND attempt = p_attempt AND status = 'running'))
        RETURNING *;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run not finished' USING ERRCODE = 'TL410';
    END IF;
END
$$;
