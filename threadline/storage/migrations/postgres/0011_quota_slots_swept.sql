-- The quota slots' upkeep (issue 28).
--
-- A run says how many slots it took (`quota_slots`: one per cap it was enqueued under, 0 with none), so the
-- release triggers fire only for runs that hold some: a deployment with no cap pays nothing at a run's end
-- (the trigger's call and its UPDATE were about 20 us of the server's time per run end).
ALTER TABLE runs ADD COLUMN IF NOT EXISTS quota_slots INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET quota_slots = held.n
    FROM (SELECT run_id, COUNT(*) AS n FROM run_quota_slots WHERE run_id IS NOT NULL GROUP BY run_id) AS held
    WHERE runs.run_id = held.run_id;

DROP TRIGGER IF EXISTS runs_release_quota_slots ON runs;
CREATE TRIGGER runs_release_quota_slots AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.quota_slots > 0 AND OLD.status IN ('pending', 'running') AND NEW.status NOT IN ('pending', 'running'))
    EXECUTE FUNCTION threadline_release_quota_slots();
DROP TRIGGER IF EXISTS runs_release_quota_slots_on_delete ON runs;
CREATE TRIGGER runs_release_quota_slots_on_delete AFTER DELETE ON runs FOR EACH ROW
    WHEN (OLD.quota_slots > 0 AND OLD.status IN ('pending', 'running'))
    EXECUTE FUNCTION threadline_release_quota_slots();

-- As in 0010, and the adopted run says how many slots it holds, so its end gives them back.
CREATE OR REPLACE FUNCTION threadline_adopt_quota_runs() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    run record;
    k text;
    adopted integer := 0;
    took integer;
BEGIN
    FOR run IN SELECT run_id, identity FROM runs WHERE status IN ('pending', 'running') ORDER BY seq LOOP
        took := 0;
        FOREACH k IN ARRAY CASE WHEN run.identity IS NULL THEN ARRAY['*'] ELSE ARRAY['*', 'i:' || run.identity] END
        LOOP
            CONTINUE WHEN EXISTS (SELECT 1 FROM run_quota_slots s WHERE s.key = k AND s.run_id = run.run_id);
            -- Locked, and still active once locked: a run ending meanwhile would not give the slot back.
            PERFORM 1 FROM runs WHERE runs.run_id = run.run_id AND status IN ('pending', 'running') FOR UPDATE;
            CONTINUE WHEN NOT FOUND;
            -- No cap bounds an adopted run: it takes a free row, or one made past the last.
            IF threadline_take_quota_slot(k, run.run_id, 2147483647) IS NULL THEN
                RAISE EXCEPTION 'no quota slot for run %', run.run_id;
            END IF;
            took := took + 1;
        END LOOP;
        IF took > 0 THEN
            UPDATE runs SET quota_slots = (SELECT COUNT(*) FROM run_quota_slots s WHERE s.run_id = run.run_id)
                WHERE runs.run_id = run.run_id;
            adopted := adopted + took;
        END IF;
    END LOOP;
    RETURN adopted;
END
$$;

-- The sweeper's pass over the slots (`Storage.sweep_quota_slots`, in every worker's lease sweeper):
-- 1. A slot held by a run that is no longer active is given back. A run's end gives its slots back in its own
--    statement (the triggers), and a crash rolls the take back with the run's insert, so this is for what
--    bypasses row triggers: TRUNCATE, session_replication_role = replica (a restore, logical replication), a
--    trigger disabled by hand, a process of another version enqueueing during an upgrade. The run is read
--    again in the statement that frees its slot, and that statement frees the slot only while it still holds
--    that run: a slot taken meanwhile by another run is left alone.
-- 2. The rows of a key none of whose slots is held are deleted (an identity seen once kept its rows for
--    ever): under the key's advisory lock, tried and never waited for (an enqueue making rows holds it), and
--    only when every row of the key could be locked, so no enqueue is taking one of them; an enqueue that
--    finds them locked waits for that lock, then makes the key's rows again from 0.
-- Returns the slots given back plus the rows deleted.
CREATE OR REPLACE FUNCTION threadline_sweep_quota_slots() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    leaked record;
    idle record;
    freed integer := 0;
    n integer;
    locked integer;
BEGIN
    FOR leaked IN SELECT s.key, s.slot, s.run_id FROM run_quota_slots s WHERE s.run_id IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = s.run_id AND r.status IN ('pending', 'running'))
    LOOP
        UPDATE run_quota_slots s SET run_id = NULL
            WHERE s.key = leaked.key AND s.slot = leaked.slot AND s.run_id = leaked.run_id
            AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = leaked.run_id AND r.status IN ('pending', 'running'));
        GET DIAGNOSTICS n = ROW_COUNT;
        freed := freed + n;
    END LOOP;
    FOR idle IN SELECT key, COUNT(*) AS total FROM run_quota_slots GROUP BY key HAVING COUNT(run_id) = 0 LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtext('threadline:quota-slots:' || idle.key));
        SELECT COUNT(*) INTO locked FROM (SELECT 1 FROM run_quota_slots WHERE key = idle.key AND run_id IS NULL
                                          FOR UPDATE SKIP LOCKED) AS free;
        CONTINUE WHEN locked <> idle.total
            OR EXISTS (SELECT 1 FROM run_quota_slots WHERE key = idle.key AND run_id IS NOT NULL);
        DELETE FROM run_quota_slots WHERE key = idle.key;
        GET DIAGNOSTICS n = ROW_COUNT;
        freed := freed + n;
    END LOOP;
    RETURN freed;
END
$$;
