-- Folds the tokens rows written before wallet_orders existed (the view in
-- 0011_wallet_orders_tokens.sql sees only new inserts). Running it twice is harmless: every
-- column of wallet_orders folds idempotently.
INSERT INTO wallet_orders
SELECT intDiv(open_time, 60000) * 60000 AS minute_ms, cityHash64(order_no) AS k, act_id, activity_id, scene_id,
       toInt64(0) AS granted, toUInt8(0) AS has_grant, toUInt8(1) AS has_token, amount AS token_amount,
       toInt64(0) AS booked_amount, CAST([], 'Array(Int64)') AS bookings
FROM tokens WHERE status = 'PROCESSING'
