package filter

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"

	"surge/processors/push/internal/quota"
	pb "surge/schemas/surgev1"
)

// BenchmarkChain runs a 10M-target package through every filter: relation
// (9M followers), blacklist (100k), targeting (one tag on 8M), CRC (1M got
// the content already) and the quota. Reported as uins/s on one core.
// Dense: uins 0..10M (an account whose followers registered close together,
// the roaring best case). Sparse: 10M uins spread over the whole 2^32 space
// (the worst case: array containers everywhere).
func BenchmarkChain(b *testing.B) {
	b.Run("dense", func(b *testing.B) { benchChain(b, func(i uint32) uint32 { return i }) })
	b.Run("sparse", func(b *testing.B) { benchChain(b, func(i uint32) uint32 { return i * 429 }) })
}

func benchChain(b *testing.B, uin func(uint32) uint32) {
	const n = 10_000_000
	rng := rand.New(rand.NewPCG(1, 1))
	pkg, followers, tag, already := roaring.New(), roaring.New(), roaring.New(), roaring.New()
	for i := uint32(0); i < n; i++ {
		u := uin(i)
		pkg.Add(u)
		if i < n*9/10 {
			followers.Add(u)
		}
		if i >= n/10 && i < n*9/10 {
			tag.Add(u)
		}
		if i < n/10 {
			already.Add(u)
		}
	}
	bl := NewBlacklists()
	for range 100_000 {
		bl.Add(0, uin(rng.Uint32N(n)))
	}
	tags := NewTags()
	tags.Tag("t", tag.ToArray()...)
	late := time.Date(2026, 12, 2, 23, 59, 0, 0, time.UTC)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		sent := NewSent()
		sent.Record(1, already)
		c := NewChain(RelationFilter{}, bl, tags, sent, QuotaFilter{quota.NewLedger(1)})
		j := &Job{SendJob: &pb.SendJob{AccountId: 1, Source: pb.TargetSource_PACKAGE, Tags: []string{"t"}, ContentCrc: 1}, Now: late,
			Followers: func(context.Context) (*roaring.Bitmap, error) { return followers, nil }}
		targets := pkg.Clone()
		b.StartTimer()
		res, err := c.Run(context.Background(), j, All, targets)
		if err != nil || res.Kept.IsEmpty() {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "uins/s")
}
