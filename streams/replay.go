package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrOutOfRetention is returned when a replay asks for records the broker
// has already deleted.
var ErrOutOfRetention = errors.New("streams: replay range is out of retention")

// ReplayFrom says where a replay starts: an offset applied to every
// partition, a timestamp (the first record at or after it), or a
// checkpoint's position per partition.
type ReplayFrom struct {
	Offset int64     // used when Time is zero and Next is nil; 0 = the earliest retained
	Time   time.Time // first record with timestamp >= Time
	// Next is the next offset to read per partition, as a checkpoint saved
	// it (ReplayTo returns it); partitions it lacks start at the earliest.
	Next map[int32]int64
	// Transactional: only transactions write the topic, so the replay
	// knows its end without waiting out trailing markers (CatchUp).
	Transactional bool
}

// Replay reads topic from the given start to the end offsets seen when it
// began, calling fn for each record in partition order. It refuses a start
// that lies before what the broker still retains, rather than silently
// replaying less than was asked.
func Replay(ctx context.Context, cluster Cluster, topic string, from ReplayFrom, fn func(*kgo.Record) error) error {
	_, err := ReplayTo(ctx, cluster, topic, from, fn)
	return err
}

// ReplayTo is Replay that also returns where it stopped: the next offset
// of every partition (the end offsets seen when it began), the position a
// checkpoint of what fn built is taken at.
func ReplayTo(ctx context.Context, cluster Cluster, topic string, from ReplayFrom, fn func(*kgo.Record) error) (map[int32]int64, error) {
	cl, err := cluster.NewClient()
	if err != nil {
		return nil, err
	}
	adm := kadm.NewClient(cl)
	starts, err := listOffsets(ctx, adm.ListStartOffsets, topic)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("replay %s: %w", topic, err)
	}
	ends, err := listOffsets(ctx, adm.ListEndOffsets, topic)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("replay %s: %w", topic, err)
	}
	var byTime kadm.ListedOffsets
	if !from.Time.IsZero() {
		byTime, err = listOffsets(ctx, func(ctx context.Context, topics ...string) (kadm.ListedOffsets, error) {
			return adm.ListOffsetsAfterMilli(ctx, from.Time.UnixMilli(), topics...)
		}, topic)
		if err != nil {
			cl.Close()
			return nil, fmt.Errorf("replay %s: %w", topic, err)
		}
	}
	cl.Close()

	offsets := map[string]map[int32]kgo.Offset{topic: {}}
	remaining := map[int32]int64{}
	next := map[int32]int64{}
	var startErr error
	starts.Each(func(s kadm.ListedOffset) {
		end, _ := ends.Lookup(topic, s.Partition)
		next[s.Partition] = end.Offset
		begin := from.Offset
		if from.Next != nil {
			begin = from.Next[s.Partition]
			if begin > end.Offset {
				startErr = fmt.Errorf("%w: %s/%d ends at %d, asked for %d (topic recreated?)", ErrOutOfRetention, topic, s.Partition, end.Offset, begin)
			}
		}
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
		return nil, startErr
	}
	if len(remaining) == 0 {
		return next, nil
	}
	return next, readRangesOf(ctx, cluster, offsets, map[string]map[int32]int64{topic: remaining}, from.Transactional, fn)
}

// OffsetsReadable reports whether a checkpoint's positions can still be
// read on from: none past its partition's end (a recreated topic) and none
// before its start (deleted by retention). A nil error means the records
// after them are all there.
func OffsetsReadable(ctx context.Context, cl *kgo.Client, topic string, next map[int32]int64) error {
	adm := kadm.NewClient(cl)
	ends, err := listOffsets(ctx, adm.ListEndOffsets, topic)
	if err != nil {
		return err
	}
	starts, err := listOffsets(ctx, adm.ListStartOffsets, topic)
	if err != nil {
		return err
	}
	for p, off := range next {
		e, ok1 := ends.Lookup(topic, p)
		s, ok2 := starts.Lookup(topic, p)
		switch {
		case !ok1 || !ok2:
			return fmt.Errorf("%w: %s has no partition %d", ErrOutOfRetention, topic, p)
		case off > e.Offset:
			return fmt.Errorf("%w: %s/%d ends at %d, checkpoint at %d (topic recreated?)", ErrOutOfRetention, topic, p, e.Offset, off)
		case off < s.Offset:
			return fmt.Errorf("%w: %s/%d starts at %d, checkpoint at %d", ErrOutOfRetention, topic, p, s.Offset, off)
		}
	}
	return nil
}

// listOffsets lists topic's offsets with fn, retrying for 15 seconds: a
// partition whose leader just died answers with an error until the
// cluster elects another and the client's metadata names it. A topic
// that does not exist is answered at once (callers treat it as empty).
func listOffsets(ctx context.Context, fn func(context.Context, ...string) (kadm.ListedOffsets, error), topic string) (kadm.ListedOffsets, error) {
	var listed kadm.ListedOffsets
	var absent error
	err := retryFor(ctx, 15*time.Second, func() error {
		var err error
		if listed, err = fn(ctx, topic); err == nil {
			err = listed.Error()
		}
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			absent = err
			return nil
		}
		return err
	})
	if absent != nil {
		return listed, absent
	}
	return listed, err
}

// ReadToEnd replays a whole topic from its earliest retained record.
func ReadToEnd(ctx context.Context, cluster Cluster, topic string, fn func(*kgo.Record) error) error {
	return Replay(ctx, cluster, topic, ReplayFrom{}, fn)
}

// ReadRanges reads, read-committed, the records of each topic and
// partition from from[topic][partition] up to (not including)
// to[topic][partition], in partition order, with one client for all of
// them: a view reading ahead of its own consumer to offsets it was asked
// to have seen.
func ReadRanges(ctx context.Context, cluster Cluster, from, to map[string]map[int32]int64, fn func(*kgo.Record) error) error {
	offsets := map[string]map[int32]kgo.Offset{}
	ends := map[string]map[int32]int64{}
	for topic, ps := range to {
		for p, end := range ps {
			begin := from[topic][p]
			if begin >= end {
				continue
			}
			if offsets[topic] == nil {
				offsets[topic], ends[topic] = map[int32]kgo.Offset{}, map[int32]int64{}
			}
			offsets[topic][p], ends[topic][p] = kgo.NewOffset().At(begin), end
		}
	}
	if len(offsets) == 0 {
		return nil
	}
	return readRangesOf(ctx, cluster, offsets, ends, false, fn)
}
