-- Push facts: every job state change, and one row per target outcome
-- (batches of the report topic are expanded to one row per uin).
CREATE TABLE IF NOT EXISTS job_states (
    job_id   String,
    from_state LowCardinality(String),
    to_state LowCardinality(String),
    reason   String,
    executor String,
    position UInt64,
    targets  UInt64,
    at_ms    Int64
) ENGINE = ReplacingMergeTree
ORDER BY (job_id, to_state, at_ms);

CREATE TABLE IF NOT EXISTS deliveries (
    job_id     String,
    uin        UInt32,
    status     LowCardinality(String),
    filter     LowCardinality(String),
    unit_id    UInt32,
    display_at_ms Int64,
    at_ms      Int64
) ENGINE = ReplacingMergeTree
ORDER BY (job_id, uin, status)
