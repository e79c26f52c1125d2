-- Uin registrations (uin.registrations): the stock classification's view of
-- who holds each uin. The newest record per uin is its current state.
CREATE TABLE IF NOT EXISTS uin_registrations (
    uin       UInt32,
    username  String,
    channel   LowCardinality(String),
    completed UInt8,
    at_ms     Int64
) ENGINE = ReplacingMergeTree(at_ms)
ORDER BY uin
