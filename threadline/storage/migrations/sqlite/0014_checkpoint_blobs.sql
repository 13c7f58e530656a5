-- A checkpoint's large channel values, stored once per version of their channel rather than inside every
-- checkpoint that holds them (`sqlite_saver.py`): LangGraph's SqliteSaver layout stores each checkpoint whole, so
-- a thread with 1 MB of state grew by about 4 MB per run (bench/README.md, "A turn on a 1 MB thread"). A channel's
-- version is unique within its thread and namespace (a counter and a random part), forks included. Checkpoints
-- written before this migration keep their values inside and are read as they are.
CREATE TABLE IF NOT EXISTS checkpoint_blobs (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    blob BLOB,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);
