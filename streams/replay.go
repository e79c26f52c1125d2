package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrOutOfRetention is returned when a replay asks for records the broker
// has already deleted.
var ErrOutOfRetention = errors.New("streams: replay range is out of retention")

// ReplayFrom says where a replay starts: an offset applied to every
// partition, or a timestamp (the first record at or after it).
type ReplayFrom struct {
	Offset int64     // used when Time is zero; 0 = the earliest retained
	Time   time.Time // first record with timestamp >= Time
}

// Replay reads topic from the given start to the end offsets seen when it
// began, calling fn for each record in partition order. It refuses a start
// that lies before what the broker still retains, rather than silently
// replaying less than was asked.
func Replay(ctx context.Context, brokers []string, topic string, from ReplayFrom, fn func(*kgo.Record) error) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		cl.Close()
		return err
	}
	if err := starts.Error(); err != nil {
		cl.Close()
		return fmt.Errorf("replay %s: %w", topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		cl.Close()
		return err
	}
	var byTime kadm.ListedOffsets
	if !from.Time.IsZero() {
		if byTime, err = adm.ListOffsetsAfterMilli(ctx, from.Time.UnixMilli(), topic); err != nil {
			cl.Close()
			return err
		}
	}
	cl.Close()

	offsets := map[string]map[int32]kgo.Offset{topic: {}}
	remaining := map[int32]int64{}
	var startErr error
	starts.Each(func(s kadm.ListedOffset) {
		end, _ := ends.Lookup(topic, s.Partition)
		begin := from.Offset
		if !from.Time.IsZero() {
			t, _ := byTime.Lookup(topic, s.Partition)
			begin = t.Offset
		} else if begin < s.Offset {
			// Offset 0 means "the earliest retained"; any other offset
			// below the start was deleted by retention.
			if begin != 0 {
				startErr = fmt.Errorf("%w: %s/%d starts at %d, asked for %d", ErrOutOfRetention, topic, s.Partition, s.Offset, begin)
			}
			begin = s.Offset
		}
		if begin < end.Offset {
			offsets[topic][s.Partition] = kgo.NewOffset().At(begin)
			remaining[s.Partition] = end.Offset
		}
	})
	if startErr != nil {
		return startErr
	}
	if len(remaining) == 0 {
		return nil
	}
	return readRanges(ctx, brokers, offsets, map[string]map[int32]int64{topic: remaining}, fn)
}

// ReadToEnd replays a whole topic from its earliest retained record.
func ReadToEnd(ctx context.Context, brokers []string, topic string, fn func(*kgo.Record) error) error {
	return Replay(ctx, brokers, topic, ReplayFrom{}, fn)
}
