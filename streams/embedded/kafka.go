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
)

// Kafka is an in-process Kafka cluster.
type Kafka struct {
	c *kfake.Cluster
}

// StartKafka starts a cluster of one broker. port 0 picks a free port.
func StartKafka(port int) (*Kafka, error) {
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DefaultNumPartitions(3),
		kfake.GroupMinSessionTimeout(time.Second),
	}
	if port != 0 {
		opts = append(opts, kfake.Ports(port))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded kafka: %w", err)
	}
	return &Kafka{c: c}, nil
}

// Brokers returns the listen addresses.
func (k *Kafka) Brokers() []string { return k.c.ListenAddrs() }

// Close stops the cluster; its data is gone.
func (k *Kafka) Close() { k.c.Close() }
