package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
)

// EnsureTopics creates the topics that do not exist yet, with their
// partitions and retention from the registry; existing topics are left as
// they are.
func EnsureTopics(ctx context.Context, cl *kgo.Client, replication int16, topics ...schemas.Topic) error {
	adm := kadm.NewClient(cl)
	for _, t := range topics {
		cfg := map[string]*string{}
		for k, v := range t.BrokerConfigs() {
			cfg[k] = kadm.StringPtr(v)
		}
		resp, err := adm.CreateTopic(ctx, t.Partitions, replication, cfg, t.Name)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", t.Name, err)
		}
	}
	return waitTopics(ctx, adm, topics)
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
func PartitionCount(ctx context.Context, brokers []string, topic string) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	var n int
	err = retryFor(ctx, 30*time.Second, func() error {
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
