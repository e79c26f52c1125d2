package numpkg

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/RoaringBitmap/roaring/v2"
)

func TestRoundTripThroughTheStore(t *testing.T) {
	s := FileStore{Dir: t.TempDir()}
	b := roaring.New()
	b.AddRange(100, 200000)
	b.Add(1<<32 - 1)
	uri, err := s.Put(context.Background(), "job-1", b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(context.Background(), uri)
	if err != nil || !got.Equals(b) {
		t.Fatalf("round trip: %v, %d targets", err, got.GetCardinality())
	}
}

func TestBadPackagesAreRefused(t *testing.T) {
	if _, err := Encode(roaring.New()); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty package encoded: %v", err)
	}
	good, _ := Encode(roaring.BitmapOf(1, 2, 3, 1000000))
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)-1] ^= 0xff
	wrongVersion := append([]byte(nil), good...)
	wrongVersion[5] = 9
	for name, data := range map[string][]byte{
		"nothing":   nil,
		"garbage":   []byte("uin1,uin2,uin3 as text is not a package"),
		"truncated": good[:len(good)-3],
		"flipped":   flipped,
		"version":   wrongVersion,
	} {
		if _, err := Decode(data); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: accepted or wrong error: %v", name, err)
		}
	}
	s := FileStore{Dir: t.TempDir()}
	if _, err := s.Put(context.Background(), "../escape", roaring.BitmapOf(1)); err == nil {
		t.Error("path-escaping job id accepted")
	}
	os.WriteFile(s.Dir+"/bad.snpk", good[:10], 0o644)
	if _, err := s.Get(context.Background(), "file://"+s.Dir+"/bad.snpk"); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("corrupt file read: %v", err)
	}
}
