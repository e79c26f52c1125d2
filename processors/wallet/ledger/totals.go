package ledger

import "sync"

// totals is the sum of booked grants per partition of wallet.ledger (the
// live total's source, see package counter). Like the store it has a
// committed part and the open batch's (or the rebuild's) part on top.
type totals struct {
	mu        sync.Mutex
	committed map[int32]int64
	staged    map[int32]int64 // the open batch's bookings
	rebuilt   map[int32]int64 // the rebuild's bookings
	changed   map[int32]bool  // committed since the last publish
}

func newTotals() *totals {
	return &totals{committed: map[int32]int64{}, staged: map[int32]int64{}, rebuilt: map[int32]int64{}, changed: map[int32]bool{}}
}

func (t *totals) add(rebuild bool, p int32, amount int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rebuild {
		t.rebuilt[p] += amount
	} else {
		t.staged[p] += amount
	}
}

// commit promotes the staged (or rebuilt) sums: they are in the store.
func (t *totals) commit(rebuild bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	from := t.staged
	if rebuild {
		from = t.rebuilt
	}
	for p, v := range from {
		t.committed[p] += v
		t.changed[p] = true
	}
	clear(from)
}

// drop forgets the open batch's sums: it was aborted.
func (t *totals) drop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.staged)
}

// clear zeroes partitions about to be rebuilt from wallet.ledger.
func (t *totals) clear(ps map[int32]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p := range ps {
		delete(t.committed, p)
	}
	clear(t.rebuilt)
}

// all returns every committed sum (and clears the changed marks): the
// periodic full publish that heals a Redis that missed writes.
func (t *totals) all() map[int32]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[int32]int64, len(t.committed))
	for p, v := range t.committed {
		out[p] = v
	}
	clear(t.changed)
	return out
}

// dirty returns the committed sums of the partitions changed since the
// last call.
func (t *totals) dirty() map[int32]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[int32]int64, len(t.changed))
	for p := range t.changed {
		out[p] = t.committed[p]
	}
	clear(t.changed)
	return out
}

// redirty marks partitions changed again (their publish failed).
func (t *totals) redirty(sums map[int32]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p := range sums {
		t.changed[p] = true
	}
}
