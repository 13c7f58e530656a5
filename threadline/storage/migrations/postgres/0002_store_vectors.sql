-- Embeddings of store items, for semantic search where PostgreSQL lacks pgvector: an exact scan
-- (threadline/storage/vectors.py). One row per embedded field of an item; `norm` is the embedding's
-- length, kept so a search needs one dot product per row.
-- Not named `store_vectors`: LangGraph creates its pgvector table under that name with
-- CREATE TABLE IF NOT EXISTS, and a table of ours there would silently stand in for it once pgvector
-- is installed. No foreign key to `store` either: our migrations run before LangGraph's store setup
-- creates that table. The exact-scan store deletes an item's rows itself.
CREATE TABLE IF NOT EXISTS threadline_store_vectors (
    prefix TEXT NOT NULL,
    key TEXT NOT NULL,
    field_name TEXT NOT NULL,
    embedding DOUBLE PRECISION[] NOT NULL,
    norm DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (prefix, key, field_name)
);
