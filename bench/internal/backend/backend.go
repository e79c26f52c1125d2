// Package backend gives a bench its Kafka and Redis: the real broker and
// redis-server it is pointed at, or in-process stand-ins (kfake,
// miniredis) when it is not, and a client that publishes in bulk.
package backend

import (
	"fmt"
	"runtime"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/streams"
	"surge/streams/embedded"
)

// Backend is a bench's Kafka cluster and Redis.
type Backend struct {
	Kafka     streams.Cluster
	Redis     *redis.Client
	Publisher *kgo.Client // lingers 5 ms, buffers a million records
	stops     []func()
}

// Open reaches brokers (empty: kfake in process) and redisAddr (empty:
// miniredis in process), and prints which ones with the machine's cores.
func Open(brokers, redisAddr string) (*Backend, error) {
	b := &Backend{}
	kc, name, stopKafka, err := embedded.KafkaOr(brokers)
	if err != nil {
		return nil, err
	}
	b.Kafka, b.stops = kc, append(b.stops, stopKafka)
	if redisAddr == "" {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			b.Close()
			return nil, err
		}
		b.stops, redisAddr = append(b.stops, m.Close), m.Addr()
	}
	b.Redis = redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 16})
	b.stops = append(b.stops, func() { _ = b.Redis.Close() })
	if b.Publisher, err = kc.NewClient(kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20), kgo.ProducerBatchMaxBytes(1<<20)); err != nil {
		b.Close()
		return nil, err
	}
	b.stops = append(b.stops, b.Publisher.Close)
	fmt.Printf("backend: %s; redis %s; %d cores, %s\n", name, redisAddr, runtime.NumCPU(), runtime.Version())
	return b, nil
}

// Close releases everything Open made, the last first.
func (b *Backend) Close() {
	for i := len(b.stops) - 1; i >= 0; i-- {
		b.stops[i]()
	}
}
