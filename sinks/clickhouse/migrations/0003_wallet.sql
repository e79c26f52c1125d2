-- Wallet facts. Each table is keyed by its record's identity, so a
-- redelivered batch replaces rows instead of doubling them.
CREATE TABLE IF NOT EXISTS grants (
    order_no    String,
    act_id      String,
    activity_id String,
    parent_activity_id String,
    scene_id    String,
    award_type  LowCardinality(String),
    amount      Int64,
    at_ms       Int64
) ENGINE = ReplacingMergeTree
ORDER BY order_no;

CREATE TABLE IF NOT EXISTS tokens (
    order_no    String,
    act_id      String,
    activity_id String,
    scene_id    String,
    amount      Int64,
    status      LowCardinality(String),
    open_time   Int64
) ENGINE = ReplacingMergeTree
ORDER BY (order_no, status);

CREATE TABLE IF NOT EXISTS ledger (
    order_no      String,
    act_id        String,
    kind          LowCardinality(String),
    amount        Int64,
    activity_id   String,
    scene_id      String,
    balance_after Int64,
    booked_at_ms  Int64
) ENGINE = ReplacingMergeTree
-- booked_at_ms in the key: a redelivered row merges away, a second
-- booking of one order number (a bug reconciliation must find) does not.
ORDER BY (order_no, booked_at_ms);

CREATE TABLE IF NOT EXISTS withdrawals (
    withdraw_id   String,
    act_id        String,
    amount        Int64,
    refused       UInt8,
    reason        String,
    balance_after Int64,
    at_ms         Int64
) ENGINE = ReplacingMergeTree
ORDER BY withdraw_id
