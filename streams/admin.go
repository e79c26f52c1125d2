package streams

import (
	"context"
	"errors"
	"fmt"

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
	return nil
}
