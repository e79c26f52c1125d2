-- Activities and scenes are a handful of values: dictionary-encoded they
-- cost less to insert, store and group by.
ALTER TABLE grants
    MODIFY COLUMN activity_id LowCardinality(String),
    MODIFY COLUMN parent_activity_id LowCardinality(String),
    MODIFY COLUMN scene_id LowCardinality(String)
