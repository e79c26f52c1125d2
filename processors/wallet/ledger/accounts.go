package ledger

import (
	"encoding/binary"
	"errors"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"surge/streams/localstore"
)

type account struct{ balance, income int64 }

// maxCachedAccounts bounds the balances held in memory.
const maxCachedAccounts = 1 << 20

// accounts keeps balances in memory in front of the Pebble store. The
// ledger is the only writer of its users' accounts (the inputs are
// co-partitioned by actID), so a committed balance held here is the
// balance. The open batch's changes are staged apart and promoted only when
// the batch commits; an aborted batch drops them. Reading every account
// from Pebble was the largest share of a booking's CPU (bench/wallet-notes.md).
type accounts struct {
	mu        sync.RWMutex
	committed map[string]account
	max       int // committed is cleared when it reaches max: a simple bound
	staged    map[string]account
	keys      *localstore.KeyFilter // a new user's account is not looked up
}

func newAccounts(max int, keys *localstore.KeyFilter) *accounts {
	return &accounts{committed: make(map[string]account), max: max, staged: make(map[string]account), keys: keys}
}

func (a *accounts) read(r pebble.Reader, act string) (account, error) {
	k := acctKey(act)
	if !a.keys.MayContain(k) {
		return account{}, nil
	}
	v, c, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return account{}, nil
	}
	if err != nil {
		return account{}, err
	}
	defer c.Close()
	return account{int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:]))}, nil
}

// get is the balance as the open batch sees it. r is the store under the
// batch (the batch's own balances are the staged ones); only the
// processing goroutine calls get and stage.
func (a *accounts) get(r pebble.Reader, act string) (account, error) {
	if acc, ok := a.staged[act]; ok {
		return acc, nil
	}
	return a.getCommitted(r, act)
}

// getCommitted is the committed balance (the readers' view).
func (a *accounts) getCommitted(r pebble.Reader, act string) (account, error) {
	a.mu.RLock()
	acc, ok := a.committed[act]
	a.mu.RUnlock()
	if ok {
		return acc, nil
	}
	return a.read(r, act)
}

func (a *accounts) stage(act string, acc account) { a.staged[act] = acc }

// writeStaged writes the staged balances into w, the batch they belong to.
func (a *accounts) writeStaged(w *pebble.Batch) error {
	var v [16]byte
	for act, acc := range a.staged {
		binary.BigEndian.PutUint64(v[:8], uint64(acc.balance))
		binary.BigEndian.PutUint64(v[8:], uint64(acc.income))
		if err := w.Set(acctKey(act), v[:], nil); err != nil {
			return err
		}
	}
	return nil
}

// commit promotes the staged balances; call it once their batch is
// committed to Pebble.
func (a *accounts) commit() {
	a.mu.Lock()
	for act, acc := range a.staged {
		if len(a.committed) >= a.max {
			clear(a.committed)
		}
		a.committed[act] = acc
	}
	a.mu.Unlock()
	clear(a.staged)
}

// drop forgets the staged balances (an aborted or retried batch).
func (a *accounts) drop() { clear(a.staged) }

// reset forgets every committed balance (a partition was rebuilt).
func (a *accounts) reset() {
	a.mu.Lock()
	clear(a.committed)
	a.mu.Unlock()
}
