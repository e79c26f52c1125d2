-- Dead letters, one row per rejected input. Keyed by the input's position,
-- so a redelivered batch replaces rows instead of adding them.
CREATE TABLE IF NOT EXISTS dead_letters (
    source_topic     String,
    source_partition Int32,
    source_offset    Int64,
    processor        LowCardinality(String),
    reason           String,
    schema_name      String,
    key_hex          String,
    value_bytes      UInt32,
    at               DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree
ORDER BY (source_topic, source_partition, source_offset)
