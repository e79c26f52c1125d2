-- Folds the grants rows written before wallet_orders existed (the view in
-- 0010_wallet_orders_grants.sql sees only new inserts). Running it twice is harmless: every
-- column of wallet_orders folds idempotently.
INSERT INTO wallet_orders
SELECT intDiv(at_ms, 60000) * 60000 AS minute_ms, cityHash64(order_no) AS k, act_id, activity_id, scene_id,
       amount AS granted, toUInt8(1) AS has_grant, toUInt8(0) AS has_token, toInt64(0) AS token_amount,
       toInt64(0) AS booked_amount, CAST([], 'Array(Int64)') AS bookings
FROM grants WHERE award_type = 'CASH'
