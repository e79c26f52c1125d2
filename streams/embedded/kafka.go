// Package embedded starts the in-process stand-ins for the product's
// servers, so it runs on a machine with none installed: Kafka is franz-go's
// kfake (it speaks the Kafka protocol, transactions and groups included),
// Redis is miniredis. The same processors run against real servers by
// pointing their config at them; nothing else changes.
package embedded

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"surge/streams"
	"surge/streams/connect"
)

// Kafka is an in-process Kafka cluster.
type Kafka struct {
	c *kfake.Cluster
}

// KafkaOption configures StartKafka.
type KafkaOption func(*[]kfake.Opt)

// Port listens on a fixed port (default: a free one).
func Port(p int) KafkaOption {
	return func(o *[]kfake.Opt) {
		if p != 0 {
			*o = append(*o, kfake.Ports(p))
		}
	}
}

// DataDir keeps the cluster's data in dir, so a restarted cluster has every
// topic, offset and transaction it had (default: memory only).
func DataDir(dir string) KafkaOption {
	return func(o *[]kfake.Opt) {
		if dir != "" {
			*o = append(*o, kfake.DataDir(dir))
		}
	}
}

// StartKafka starts a cluster of one broker.
func StartKafka(opts ...KafkaOption) (*Kafka, error) {
	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DefaultNumPartitions(3),
		kfake.GroupMinSessionTimeout(time.Second),
	}
	for _, o := range opts {
		o(&kopts)
	}
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("embedded kafka: %w", err)
	}
	return &Kafka{c: c}, nil
}

// Brokers returns the listen addresses.
func (k *Kafka) Brokers() []string { return k.c.ListenAddrs() }

// Close stops the cluster; its data is gone.
func (k *Kafka) Close() { k.c.Close() }

// KafkaOr returns the cluster of the comma-separated brokers in list,
// secured by the SURGE_KAFKA_* environment (connect.Env) as a command's
// would be, or, when list is empty, starts kfake; backend names which, for
// a benchmark's report.
func KafkaOr(list string) (cluster streams.Cluster, backend string, stop func(), err error) {
	if list != "" {
		c, err := connect.Kafka(func(key string) string {
			if key == connect.KafkaKeys.Brokers {
				return list
			}
			return connect.Env(key)
		})
		return c, "kafka " + list, func() {}, err
	}
	k, err := StartKafka()
	if err != nil {
		return streams.Cluster{}, "", nil, err
	}
	return streams.Seeds(k.Brokers()...), "kfake (in process)", k.Close, nil
}
