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

// accounts keeps balances in memory in front of the Pebble store, as a
// write-back cache. The ledger is the only writer of its users' accounts
// (the inputs are co-partitioned by actID), so a committed balance held
// here is the balance. The open batch's changes are staged apart and
// promoted only when the batch commits; an aborted batch drops them.
// Reading every account from Pebble was the largest share of a booking's
// CPU, and writing every changed balance to it cost a Pebble write per
// booking and the flushes and compactions behind it (bench/wallet-notes.md).
//
// A committed balance reaches Pebble only when it leaves memory (evict):
// the store is wiped and rebuilt from wallet.ledger on every start, so no
// balance needs to be on disk before that.
type accounts struct {
	db        *pebble.DB // the store under the cache; evicted balances go there
	mu        sync.RWMutex
	committed map[string]account // written by the processing goroutine only
	max       int                // at least half of committed is evicted when it would pass max
	staged    map[string]account
	keys      *localstore.KeyFilter // a new user's account is not looked up
}

func newAccounts(db *pebble.DB, max int, keys *localstore.KeyFilter) *accounts {
	return &accounts{db: db, committed: make(map[string]account), max: max, staged: make(map[string]account), keys: keys}
}

func (a *accounts) read(act string) (account, error) {
	k := acctKey(act)
	if !a.keys.MayContain(k) {
		return account{}, nil
	}
	v, c, err := a.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return account{}, nil
	}
	if err != nil {
		return account{}, err
	}
	defer c.Close()
	return account{int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:]))}, nil
}

// get is the balance as the open batch sees it (the batch's own balances
// are the staged ones); only the processing goroutine calls get and stage.
func (a *accounts) get(act string) (account, error) {
	if acc, ok := a.staged[act]; ok {
		return acc, nil
	}
	return a.getCommitted(act)
}

// getCommitted is the committed balance (the readers' view).
func (a *accounts) getCommitted(act string) (account, error) {
	a.mu.RLock()
	acc, ok := a.committed[act]
	a.mu.RUnlock()
	if ok {
		return acc, nil
	}
	return a.read(act)
}

func (a *accounts) stage(act string, acc account) { a.staged[act] = acc }

// commit promotes the staged balances; call it once their batch is
// committed to Pebble. Only the processing goroutine calls it.
func (a *accounts) commit() error {
	if err := a.promote(a.staged); err != nil {
		return err
	}
	clear(a.staged)
	return nil
}

// adopt takes over the committed balances of a finished rebuild: they
// join the cache rather than being written to the store.
func (a *accounts) adopt(rebuilt *accounts) error {
	return a.promote(rebuilt.committed)
}

// promote adds balances to the committed ones, evicting first if they
// would not fit.
func (a *accounts) promote(balances map[string]account) error {
	if over := len(a.committed) + len(balances) - a.max; over > 0 { // make room, and for a while
		if err := a.evict(max(over, len(a.committed)/2)); err != nil {
			return err
		}
	}
	a.mu.Lock()
	for act, acc := range balances {
		a.committed[act] = acc
	}
	a.mu.Unlock()
	return nil
}

// evictChunk bounds one Pebble batch of evicted balances.
const evictChunk = 50_000

// evict writes n committed balances (the map's iteration picks them) to
// the store, then forgets them. A reader meanwhile finds each balance in
// memory or, once it is forgotten, in the store: it is written first.
func (a *accounts) evict(n int) error {
	victims := make([]string, 0, min(n, evictChunk))
	var v [16]byte
	for n > 0 {
		victims = victims[:0]
		b := a.db.NewBatch()
		for act, acc := range a.committed { // no writer but this goroutine
			if len(victims) == min(n, evictChunk) {
				break
			}
			k := acctKey(act)
			binary.BigEndian.PutUint64(v[:8], uint64(acc.balance))
			binary.BigEndian.PutUint64(v[8:], uint64(acc.income))
			a.keys.Add(k)
			if err := b.Set(k, v[:], nil); err != nil {
				_ = b.Close()
				return err
			}
			victims = append(victims, act)
		}
		if len(victims) == 0 {
			return b.Close()
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return err
		}
		a.mu.Lock()
		for _, act := range victims {
			delete(a.committed, act)
		}
		a.mu.Unlock()
		n -= len(victims)
	}
	return nil
}

// flush writes every committed balance to the store and forgets them all:
// before a partition's keys are dropped from the store (the balances of
// the others must survive).
func (a *accounts) flush() error { return a.evict(len(a.committed)) }

// drop forgets the staged balances (an aborted or retried batch).
func (a *accounts) drop() { clear(a.staged) }
