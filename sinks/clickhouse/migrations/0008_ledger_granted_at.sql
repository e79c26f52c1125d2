-- The grant time of the booked token (its open_time), so a booking can be
-- reconciled against the hour of its grant without a join on order numbers.
-- 0 on entries written before this column: they count at their booking time.
ALTER TABLE ledger ADD COLUMN IF NOT EXISTS granted_at_ms Int64 DEFAULT 0
