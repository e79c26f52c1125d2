CREATE MATERIALIZED VIEW IF NOT EXISTS wallet_orders_tokens TO wallet_orders AS
SELECT intDiv(open_time, 60000) * 60000 AS minute_ms, cityHash64(order_no) AS k, act_id, activity_id, scene_id,
       toInt64(0) AS granted, toUInt8(0) AS has_grant, toUInt8(1) AS has_token, amount AS token_amount,
       toInt64(0) AS booked_amount, CAST([], 'Array(Int64)') AS bookings
FROM tokens WHERE status = 'PROCESSING'
