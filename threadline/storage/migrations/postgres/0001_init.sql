-- Threadline's own tables. Checkpoints and store items live in LangGraph's own tables.
CREATE TABLE IF NOT EXISTS assistants (
    assistant_id TEXT PRIMARY KEY,
    graph_id TEXT NOT NULL,
    name TEXT NOT NULL,
    description TEXT,
    config JSONB NOT NULL DEFAULT '{}',
    context JSONB NOT NULL DEFAULT '{}',
    metadata JSONB NOT NULL DEFAULT '{}',
    version INTEGER NOT NULL DEFAULT 1,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS assistant_versions (
    assistant_id TEXT NOT NULL REFERENCES assistants(assistant_id) ON DELETE CASCADE,
    version INTEGER NOT NULL,
    graph_id TEXT NOT NULL,
    name TEXT NOT NULL,
    description TEXT,
    config JSONB NOT NULL DEFAULT '{}',
    context JSONB NOT NULL DEFAULT '{}',
    metadata JSONB NOT NULL DEFAULT '{}',
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (assistant_id, version)
);
CREATE TABLE IF NOT EXISTS threads (
    thread_id TEXT PRIMARY KEY,
    status TEXT NOT NULL DEFAULT 'idle',
    metadata JSONB NOT NULL DEFAULT '{}',
    config JSONB NOT NULL DEFAULT '{}',
    "values" JSONB,
    interrupts JSONB NOT NULL DEFAULT '{}',
    error JSONB,
    ttl TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    seq BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,
    thread_id TEXT NOT NULL,
    assistant_id TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata JSONB NOT NULL DEFAULT '{}',
    kwargs JSONB NOT NULL DEFAULT '{}',
    multitask_strategy TEXT NOT NULL DEFAULT 'reject',
    available_at TIMESTAMPTZ NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    worker_id TEXT,
    lease_expires_at TIMESTAMPTZ,
    error JSONB,
    output JSONB,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_queue ON runs (seq) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS runs_thread ON runs (thread_id, seq);
CREATE INDEX IF NOT EXISTS runs_leases ON runs (lease_expires_at) WHERE status = 'running';
-- The database itself guarantees one running run per thread, whatever a claim query races with.
CREATE UNIQUE INDEX IF NOT EXISTS runs_one_running_per_thread ON runs (thread_id) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS threads_status ON threads (status);
