-- The expiry trigger of 0004 rewrote every updated thread row to set `expires_at`, even with no TTL
-- (NULL to NULL): a second row write on every run's start and end. It now fires only when the thread
-- has, or had, a TTL; a thread that never had one keeps `expires_at` NULL as before.
DROP TRIGGER IF EXISTS threads_expiry_on_update;
CREATE TRIGGER threads_expiry_on_update AFTER UPDATE OF updated_at, ttl_minutes ON threads
WHEN NEW.ttl_minutes IS NOT NULL OR OLD.ttl_minutes IS NOT NULL
BEGIN
    UPDATE threads SET expires_at = CASE WHEN NEW.ttl_minutes IS NULL THEN NULL ELSE
        strftime('%Y-%m-%dT%H:%M:%f', NEW.updated_at,
                 '+' || printf('%.3f', NEW.ttl_minutes * 60) || ' seconds') || '+00:00' END
    WHERE thread_id = NEW.thread_id;
END;
