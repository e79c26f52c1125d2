CREATE MATERIALIZED VIEW IF NOT EXISTS wallet_orders_ledger TO wallet_orders AS
SELECT intDiv(if(granted_at_ms = 0, booked_at_ms, granted_at_ms), 60000) * 60000 AS minute_ms, cityHash64(order_no) AS k,
       act_id, activity_id, scene_id,
       toInt64(0) AS granted, toUInt8(0) AS has_grant, toUInt8(0) AS has_token, toInt64(0) AS token_amount,
       amount AS booked_amount, [booked_at_ms] AS bookings
FROM ledger WHERE kind = 'GRANT'
