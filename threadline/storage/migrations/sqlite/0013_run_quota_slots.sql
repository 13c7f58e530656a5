-- How many quota slots a run took (one per cap it was enqueued under): PostgreSQL's release triggers fire
-- only for runs that hold some (its migration 0011). SQLite counts its active runs instead and keeps the
-- column so that a run reads the same on both.
ALTER TABLE runs ADD COLUMN quota_slots INTEGER NOT NULL DEFAULT 0;
