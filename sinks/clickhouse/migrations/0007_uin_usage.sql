-- Usage events (uin.usage): logins by source (auth, device) and other
-- activity, for the stock classification's inactivity groups.
CREATE TABLE IF NOT EXISTS uin_usage (
    uin    UInt32,
    kind   LowCardinality(String),
    source LowCardinality(String),
    at_ms  Int64
) ENGINE = ReplacingMergeTree
ORDER BY (uin, at_ms, kind, source)
