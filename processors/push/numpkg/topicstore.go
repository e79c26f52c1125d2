package numpkg

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/localstore"
)

// ChunkBytes bounds one chunk of a package on its topic: far below the
// broker's record limit, so a package of any size travels.
const ChunkBytes = 256 << 10

// URIPrefix starts the URI of a package kept on a topic: topic:<topic>/<id>.
const URIPrefix = "topic:"

// TopicStore keeps packages on a topic (push.packages), so any planner on
// any machine reads the packages any other wrote, and platforms upload
// theirs by producing to it. Each instance follows the topic into a local
// Pebble store, a cache of the topic that survives restarts: the table's
// position is saved in the store with the chunks it covers, so a restart
// reads only what was published since (a month of packages is not read
// again), and a store that cannot go on from there is rebuilt.
type TopicStore struct {
	topic string
	cl    *kgo.Client
	db    *pebble.DB
	log   *slog.Logger

	mu    sync.Mutex
	ready chan struct{}
}

// positionPrefix keys the table's next offset per partition; package ids
// (jobIDPattern) never start with it.
const positionPrefix = "\xffnext/"

// CheckpointEvery is how often the store saves its position.
const CheckpointEvery = 5 * time.Second

// OpenTopicStore starts following topic into the Pebble store in dir,
// from the position saved there (or from the start into a fresh store).
// It runs until ctx ends; Close releases it after.
func OpenTopicStore(ctx context.Context, kc streams.Cluster, topic, dir string, log *slog.Logger) (*TopicStore, error) {
	if log == nil {
		log = slog.Default()
	}
	cl, err := kc.NewClient(kgo.ProducerBatchMaxBytes(ChunkBytes+(64<<10)),
		kgo.RecordDeliveryTimeout(time.Minute))
	if err != nil {
		return nil, err
	}
	db, next, err := openAt(ctx, cl, topic, dir, log)
	if err != nil {
		cl.Close()
		return nil, err
	}
	s := &TopicStore{topic: topic, cl: cl, db: db, log: log}
	opts := []streams.TableOption{streams.TableCheckpoint(CheckpointEvery, s.savePosition)}
	if next != nil {
		opts = append(opts, streams.TableFrom(next))
	}
	table, err := streams.FollowTable(ctx, kc, topic, s.apply, opts...)
	if err != nil {
		cl.Close()
		db.Close()
		return nil, err
	}
	s.ready = make(chan struct{})
	go func() {
		select {
		case <-table.Ready():
			close(s.ready)
		case <-ctx.Done():
		}
	}()
	return s, nil
}

// openAt opens the store in dir and returns the position to follow the
// topic from: the saved one if the topic still has every record after it,
// else nil and an emptied store.
func openAt(ctx context.Context, cl *kgo.Client, topic, dir string, log *slog.Logger) (*pebble.DB, map[int32]int64, error) {
	db, err := localstore.Open(dir, false, log)
	if err != nil {
		return nil, nil, err
	}
	next, err := loadPosition(db)
	if err == nil && len(next) > 0 {
		if err = streams.OffsetsReadable(ctx, cl, topic, next); err == nil {
			log.Info("numpkg: package store goes on from its saved position", "topic", topic, "partitions", len(next))
			return db, next, nil
		}
	}
	if err != nil || len(next) > 0 {
		log.Warn("numpkg: package store rebuilt from the topic's start", "topic", topic, "err", err)
	}
	db.Close()
	// Wiped, but opened durable (not localstore's fresh mode, which has no
	// write-ahead log): its position must survive a crash with its chunks.
	if err := os.RemoveAll(dir); err != nil {
		return nil, nil, err
	}
	db, err = localstore.Open(dir, false, log)
	return db, nil, err
}

func loadPosition(db *pebble.DB) (map[int32]int64, error) {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte(positionPrefix), UpperBound: []byte(positionPrefix + "\xff")})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	next := map[int32]int64{}
	for it.First(); it.Valid(); it.Next() {
		k, v := it.Key()[len(positionPrefix):], it.Value()
		if len(k) != 4 || len(v) != 8 {
			return nil, fmt.Errorf("numpkg: bad position record %q", it.Key())
		}
		next[int32(binary.BigEndian.Uint32(k))] = int64(binary.BigEndian.Uint64(v))
	}
	return next, it.Error()
}

// savePosition runs on the table's goroutine after the chunks before next
// were written; the synced batch makes them durable with it.
func (s *TopicStore) savePosition(next map[int32]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return
	}
	b := s.db.NewBatch()
	for p, off := range next {
		_ = b.Set(binary.BigEndian.AppendUint32([]byte(positionPrefix), uint32(p)), binary.BigEndian.AppendUint64(nil, uint64(off)), nil)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		s.log.Warn("numpkg: position not saved", "err", err)
	}
}

// Close stops producing and closes the local store (after ctx ended).
func (s *TopicStore) Close() error {
	s.cl.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.db.Close()
	s.db = nil
	return err
}

// URI is the URI of package id on this store's topic.
func (s *TopicStore) URI(id string) string { return TopicURI(s.topic, id) }

// TopicURI is the URI of package id published on topic (see Chunks).
func TopicURI(topic, id string) string { return URIPrefix + topic + "/" + id }

func chunkKey(id string, index uint32) []byte {
	return binary.BigEndian.AppendUint32(append([]byte(id), 0), index)
}

// apply stores one chunk read from the topic.
func (s *TopicStore) apply(r *kgo.Record) {
	var c pb.PackageChunk
	if err := streams.Decode(r, &c); err != nil || c.PackageId == "" || c.Index >= c.Chunks {
		return // not a chunk: a reader of this package fails on it
	}
	s.put(&c)
}

func (s *TopicStore) put(c *pb.PackageChunk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return
	}
	// The chunk count goes with each chunk, so a package whose chunks
	// are not all here yet is told from a whole one.
	v := binary.BigEndian.AppendUint32(nil, c.Chunks)
	if err := s.db.Set(chunkKey(c.PackageId, c.Index), append(v, c.Data...), pebble.NoSync); err != nil {
		s.log.Warn("numpkg: store chunk", "package", c.PackageId, "err", err)
	}
}

// Chunks cuts an encoded package into its chunk records.
func Chunks(topic, id string, data []byte) []*kgo.Record {
	n := max((len(data)+ChunkBytes-1)/ChunkBytes, 1)
	out := make([]*kgo.Record, 0, n)
	now := time.Now().UnixMilli()
	for i := range n {
		part := data[i*ChunkBytes : min((i+1)*ChunkBytes, len(data))]
		c := &pb.PackageChunk{PackageId: id, Index: uint32(i), Chunks: uint32(n), Data: part, AtMs: now}
		rec, err := streams.NewRecord(topic, fmt.Appendf(nil, "%s/%d", id, i), c)
		if err != nil {
			panic(err) // a chunk always encodes
		}
		out = append(out, rec)
	}
	return out
}

// Put publishes the package and keeps it locally; the URI names it.
func (s *TopicStore) Put(ctx context.Context, id string, targets *roaring.Bitmap) (string, error) {
	if !jobIDPattern.MatchString(id) {
		return "", fmt.Errorf("numpkg: package id %q must match %s", id, jobIDPattern)
	}
	data, err := Encode(targets)
	if err != nil {
		return "", err
	}
	recs := Chunks(s.topic, id, data)
	if err := s.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return "", fmt.Errorf("numpkg: publish package %s: %w", id, err)
	}
	for _, r := range recs {
		s.apply(r)
	}
	return s.URI(id), nil
}

// ErrNotFound is a package this store has not (yet) seen whole.
var ErrNotFound = errors.New("numpkg: package not found")

// Get reads a package by its URI, once the store has caught up with its
// topic.
func (s *TopicStore) Get(ctx context.Context, uri string) (*roaring.Bitmap, error) {
	rest, ok := strings.CutPrefix(uri, URIPrefix+s.topic+"/")
	if !ok {
		return nil, fmt.Errorf("numpkg: %q is not a package of %s%s", uri, URIPrefix, s.topic)
	}
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// A package uploaded just before its job may still be on its way
	// into the local copy: look again for a while before saying no.
	deadline := time.Now().Add(notFoundWait)
	for {
		set, err := s.get(rest)
		if !errors.Is(err, ErrNotFound) || time.Now().After(deadline) {
			return set, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// notFoundWait is how long Get waits for a package it has not seen whole.
const notFoundWait = 2 * time.Second

func (s *TopicStore) get(rest string) (*roaring.Bitmap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil, errors.New("numpkg: store closed")
	}
	var data []byte
	for i := uint32(0); ; i++ {
		v, closer, err := s.db.Get(chunkKey(rest, i))
		if errors.Is(err, pebble.ErrNotFound) {
			return nil, fmt.Errorf("%w: %s (chunk %d)", ErrNotFound, rest, i)
		}
		if err != nil {
			return nil, err
		}
		n := binary.BigEndian.Uint32(v)
		data = append(data, v[4:]...)
		closer.Close()
		if i+1 == n {
			break
		}
	}
	return Decode(data)
}
