-- A thread's cached `values` compressed with lz4 instead of pglz where the server has it (PostgreSQL 14+
-- built with lz4): each state write stores the whole value again, also when it sends only the changed keys
-- (`values || changed`), and pglz took most of PostgreSQL's time for a 1 MB state (a one-key update of 1 MB
-- of jsonb: about 11 ms with pglz, 3-4 ms with lz4, on the bench's machine). Rows keep their compression
-- until their values are written again. Where lz4 is not available the column stays as it was.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE threads ALTER COLUMN "values" SET COMPRESSION lz4';
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'threads.values keeps its compression: %', SQLERRM;
END $$;
