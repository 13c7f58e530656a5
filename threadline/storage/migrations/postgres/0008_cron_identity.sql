-- Who a cron's runs count against (issue 16, quotas): its creator's identity as the API saw it
-- (`api/ratelimit.py: identity_of`), so a cron runs under its creator's cap on active runs.
ALTER TABLE crons ADD COLUMN IF NOT EXISTS identity TEXT;
