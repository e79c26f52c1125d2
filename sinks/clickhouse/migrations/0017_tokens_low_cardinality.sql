-- As 0016, for tokens.
ALTER TABLE tokens
    MODIFY COLUMN activity_id LowCardinality(String),
    MODIFY COLUMN scene_id LowCardinality(String)
