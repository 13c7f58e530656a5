-- LangGraph's SQLite store stamps items with CURRENT_TIMESTAMP, whole seconds, so a put within the same
-- second as the last one did not advance `updated_at`; and it puts with INSERT OR REPLACE, so every put
-- reset `created_at` too. A put of an item that exists now updates it in place (created_at kept, as the
-- PostgreSQL store does), and both stamps have milliseconds. The store's tables are set up before our
-- migrations run (`SQLiteStorage.open`).
CREATE TRIGGER threadline_store_put_existing BEFORE INSERT ON store
WHEN EXISTS (SELECT 1 FROM store WHERE prefix = NEW.prefix AND key = NEW.key)
BEGIN
    UPDATE store SET value = NEW.value, expires_at = NEW.expires_at, ttl_minutes = NEW.ttl_minutes,
                     updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
    WHERE prefix = NEW.prefix AND key = NEW.key;
    SELECT RAISE(IGNORE);
END;
CREATE TRIGGER threadline_store_put_new AFTER INSERT ON store
BEGIN
    UPDATE store SET created_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
                     updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
    WHERE prefix = NEW.prefix AND key = NEW.key;
END;
