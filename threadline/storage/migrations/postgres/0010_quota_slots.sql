-- The caps on active runs (issue 28) counted without a lock of the whole queue: a cap of N is N slot rows per
-- quota key ('*': the whole deployment; 'i:<identity>': one identity), and an active run holds one free slot
-- of each key whose cap applies, taken with SKIP LOCKED, so concurrent enqueues take different rows and never
-- wait for each other's commits. Exact: every active run of a key holds a distinct row below the cap.
CREATE TABLE IF NOT EXISTS run_quota_slots (
    key TEXT NOT NULL,
    slot INTEGER NOT NULL,
    run_id TEXT,
    PRIMARY KEY (key, slot)
);
CREATE INDEX IF NOT EXISTS run_quota_slots_free ON run_quota_slots (key, slot) WHERE run_id IS NULL;
CREATE INDEX IF NOT EXISTS run_quota_slots_run ON run_quota_slots (run_id) WHERE run_id IS NOT NULL;

-- A run gives its slots back in the statement that ends it, whichever path ends it (finish, cancel, sweep,
-- a failed recovery, delete): the release commits with the status, so no crash leaves a slot held.
CREATE OR REPLACE FUNCTION threadline_release_quota_slots() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE run_quota_slots SET run_id = NULL WHERE run_id = OLD.run_id;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS runs_release_quota_slots ON runs;
CREATE TRIGGER runs_release_quota_slots AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status IN ('pending', 'running') AND NEW.status NOT IN ('pending', 'running'))
    EXECUTE FUNCTION threadline_release_quota_slots();
DROP TRIGGER IF EXISTS runs_release_quota_slots_on_delete ON runs;
CREATE TRIGGER runs_release_quota_slots_on_delete AFTER DELETE ON runs FOR EACH ROW
    WHEN (OLD.status IN ('pending', 'running'))
    EXECUTE FUNCTION threadline_release_quota_slots();

-- One free slot of `k` below `cap` for run `r`: its number, or NULL when every slot below the cap is held (or
-- being taken by an enqueue in flight). The rows are made on demand, doubling, under the key's advisory lock
-- (taken only then, held to commit), so a cap of a million costs rows only for the runs actually active.
-- While a slot at or past the cap is held (the cap was lowered, or runs were enqueued with none), the held
-- slots are counted under that lock instead: slower, one enqueue at a time, until those runs end.
CREATE OR REPLACE FUNCTION threadline_take_quota_slot(k text, r text, cap integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    taken integer;
    made integer;
    locked boolean := false;
BEGIN
    IF EXISTS (SELECT 1 FROM run_quota_slots WHERE key = k AND slot >= cap AND run_id IS NOT NULL) THEN
        PERFORM pg_advisory_xact_lock(hashtext('threadline:quota-slots:' || k));
        locked := true;
        IF (SELECT COUNT(*) FROM run_quota_slots WHERE key = k AND run_id IS NOT NULL) >= cap THEN
            RETURN NULL;
        END IF;
    END IF;
    LOOP
        UPDATE run_quota_slots SET run_id = r WHERE key = k AND slot = (
            SELECT slot FROM run_quota_slots WHERE key = k AND slot < cap AND run_id IS NULL
            LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING slot INTO taken;
        IF taken IS NOT NULL THEN
            RETURN taken;
        END IF;
        IF NOT locked THEN
            -- Once more under the lock: the rows the enqueue that held it last made may be free.
            PERFORM pg_advisory_xact_lock(hashtext('threadline:quota-slots:' || k));
            locked := true;
            CONTINUE;
        END IF;
        SELECT COALESCE(MAX(slot) + 1, 0) INTO made FROM run_quota_slots WHERE key = k;
        IF made >= cap THEN
            RETURN NULL;
        END IF;
        INSERT INTO run_quota_slots (key, slot)
            SELECT k, g FROM generate_series(made, LEAST(cap, GREATEST(2 * made, 16)) - 1) AS g
            ON CONFLICT DO NOTHING;
    END LOOP;
END
$$;

-- The enqueue's quota check (`check_quota`, PostgreSQL): run `r` takes a slot of the whole queue (`cap` > 0)
-- and of its identity `who` (`per_identity` > 0, `who` not null), in that order. Refused: the rule's own
-- refusal (`threadline_check_quota`, TL429, with the counts), its counts raised to the cap that had no free
-- slot when enqueues in flight hold slots they have not committed yet.
CREATE OR REPLACE FUNCTION threadline_take_quota(r text, who text, per_identity integer, cap integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    mine bigint;
    total bigint;
    full_queue boolean := false;
BEGIN
    IF cap > 0 AND threadline_take_quota_slot('*', r, cap) IS NULL THEN
        full_queue := true;
    ELSIF who IS NOT NULL AND per_identity > 0
            AND threadline_take_quota_slot('i:' || who, r, per_identity) IS NULL THEN
        full_queue := false;
    ELSE
        RETURN true;
    END IF;
    SELECT COUNT(*) FILTER (WHERE runs.identity = who), COUNT(*)
        INTO mine, total FROM runs WHERE status IN ('pending', 'running');
    IF full_queue THEN
        total := GREATEST(total, cap);
    ELSE
        mine := GREATEST(mine, per_identity);
    END IF;
    PERFORM threadline_check_quota(mine, total, per_identity, cap, who IS NOT NULL);
    RAISE EXCEPTION 'active run cap reached' USING ERRCODE = 'TL429', DETAIL = mine || ' ' || total;
END
$$;

-- Runs active without a slot (enqueued with no cap, before this migration, or by a process of an older
-- version) take one of each key that counts them, so a cap counts them: at every start, after the
-- migrations (this one's upgrade included), `PostgresStorage.migrate`. A cap is a setting, so a process
-- that starts with one has adopted every run enqueued without it before its start.
CREATE OR REPLACE FUNCTION threadline_adopt_quota_runs() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    run record;
    k text;
    adopted integer := 0;
BEGIN
    FOR run IN SELECT run_id, identity FROM runs WHERE status IN ('pending', 'running') ORDER BY seq LOOP
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
            adopted := adopted + 1;
        END LOOP;
    END LOOP;
    RETURN adopted;
END
$$;
