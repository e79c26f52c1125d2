-- Recycling steps (uin.recycle-steps) and reconciliation results.
CREATE TABLE IF NOT EXISTS recycle_steps (
    uin       UInt32,
    ticket_id String,
    step      LowCardinality(String),
    expected_prev LowCardinality(String),
    category  LowCardinality(String),
    reason    String,
    at_ms     Int64
) ENGINE = ReplacingMergeTree
ORDER BY (ticket_id, step);

CREATE TABLE IF NOT EXISTS recon_results (
    check_name  LowCardinality(String),
    hour_start_ms Int64,
    scope       String,
    expected    Int64,
    actual      Int64,
    mismatch    UInt8,
    attempt     LowCardinality(String),
    run_at_ms   Int64
) ENGINE = ReplacingMergeTree(run_at_ms)
ORDER BY (check_name, hour_start_ms, scope)
