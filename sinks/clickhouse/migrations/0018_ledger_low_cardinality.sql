-- As 0016, for the ledger.
ALTER TABLE ledger
    MODIFY COLUMN activity_id LowCardinality(String),
    MODIFY COLUMN scene_id LowCardinality(String)
