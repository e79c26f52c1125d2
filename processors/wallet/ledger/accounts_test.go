package ledger

import (
	"fmt"
	"testing"

	"surge/streams/localstore"
)

// TestEvictedBalancesAreKept: balances live in memory until evicted, and
// the store holds them from then on. A balance lost on its way out of the
// cache would read as zero, as if the user had never been paid.
func TestEvictedBalancesAreKept(t *testing.T) {
	db, err := localstore.Open(t.TempDir(), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	keys := localstore.NewKeyFilter(1 << 10)
	const max, users = 16, 200
	a := newAccounts(db, max, keys)
	want := map[string]account{}
	for round := range 5 { // every user's balance changes in every round
		for u := range users {
			act := fmt.Sprintf("u%d", u)
			acc, err := a.get(act)
			if err != nil {
				t.Fatal(err)
			}
			if acc != want[act] {
				t.Fatalf("round %d: %s reads %+v, want %+v", round, act, acc, want[act])
			}
			if acc.income == 0 {
				keys.Add(acctKey(act)) // as apply does for a new account
			}
			acc.balance += int64(u + 1)
			acc.income += int64(u + 1)
			a.stage(act, acc)
			want[act] = acc
			if u%10 == 9 { // a batch of ten bookings commits
				if err := a.commit(); err != nil {
					t.Fatal(err)
				}
				if len(a.committed) > max {
					t.Fatalf("%d balances cached, bound %d", len(a.committed), max)
				}
			}
		}
	}
	for act, acc := range want { // what a reader sees
		if got, err := a.getCommitted(act); err != nil || got != acc {
			t.Fatalf("%s: reader sees %+v (%v), want %+v", act, got, err, acc)
		}
	}
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	if len(a.committed) != 0 {
		t.Fatalf("%d balances cached after flush", len(a.committed))
	}
	fresh := newAccounts(db, max, keys) // nothing cached: every balance from the store
	for act, acc := range want {
		if got, err := fresh.getCommitted(act); err != nil || got != acc {
			t.Fatalf("%s: store holds %+v (%v), want %+v", act, got, err, acc)
		}
	}
}
