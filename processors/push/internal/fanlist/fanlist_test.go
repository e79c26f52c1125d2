package fanlist

import (
	"context"
	"math/rand/v2"
	"testing"

	pb "surge/schemas/surgev1"
)

func TestSampleSize(t *testing.T) {
	for fans, want := range map[uint64]int{0: 100, 999_999: 100, 5_000_000: 500, 100_000_000: 10000, 1 << 40: 10000} {
		if got := SampleSize(fans); got != want {
			t.Errorf("SampleSize(%d) = %d, want %d", fans, got, want)
		}
	}
}

// build makes a source with n followers and a mirror that drifted from it
// by dropping lost of them and keeping stale extra non-followers.
func build(n, lost, stale int) (*Lists, *Mirror) {
	src, m := NewLists(), NewMirror(nil)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		uin := uint64(rng.Uint32N(1 << 28))
		d := &pb.FanDelta{AccountId: 7, Uin: uin, Op: pb.FanDelta_FOLLOW}
		src.Apply(d)
		if i >= lost {
			m.Apply(d)
		}
	}
	for range stale {
		m.Apply(&pb.FanDelta{AccountId: 7, Uin: uint64(1<<28 + rng.Uint32N(1<<20)), Op: pb.FanDelta_FOLLOW})
	}
	return src, m
}

func TestResolverUsesGoodMirror(t *testing.T) {
	src, m := build(200_000, 0, 0)
	r := &Resolver{Source: src, Mirror: m, Threshold: 1000, Rand: rand.New(rand.NewPCG(3, 4))}
	set, from, err := r.Followers(context.Background(), 7)
	if err != nil || from != "mirror" || set.GetCardinality() == 0 {
		t.Fatalf("from %s, err %v", from, err)
	}
	if src.Reads != 0 {
		t.Fatal("the source's full list was read although the mirror is good")
	}
	if v := r.Validations[0]; !v.OK || v.Mean != 0 || v.SampleLen != 100 {
		t.Fatalf("validation %v", v)
	}
}

func TestResolverFallsBackOnDriftedMirror(t *testing.T) {
	// The mirror holds 10% stale members: half of each sample is drawn from
	// the mirror, so the error rate is far above 2%.
	src, m := build(100_000, 0, 12_000)
	r := &Resolver{Source: src, Mirror: m, Threshold: 1000, Rand: rand.New(rand.NewPCG(5, 6))}
	set, from, err := r.Followers(context.Background(), 7)
	if err != nil || from != "source" {
		t.Fatalf("from %s, err %v", from, err)
	}
	if set.GetCardinality() != 100_000 && set.GetCardinality() < 99_000 {
		t.Fatalf("fallback returned %d followers", set.GetCardinality())
	}
	v := r.Validations[0]
	if v.OK || v.Mean < MaxMeanError {
		t.Fatalf("drifted mirror passed: %v", v)
	}
	// A small drift (0.1%) passes: the rule tolerates it by design.
	src2, m2 := build(100_000, 0, 100)
	r2 := &Resolver{Source: src2, Mirror: m2, Threshold: 1000, Rand: rand.New(rand.NewPCG(7, 8))}
	if _, from, _ := r2.Followers(context.Background(), 7); from != "mirror" {
		t.Fatalf("0.1%% drift fell back: %v", r2.Validations[0])
	}
}

func TestSmallAccountsReadTheSource(t *testing.T) {
	src, m := build(500, 0, 0)
	r := &Resolver{Source: src, Mirror: m, Threshold: 1000}
	if _, from, _ := r.Followers(context.Background(), 7); from != "source" {
		t.Fatal("account under the threshold used the mirror")
	}
	if _, _, err := r.Followers(context.Background(), 99); err == nil {
		t.Fatal("unknown account resolved")
	}
}
