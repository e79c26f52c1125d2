package localstore_test

import (
	"encoding/binary"
	"sync"
	"testing"

	"surge/streams/localstore"
)

func filterKey(i int) []byte { return binary.BigEndian.AppendUint64([]byte("order:"), uint64(i)) }

// TestKeyFilterNeverMissesAnAddedKey: a "no" must be certain, or a
// processor would take a booked order for a new one.
func TestKeyFilterNeverMissesAnAddedKey(t *testing.T) {
	const n = 1_000_000
	f := localstore.NewKeyFilter(n)
	for i := 0; i < n; i += 2 {
		f.Add(filterKey(i))
	}
	falseMaybe := 0
	for i := range n {
		may := f.MayContain(filterKey(i))
		if i%2 == 0 && !may {
			t.Fatalf("key %d was added but the filter says no", i)
		}
		if i%2 == 1 && may {
			falseMaybe++
		}
	}
	// Sized for n keys and holding n/2: well under 1% of absent keys may
	// be answered "maybe". More means the filter no longer saves lookups.
	if rate := float64(falseMaybe) / (n / 2); rate > 0.01 {
		t.Fatalf("%.2f%% of absent keys answered maybe; want under 1%%", 100*rate)
	}
}

// TestKeyFilterOverfilledStaysCorrect: past its size the filter answers
// "maybe" more often, never "no" for an added key.
func TestKeyFilterOverfilledStaysCorrect(t *testing.T) {
	f := localstore.NewKeyFilter(1024)
	for i := range 100_000 {
		f.Add(filterKey(i))
	}
	for i := range 100_000 {
		if !f.MayContain(filterKey(i)) {
			t.Fatalf("key %d added, filter says no", i)
		}
	}
}

// TestKeyFilterConcurrentAddAndRead runs one adder against readers (the
// ledger's processing goroutine and its balance reads); run with -race.
// A key is announced to the readers only after Add returned, as a store
// write is; from then on no reader may be told no.
func TestKeyFilterConcurrentAddAndRead(t *testing.T) {
	f := localstore.NewKeyFilter(100_000)
	added := make(chan int, 1024)
	var wg sync.WaitGroup
	errs := make(chan int, 1)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range added {
				if !f.MayContain(filterKey(i)) {
					select {
					case errs <- i:
					default:
					}
				}
			}
		}()
	}
	for i := range 100_000 {
		f.Add(filterKey(i))
		added <- i
	}
	close(added)
	wg.Wait()
	select {
	case i := <-errs:
		t.Fatalf("key %d was added before it was read, and the filter said no", i)
	default:
	}
}

func BenchmarkKeyFilterMiss(b *testing.B) {
	f := localstore.NewKeyFilter(1_000_000)
	for i := range 1_000_000 {
		f.Add(filterKey(i))
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		f.MayContain(filterKey(1_000_000 + i))
	}
}

func BenchmarkKeyFilterAdd(b *testing.B) {
	f := localstore.NewKeyFilter(8 << 20)
	for i := 0; b.Loop(); i++ {
		f.Add(filterKey(i))
	}
}
