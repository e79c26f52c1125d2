// Package localstore opens the Pebble stores processors keep as caches of
// their topics. It exists so every store is opened the same way: its own
// directory, Pebble's chatter routed to slog at debug level.
package localstore

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
)

// Option adjusts a store's Pebble options (a merge operator, say).
type Option func(*pebble.Options)

// Merger sets the store's merge operator.
func Merger(m *pebble.Merger) Option { return func(o *pebble.Options) { o.Merger = m } }

// Open opens (creating) a Pebble store in dir. With fresh set the directory
// is wiped first: the caller will rebuild it from a topic.
func Open(dir string, fresh bool, log *slog.Logger, options ...Option) (*pebble.DB, error) {
	if fresh {
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
	}
	if log == nil {
		log = slog.Default()
	}
	opts := &pebble.Options{
		Logger: logger{log},
		// Processors mostly ask "do I know this key?" of keys they have
		// never seen (a new uin, a new order number): bloom filters answer
		// that, from the block cache. Pebble reserves the memtables' memory
		// out of the block cache, so the cache must be well above them or
		// it caches nothing (the defaults, 8 MiB and 4 MiB memtables that
		// double as they fill, left it empty: every Get read its filter and
		// index blocks from disk).
		CacheSize:    256 << 20,
		MemTableSize: 16 << 20,
		// A fresh store is rebuilt from its topics after any crash, so a
		// write-ahead log would only be written, never read.
		DisableWAL: fresh,
	}
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	for _, o := range options {
		o(opts)
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("localstore: open %s: %w", dir, err)
	}
	return db, nil
}

type logger struct{ l *slog.Logger }

func (l logger) Infof(format string, args ...any) {
	l.l.Debug("pebble: " + fmt.Sprintf(format, args...))
}
func (l logger) Errorf(format string, args ...any) {
	l.l.Error("pebble: " + fmt.Sprintf(format, args...))
}
func (l logger) Fatalf(format string, args ...any) {
	l.l.Error("pebble: fatal: " + fmt.Sprintf(format, args...))
	os.Exit(1)
}

// DeleteWhere deletes every key for which drop says so: how a processor
// forgets the partitions it is about to rebuild from their changelogs.
func DeleteWhere(db *pebble.DB, drop func(key []byte) bool) error {
	it, err := db.NewIter(nil)
	if err != nil {
		return err
	}
	defer it.Close()
	b := db.NewBatch()
	defer b.Close()
	for ok := it.First(); ok; ok = it.Next() {
		if drop(it.Key()) {
			_ = b.Delete(it.Key(), nil)
		}
	}
	return b.Commit(pebble.NoSync)
}
