package filter

import (
	"context"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"

	"surge/processors/push/internal/quota"
	pb "surge/schemas/surgev1"
)

func chain() (*Chain, *Blacklists, *Tags, *Sent, *quota.Ledger) {
	bl, tags, sent, led := NewBlacklists(), NewTags(), NewSent(), quota.NewLedger(1)
	return NewChain(RelationFilter{}, bl, tags, sent, QuotaFilter{led}), bl, tags, sent, led
}

func TestChainEachFilter(t *testing.T) {
	c, bl, tags, _, _ := chain()
	followers := roaring.BitmapOf(1, 2, 3, 4, 5, 6, 7, 8)
	bl.Add(0, 2)  // global
	bl.Add(9, 3)  // this account
	bl.Add(10, 4) // another account: no effect
	tags.Tag("vip", 1, 3, 4, 5, 6, 7, 100)
	noon := time.Date(2026, 12, 2, 23, 59, 0, 0, time.UTC) // every window released
	j := &Job{SendJob: &pb.SendJob{AccountId: 9, Source: pb.TargetSource_PACKAGE, Tags: []string{"vip"}, ContentCrc: 42},
		Now: noon, Followers: func(context.Context) (*roaring.Bitmap, error) { return followers, nil }}
	res, err := c.Run(context.Background(), j, All, roaring.BitmapOf(1, 2, 3, 4, 5, 6, 100, 200))
	if err != nil {
		t.Fatal(err)
	}
	want := map[Bit][]uint32{Relation: {100, 200}, Blacklist: {2, 3}, Targeting: nil, CRC: nil, Quota: nil}
	for b, uins := range want {
		if !res.Removed[b].Equals(roaring.BitmapOf(uins...)) {
			t.Errorf("%s removed %v, want %v", b, res.Removed[b].ToArray(), uins)
		}
	}
	if !res.Kept.Equals(roaring.BitmapOf(1, 4, 5, 6)) {
		t.Fatalf("kept %v", res.Kept.ToArray())
	}
	// The same content again: the CRC filter removes everyone who got it.
	res, _ = c.Run(context.Background(), j, All, roaring.BitmapOf(1, 4, 5, 6, 7))
	if !res.Kept.Equals(roaring.BitmapOf(7)) || !res.Removed[CRC].Equals(roaring.BitmapOf(1, 4, 5, 6)) {
		t.Fatalf("second send kept %v", res.Kept.ToArray())
	}
}

func TestCRCNotChargedForQuotaRefusals(t *testing.T) {
	c, _, _, sent, led := chain()
	morning := time.Date(2026, 12, 2, 0, 0, 1, 0, time.UTC) // nothing released yet
	j := &Job{SendJob: &pb.SendJob{AccountId: 9, Source: pb.TargetSource_FOLLOWERS, ContentCrc: 7}, Now: morning}
	res, _ := c.Run(context.Background(), j, All, roaring.BitmapOf(1, 2))
	if !res.Kept.IsEmpty() || !res.Removed[Quota].Equals(roaring.BitmapOf(1, 2)) {
		t.Fatalf("kept %v before any release", res.Kept.ToArray())
	}
	if sent.byCRC[7] != nil && !sent.byCRC[7].IsEmpty() {
		t.Fatal("CRC charged for users the quota refused")
	}
	if led.Count(morning, 1) != 0 {
		t.Fatal("quota charged for a refused user")
	}
}

func TestMaskAndModes(t *testing.T) {
	if Mask(&pb.SendJob{}, Relation|Quota) != Relation|Quota {
		t.Fatal("account default not used")
	}
	if Mask(&pb.SendJob{FilterMask: uint32(CRC)}, All) != CRC {
		t.Fatal("job mask not used")
	}
	if Mask(&pb.SendJob{Realtime: true}, All)&Quota != 0 {
		t.Fatal("real-time job charged quota")
	}
	c, _, _, _, _ := chain()
	j := &Job{SendJob: &pb.SendJob{Source: pb.TargetSource_PACKAGE}, Now: time.Now(),
		Followers: func(context.Context) (*roaring.Bitmap, error) { return roaring.New(), nil }}
	res, _ := c.Run(context.Background(), j, Blacklist, roaring.BitmapOf(1, 2))
	if res.Kept.GetCardinality() != 2 {
		t.Fatal("a filter not in the mask ran")
	}
}

// The targeting filter keeps only users with every tag of the job; an
// unknown tag matches nobody; a tag taken away stops matching; a job whose
// targets came from the tags is not filtered by them again.
func TestTargetingRemovesUsersWithoutTheTags(t *testing.T) {
	tags := NewTags()
	tags.Tag("vip", 2, 4, 6, 8)
	tags.Tag("new", 4, 5, 6)
	run := func(src pb.TargetSource, want ...string) *roaring.Bitmap {
		t.Helper()
		c := NewChain(tags)
		j := &Job{SendJob: &pb.SendJob{AccountId: 9, Source: src, Tags: want}, Now: time.Now()}
		targets := roaring.New()
		targets.AddRange(1, 11)
		res, err := c.Run(context.Background(), j, Targeting, targets)
		if err != nil {
			t.Fatal(err)
		}
		if removed := res.Removed[Targeting]; removed.GetCardinality()+res.Kept.GetCardinality() != 10 {
			t.Fatalf("kept %v and removed %v of 10", res.Kept.ToArray(), removed.ToArray())
		}
		return res.Kept
	}
	if kept := run(pb.TargetSource_FOLLOWERS, "vip", "new"); !kept.Equals(roaring.BitmapOf(4, 6)) {
		t.Errorf("vip and new: kept %v, want [4 6]", kept.ToArray())
	}
	if kept := run(pb.TargetSource_PACKAGE, "vip"); !kept.Equals(roaring.BitmapOf(2, 4, 6, 8)) {
		t.Errorf("vip: kept %v", kept.ToArray())
	}
	if kept := run(pb.TargetSource_FOLLOWERS, "vip", "nobody-has-this"); !kept.IsEmpty() {
		t.Errorf("an unknown tag kept %v", kept.ToArray())
	}
	tags.Untag("vip", 4)
	if kept := run(pb.TargetSource_FOLLOWERS, "vip", "new"); !kept.Equals(roaring.BitmapOf(6)) {
		t.Errorf("after untagging 4: kept %v, want [6]", kept.ToArray())
	}
	if kept := run(pb.TargetSource_TAGS, "vip"); kept.GetCardinality() != 10 {
		t.Errorf("a TAGS job filtered by its own tags: kept %v", kept.ToArray())
	}
}
