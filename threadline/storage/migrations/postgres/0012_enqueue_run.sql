-- An enqueue in one statement (issue 28): what `scripts.enqueue_run` does in two round trips (read the thread,
-- then write), done by the server in one, so a burst of run creations costs each one statement and one round
-- trip (its BEGIN and COMMIT ride in the same pipeline), and no lock is held while the client thinks.
-- `rules.plan_enqueue` is the rule it follows (SQLite's writer steps that script); tests/test_enqueue_at_once.py
-- runs both on the same cases. Refusals: TL404 (no such thread), TL409 (reject: the thread has an active
-- run), TL429 (a cap on active runs, `threadline_take_quota`).
--   run: the run's row (`NewRun`, with `identity` and `quota_slots` when a cap applies), as JSON.
--   new_thread: the thread it creates when missing (`create_thread`; NULL: none), as `insert_thread_if_missing`.
--   thread_metadata: merged into the thread's metadata. now: the thread's `updated_at` when marked busy.
--   metadata_base, metadata_over: the run's metadata is base, then its thread's as this run leaves it (nothing
--   when this run creates the thread), then over (`RunMetadata`); NULL base: the run's metadata as given.
--   worker, lease_seconds, deadline_seconds: claim it at once when it can start (`claim_for`; NULL: never).
--   who, per_identity, cap: the caps (`Quota`; 0 for none).
CREATE OR REPLACE FUNCTION threadline_enqueue_run(
    run jsonb, new_thread jsonb, thread_metadata jsonb, now_at timestamptz, reject_if_active boolean,
    metadata_base jsonb, metadata_over jsonb, worker text, lease_seconds double precision,
    deadline_seconds double precision, who text, per_identity integer, cap integer) RETURNS SETOF runs
LANGUAGE plpgsql AS $$
DECLARE
    tid text := run->>'thread_id';
    created boolean := false;
    before jsonb;
    active boolean := false;
    claimed boolean;
    made jsonb := run->'metadata';
BEGIN
    IF new_thread IS NOT NULL THEN
        INSERT INTO threads (thread_id, status, metadata, config, interrupts, ttl_strategy, ttl_minutes,
                             created_at, updated_at)
            VALUES (tid, 'busy', new_thread->'metadata', '{}', '{}', new_thread->>'ttl_strategy',
                    CAST(new_thread->>'ttl_minutes' AS double precision), now_at, now_at)
            ON CONFLICT (thread_id) DO NOTHING;
        created := FOUND;
    END IF;
    -- The thread's row lock orders concurrent enqueues of one thread, so a reject sees the other's run.
    SELECT metadata INTO before FROM threads WHERE thread_id = tid FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no such thread' USING ERRCODE = 'TL404';
    END IF;
    IF reject_if_active OR worker IS NOT NULL THEN
        active := EXISTS (SELECT 1 FROM runs WHERE thread_id = tid AND status IN ('pending', 'running'));
    END IF;
    IF reject_if_active AND active THEN
        RAISE EXCEPTION 'thread busy' USING ERRCODE = 'TL409';
    END IF;
    IF metadata_base IS NOT NULL THEN
        made := metadata_base || CASE WHEN created THEN '{}'::jsonb ELSE before || thread_metadata END
                || metadata_over;
    END IF;
    IF cap > 0 OR (who IS NOT NULL AND per_identity > 0) THEN
        PERFORM threadline_take_quota(run->>'run_id', who, per_identity, cap);
    END IF;
    IF NOT created THEN
        UPDATE threads SET status = 'busy', metadata = before || thread_metadata, updated_at = now_at
            WHERE thread_id = tid;
    END IF;
    claimed := worker IS NOT NULL AND NOT active
               AND CAST(run->>'available_at' AS timestamptz) <= CAST(run->>'created_at' AS timestamptz);
    RETURN QUERY INSERT INTO runs (run_id, thread_id, assistant_id, status, metadata, kwargs, multitask_strategy,
                                   available_at, created_at, updated_at, identity, quota_slots, worker_id, attempt,
                                   lease_expires_at, deadline_at)
        SELECT r.run_id, r.thread_id, r.assistant_id, CASE WHEN claimed THEN 'running' ELSE r.status END, made,
               r.kwargs, r.multitask_strategy, r.available_at, r.created_at, r.updated_at, r.identity,
               COALESCE(r.quota_slots, 0), CASE WHEN claimed THEN worker END, CASE WHEN claimed THEN 1 ELSE 0 END,
               CASE WHEN claimed THEN now() + make_interval(secs => lease_seconds) END,
               CASE WHEN claimed AND deadline_seconds > 0 THEN now() + make_interval(secs => deadline_seconds) END
        FROM jsonb_populate_record(NULL::runs, run) AS r
        RETURNING *;
END
$$;
