package streams

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"surge/schemas"
)

// Replication is how many copies of each partition a created topic keeps,
// and how many must have a record before it counts as written (acks=all
// waits for min.insync.replicas): a broker may then die without losing an
// acknowledged record.
type Replication struct {
	// Factor is the replication factor; 0 takes it from the cluster: its
	// broker count, 3 at most.
	Factor int16
	// MinInsync is the topic's min.insync.replicas; 0 is Factor-1, at
	// least 1 (with 3 copies, one broker may be down and writes go on).
	MinInsync int
}

// OneCopy is one copy of each partition: the embedded broker and tests.
var OneCopy = Replication{Factor: 1, MinInsync: 1}

// Resolve fills what r leaves to the cluster from its broker count.
func (r Replication) Resolve(ctx context.Context, cl *kgo.Client) (Replication, error) {
	if r.Factor <= 0 {
		brokers, err := kadm.NewClient(cl).ListBrokers(ctx)
		if err != nil {
			return r, fmt.Errorf("count brokers for the replication factor: %w", err)
		}
		r.Factor = int16(min(max(len(brokers), 1), 3))
	}
	if r.MinInsync <= 0 {
		r.MinInsync = max(int(r.Factor)-1, 1)
	}
	if r.MinInsync > int(r.Factor) {
		return r, fmt.Errorf("min.insync.replicas %d exceeds the replication factor %d: no write could ever succeed", r.MinInsync, r.Factor)
	}
	return r, nil
}

// EnsureTopics is EnsureTopics over a client of its own, for a caller
// that has none (a stack creating its topics before it starts).
func (c Cluster) EnsureTopics(ctx context.Context, rep Replication, topics ...schemas.Topic) error {
	cl, err := c.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	return EnsureTopics(ctx, cl, rep, topics...)
}

// EnsureTopics creates the topics that do not exist yet, with their
// partitions and retention from the registry and the replication rep
// (resolved against the cluster); existing topics are left as they are.
// Every topic goes in one CreateTopics request: a KRaft controller takes a
// few hundred milliseconds per request, and a stack has a dozen topics.
func EnsureTopics(ctx context.Context, cl *kgo.Client, rep Replication, topics ...schemas.Topic) error {
	if len(topics) == 0 {
		return nil
	}
	rep, err := rep.Resolve(ctx, cl)
	if err != nil {
		return err
	}
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 30_000
	for _, t := range topics {
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = t.Name, t.Partitions, rep.Factor
		configs := t.BrokerConfigs()
		configs["min.insync.replicas"] = strconv.Itoa(rep.MinInsync)
		for k, v := range configs {
			c := kmsg.NewCreateTopicsRequestTopicConfig()
			c.Name, c.Value = k, kmsg.StringPtr(v)
			rt.Configs = append(rt.Configs, c)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			msg := ""
			if rt.ErrorMessage != nil {
				msg = ": " + *rt.ErrorMessage
			}
			return fmt.Errorf("create topic %s: %w%s", rt.Topic, err, msg)
		}
	}
	return waitTopics(ctx, kadm.NewClient(cl), topics)
}

// waitTopics waits until every topic is in the metadata with a leader for
// each partition: a broker answers CreateTopics before that is true, and a
// consumer listing offsets a moment later would get UNKNOWN_TOPIC.
func waitTopics(ctx context.Context, adm *kadm.Client, topics []schemas.Topic) error {
	names := make([]string, len(topics))
	for i, t := range topics {
		names[i] = t.Name
	}
	return retryFor(ctx, 30*time.Second, func() error {
		td, err := adm.ListTopics(ctx, names...)
		if err != nil {
			return err
		}
		for _, n := range names {
			d, ok := td[n]
			if !ok || d.Err != nil || len(d.Partitions) == 0 {
				return fmt.Errorf("topic %s not ready", n)
			}
			for _, p := range d.Partitions {
				if p.Leader < 0 || p.Err != nil {
					return fmt.Errorf("topic %s/%d has no leader yet", n, p.Partition)
				}
			}
		}
		return nil
	})
}

// PartitionCount is the number of partitions topic has.
func PartitionCount(ctx context.Context, cluster Cluster, topic string) (int, error) {
	cl, err := cluster.NewClient()
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	return PartitionCountVia(ctx, cl, topic)
}

// PartitionCountVia is PartitionCount through a client the caller has.
func PartitionCountVia(ctx context.Context, cl *kgo.Client, topic string) (int, error) {
	var n int
	err := retryFor(ctx, 30*time.Second, func() error {
		td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
		if err != nil {
			return err
		}
		d, ok := td[topic]
		if !ok || d.Err != nil || len(d.Partitions) == 0 {
			return fmt.Errorf("topic %s not in the metadata", topic)
		}
		n = len(d.Partitions)
		return nil
	})
	return n, err
}

// WaitConsumed waits until group has committed, on every partition of
// topics, the end offsets they had when it was called: everything
// published before now has been processed. It is how a publisher knows a
// processor saw its records without reading the processor's memory.
func WaitConsumed(ctx context.Context, cluster Cluster, group string, topics ...string) error {
	cl, err := cluster.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return err
	}
	for {
		committed, err := adm.FetchOffsets(ctx, group)
		if err == nil {
			behind := map[string]map[int32]kgo.Offset{}
			ends.Each(func(o kadm.ListedOffset) {
				if o.Offset <= 0 {
					return
				}
				c, ok := committed.Lookup(o.Topic, o.Partition)
				if !ok || c.At < o.Offset {
					if behind[o.Topic] == nil {
						behind[o.Topic] = map[int32]kgo.Offset{}
					}
					behind[o.Topic][o.Partition] = kgo.NewOffset().At(max(c.At, 0))
				}
			})
			if len(behind) == 0 || onlyMarkersLeft(ctx, cluster, behind, ends) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("streams: group %s has not consumed %v: %w", group, topics, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// onlyMarkersLeft reports whether, from the committed offsets in from to
// the ends, no record is left: what is left are transaction markers (a
// transactional producer's commit takes an offset after its last record)
// or aborted records.
func onlyMarkersLeft(ctx context.Context, cluster Cluster, from map[string]map[int32]kgo.Offset, ends kadm.ListedOffsets) bool {
	cl, err := cluster.NewClient(kgo.ConsumePartitions(from),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return false
	}
	defer cl.Close()
	// A commit leaves one marker after its last record, so a gap of a few
	// offsets is the common case, answered by one fetch. A wide gap is
	// almost always records not yet consumed, and a fetch from far behind
	// may take longer than the short wait, so give it time to show one.
	wait := 300 * time.Millisecond
	for t, ps := range from {
		for p, o := range ps {
			if end, ok := ends.Lookup(t, p); ok && end.Offset-o.EpochOffset().Offset > 64 {
				wait = 3 * time.Second
			}
		}
	}
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	left := false
	for pctx.Err() == nil && !left {
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			if end, ok := ends.Lookup(r.Topic, r.Partition); ok && r.Offset < end.Offset {
				left = true
			}
		})
	}
	return !left
}

// CoPartitioned checks that topics a and b exist with the same number of
// partitions (records keyed alike land on the same partition number of
// both) and returns it.
func CoPartitioned(ctx context.Context, cluster Cluster, a, b string) (int, error) {
	cl, err := cluster.NewClient()
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx, a, b)
	if err != nil {
		return 0, err
	}
	na, nb := len(td[a].Partitions), len(td[b].Partitions)
	if na == 0 || nb == 0 {
		return 0, fmt.Errorf("topics %s and %s must exist (surge topics --create)", a, b)
	}
	if na != nb {
		return 0, fmt.Errorf("%s has %d partitions and %s %d; they must be co-partitioned (the same count)", a, na, b, nb)
	}
	return na, nil
}

// RecordsIn is how many records the topics hold (end less start offsets;
// a topic that does not exist holds none): a progress bar's total, or
// whether a rebuild has anything to read.
func RecordsIn(ctx context.Context, kc Cluster, topics ...string) (int64, error) {
	cl, err := kc.NewClient()
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return 0, err
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return 0, err
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(o.Topic, o.Partition); ok && o.Err == nil && s.Err == nil {
			n += o.Offset - s.Offset
		}
	})
	return n, nil
}
