package streams

import (
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Dead-letter headers. The original headers follow them unchanged.
const (
	HeaderDLQReason    = "dlq-reason"
	HeaderDLQProcessor = "dlq-processor"
	HeaderDLQTopic     = "dlq-source-topic"
	HeaderDLQPartition = "dlq-source-partition"
	HeaderDLQOffset    = "dlq-source-offset"
	HeaderDLQAt        = "dlq-at"
	HeaderDLQTruncated = "dlq-truncated-from"
)

// deadLetter wraps a failed input for the dead-letter topic. A value larger
// than maxValue is cut to maxValue (the original length is recorded), so an
// oversized input cannot also make its dead letter oversized.
func deadLetter(topic, processor string, in *kgo.Record, reason string, maxValue int) *kgo.Record {
	value := in.Value
	hdrs := make([]kgo.RecordHeader, 0, len(in.Headers)+7)
	hdrs = append(hdrs,
		kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDLQProcessor, Value: []byte(processor)},
		kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(in.Topic)},
		kgo.RecordHeader{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(int(in.Partition)))},
		kgo.RecordHeader{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(in.Offset, 10))},
		kgo.RecordHeader{Key: HeaderDLQAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	)
	if maxValue > 0 && len(value) > maxValue {
		hdrs = append(hdrs, kgo.RecordHeader{Key: HeaderDLQTruncated, Value: []byte(strconv.Itoa(len(value)))})
		value = value[:maxValue]
	}
	hdrs = append(hdrs, in.Headers...)
	return &kgo.Record{Topic: topic, Key: in.Key, Value: value, Headers: hdrs}
}
