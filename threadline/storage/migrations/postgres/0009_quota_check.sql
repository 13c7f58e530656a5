-- The queue's caps on active runs (issue 16, limits), checked inside the statement that counts them, so that an
-- enqueue's count, its insert and its commit go to the server in one round trip and the quota's lock is never
-- held while the client thinks (`scripts.enqueue_run`). Refused: SQLSTATE TL429, the counts in the detail
-- ("<mine> <total>"); the driver hands them to `rules.quota_refusal`, which words the refusal.
CREATE OR REPLACE FUNCTION threadline_check_quota(mine bigint, total bigint, per_identity integer,
                                                  cap integer, counted boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF (cap > 0 AND total >= cap) OR (counted AND per_identity > 0 AND mine >= per_identity) THEN
        RAISE EXCEPTION 'active run cap reached' USING ERRCODE = 'TL429', DETAIL = mine || ' ' || total;
    END IF;
    RETURN true;
END
$$;
