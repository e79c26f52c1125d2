-- One row per cash order and grant minute, folded as rows arrive: what was
-- granted, whether a token was issued, and every distinct booking. The three
-- wallet sinks feed it through materialized views (0010-0012), so the hourly
-- and near-real-time reconciliations read one folded row per order instead
-- of joining grants, tokens and the ledger on order numbers.
--
-- Every column folds with an idempotent function (max, any, a set union),
-- so a redelivered row changes nothing: the sinks stay at-least-once.
CREATE TABLE IF NOT EXISTS wallet_orders (
    minute_ms     Int64,   -- grant minute
    k             UInt64,  -- cityHash64(order_no)
    act_id        SimpleAggregateFunction(any, String),
    activity_id   SimpleAggregateFunction(any, LowCardinality(String)),
    scene_id      SimpleAggregateFunction(any, LowCardinality(String)),
    granted       SimpleAggregateFunction(max, Int64),  -- amount; 0 without a grant row
    has_grant     SimpleAggregateFunction(max, UInt8),
    has_token     SimpleAggregateFunction(max, UInt8),
    token_amount  SimpleAggregateFunction(max, Int64),
    booked_amount SimpleAggregateFunction(max, Int64),
    bookings      SimpleAggregateFunction(groupUniqArrayArray, Array(Int64))  -- booked_at_ms of each booking
) ENGINE = AggregatingMergeTree
PARTITION BY intDiv(minute_ms, 86400000)
ORDER BY (minute_ms, k)
