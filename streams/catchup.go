package streams

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// CatchUp tracks a read of a topic up to the end offsets seen when it
// began: the restore of a cache from its topic. A partition is caught up
// when a record at end-1 was read. Transaction markers take offsets but
// carry no records, so the last data record can sit a little below the
// end; a partition read to within trailingMarkers of its end is caught up
// after a second without records, and any partition after idleGiveUp (a
// tail of aborted transactions, or compaction). An empty poll alone never
// ends a restore: under load a poll can come back empty with data left.
type CatchUp struct {
	ends      map[int32]int64
	last      map[int32]int64
	idleSince time.Time
	txn       bool // see Transactional
}

// Transactional says the topic is written in transactions: after a
// transactional record read at end-2, the offset left is its commit
// marker, so the partition is caught up at once instead of after a second
// without records; so is a partition whose start (a checkpoint's position
// after a transaction) is end-1. (An open transaction's records are not
// committed, so not read either way; a record written outside a
// transaction gets no such shortcut.)
func (c *CatchUp) Transactional() *CatchUp {
	c.txn = true
	for p, last := range c.last {
		c.caughtUp(p, last, true)
	}
	return c
}

func (c *CatchUp) caughtUp(p int32, last int64, txnRecord bool) {
	if end, ok := c.ends[p]; ok && (last+1 >= end || c.txn && txnRecord && last+2 >= end) {
		delete(c.ends, p)
	}
}

const (
	trailingMarkers = 16
	idleMarkers     = time.Second
	idleGiveUp      = 5 * time.Second
)

// NewCatchUp tracks the partitions in ends (end offsets; empty ones left out).
func NewCatchUp(ends map[int32]int64) *CatchUp {
	return &CatchUp{ends: ends, last: map[int32]int64{}}
}

// From records that partition p is read from offset on, so a partition
// whose remaining offsets are only markers counts as read near its end.
func (c *CatchUp) From(p int32, offset int64) {
	c.last[p] = offset - 1
	if c.txn {
		c.caughtUp(p, offset-1, true)
	}
}

// Saw records a record read: data, or a transaction marker for a reader
// that keeps them (kgo.KeepControlRecords). A marker is transactional too,
// but what follows it is the next transaction's, not its marker, so the
// end-2 shortcut is for data records only.
func (c *CatchUp) Saw(r *kgo.Record) {
	c.last[r.Partition] = r.Offset
	c.caughtUp(r.Partition, r.Offset, r.Attrs.IsTransactional() && !r.Attrs.IsControl())
}

// Polled is called after each poll with the number of records it gave.
func (c *CatchUp) Polled(n int) {
	if n > 0 || len(c.ends) == 0 {
		c.idleSince = time.Time{}
		return
	}
	if c.idleSince.IsZero() {
		c.idleSince = time.Now()
	}
	idle := time.Since(c.idleSince)
	for p, end := range c.ends {
		last, seen := c.last[p]
		if idle > idleGiveUp || idle > idleMarkers && seen && last+1 >= end-trailingMarkers {
			delete(c.ends, p)
		}
	}
}

// Done reports whether every partition is caught up.
func (c *CatchUp) Done() bool { return len(c.ends) == 0 }
