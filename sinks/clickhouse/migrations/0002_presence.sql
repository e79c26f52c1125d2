-- Online-state changes; (uin, at_ms) identifies a change.
CREATE TABLE IF NOT EXISTS presence_changes (
    uin    UInt32,
    online UInt8,
    at_ms  Int64
) ENGINE = ReplacingMergeTree
ORDER BY (uin, at_ms)
