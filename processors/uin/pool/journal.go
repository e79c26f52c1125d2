package pool

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Journal writes the pool's changes to uin.pool, the pool's source of
// truth, before they take effect: an insertion before the uin is in a
// bucket, an allocation before the uin is answered. Redis holds a cache of
// the fold of that topic (Fold), which Rebuild writes back after a loss.
type Journal interface {
	Write(ctx context.Context, op pb.PoolChange_Op, reason string, uins []uint32) error
}

// ErrNoJournal is what a change answers on a Central without a journal:
// a change that is not on the topic could not be rebuilt.
var ErrNoJournal = errors.New("pool: no journal (uin.pool) to record the change on")

// KafkaJournal is the Journal on a Kafka topic: one record per bucket a
// change touches, keyed by the bucket (4-byte big-endian), so every change
// of a uin is in one partition, in the order it was made.
type KafkaJournal struct {
	kc      streams.Cluster
	topic   string
	buckets int

	mu  sync.Mutex
	cl  *kgo.Client
	err error
}

// NewKafkaJournal journals to topic on kc; its client is made on the first
// write (Close closes it).
func NewKafkaJournal(kc streams.Cluster, topic string, buckets int) *KafkaJournal {
	return &KafkaJournal{kc: kc, topic: topic, buckets: max(buckets, 1)}
}

func (j *KafkaJournal) client() (*kgo.Client, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cl == nil && j.err == nil {
		j.cl, j.err = j.kc.NewClient(kgo.ProducerLinger(0))
	}
	return j.cl, j.err
}

// Write produces the change's records and returns once every one is
// acknowledged by the in-sync replicas.
func (j *KafkaJournal) Write(ctx context.Context, op pb.PoolChange_Op, reason string, uins []uint32) error {
	if len(uins) == 0 {
		return nil
	}
	cl, err := j.client()
	if err != nil {
		return err
	}
	recs := make([]*kgo.Record, 0, 16)
	for _, c := range Changes(op, reason, uins, j.buckets, time.Now()) {
		rec, err := streams.NewRecord(j.topic, BucketKey(c.Bucket), c)
		if err != nil {
			return err
		}
		recs = append(recs, rec)
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// Close closes the journal's client.
func (j *KafkaJournal) Close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cl != nil {
		j.cl.Close()
		j.cl = nil
	}
}

// BucketKey is the record key of a bucket's changes on uin.pool.
func BucketKey(bucket uint32) []byte { return binary.BigEndian.AppendUint32(nil, bucket) }

// Changes groups uins by bucket into one PoolChange each, in bucket order.
func Changes(op pb.PoolChange_Op, reason string, uins []uint32, buckets int, at time.Time) []*pb.PoolChange {
	by := map[uint32][]uint32{}
	for _, u := range uins {
		b := u % uint32(max(buckets, 1))
		by[b] = append(by[b], u)
	}
	keys := make([]uint32, 0, len(by))
	for b := range by {
		keys = append(keys, b)
	}
	slices.Sort(keys)
	out := make([]*pb.PoolChange, 0, len(keys))
	for _, b := range keys {
		out = append(out, &pb.PoolChange{Op: op, Bucket: b, AtMs: at.UnixMilli(), Reason: reason, Uins: by[b]})
	}
	return out
}
