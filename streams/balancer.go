package streams

import (
	"sort"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// SingleActive is a group balancer that gives every partition of every
// input to one member: the group is one active instance and any number of
// standbys. It is for a processor whose decisions are global (the push
// planner ranks every queued job against every executor's room), so its
// inputs cannot be split, but which must fail over within seconds: when
// the active member leaves or its session expires, the next rebalance
// hands everything to a standby.
//
// The active member stays active while it lives: a member that owned
// partitions in the last generation keeps them, so a standby joining does
// not move the work. Otherwise the first member (by instance id, then
// member id) is chosen.
func SingleActive() Option {
	return ClientOpts(kgo.Balancers(&singleActive{}))
}

// singleActive remembers its member's last assignment itself: an eager
// consumer revokes everything before it rejoins, so franz-go passes no
// current assignment to JoinGroupMetadata.
type singleActive struct {
	mu    sync.Mutex
	owned map[string][]int32
}

func (*singleActive) ProtocolName() string { return "surge-single-active" }
func (*singleActive) IsCooperative() bool  { return false }

func (s *singleActive) JoinGroupMetadata(interests []string, _ map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = interests
	meta.Generation = generation
	s.mu.Lock()
	current := s.owned
	s.mu.Unlock()
	topics := make([]string, 0, len(current))
	for topic := range current {
		topics = append(topics, topic)
	}
	sort.Strings(topics) // deterministic metadata: no needless rebalance
	for _, topic := range topics {
		parts := current[topic]
		if len(parts) == 0 {
			continue
		}
		owned := kmsg.NewConsumerMemberMetadataOwnedPartition()
		owned.Topic, owned.Partitions = topic, parts
		meta.OwnedPartitions = append(meta.OwnedPartitions, owned)
	}
	return meta.AppendTo(nil)
}

func (s *singleActive) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	a, err := kgo.ParseConsumerSyncAssignment(assignment)
	if err == nil {
		s.mu.Lock()
		s.owned = a
		s.mu.Unlock()
	}
	return a, err
}

func (s *singleActive) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	b, err := kgo.NewConsumerBalancer(s, members)
	if err != nil {
		return nil, nil, err
	}
	return b, b.MemberTopics(), nil
}

func (*singleActive) Balance(b *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	plan := b.NewPlan()
	members := b.Members()
	if len(members) == 0 {
		return plan
	}
	active := &members[0]
	newest := int32(-1)
	b.EachMember(func(m *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		// The owner of the latest generation wins; a member whose owned
		// partitions are from an older generation is a zombie's memory.
		if len(meta.OwnedPartitions) > 0 && meta.Generation > newest {
			active, newest = m, meta.Generation
		}
	})
	for topic, n := range topics {
		parts := make([]int32, n)
		for i := range parts {
			parts[i] = int32(i)
		}
		plan.AddPartitions(active, topic, parts)
	}
	return plan
}
