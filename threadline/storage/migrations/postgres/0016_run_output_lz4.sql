-- A run's `output` compressed with lz4 instead of pglz where the server has it (PostgreSQL 14+ built with lz4),
-- as `threads.values` is (0014_thread_values_lz4.sql): a thread run's output is its thread's values at its end,
-- the whole state again (1 MB of jsonb for a large state), written by every run and read back by `/wait` and
-- `join`: with pglz, PostgreSQL spent 34 ms of CPU per run on a 1 MB thread, 26 with lz4 (bench/README.md,
-- "A turn on a 1 MB thread"). Rows keep their compression until they are written again. Where lz4 is not
-- available the column stays as it was.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE runs ALTER COLUMN output SET COMPRESSION lz4';
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'runs.output keeps its compression: %', SQLERRM;
END $$;
