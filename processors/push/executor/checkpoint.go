package executor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"surge/schemas/uinset"

	"github.com/RoaringBitmap/roaring/v2"
)

// The online bitmap's checkpoint: an executor restarted after kill -9
// loads it and reads push.presence only from the offsets it holds, not
// from the start (seconds for 8M online users otherwise).
//
// File: magic, the topic, the partition count, (partition int32, next
// offset int64) each, then the portable roaring bitmap. Written to a
// temporary file and renamed, so a crash leaves the old one or the new.
const checkpointMagic = "SURGE-ONLINE-1\n"

func (x *Executor) checkpointPath() string {
	return filepath.Join(x.cfg.Dir, "online.checkpoint")
}

// saveCheckpoint runs on the presence table's goroutine (no apply is in
// flight), so the bitmap matches the offsets.
func (x *Executor) saveCheckpoint(topic string, next map[int32]int64) error {
	var b bytes.Buffer
	b.WriteString(checkpointMagic)
	_ = binary.Write(&b, binary.BigEndian, uint16(len(topic)))
	b.WriteString(topic)
	_ = binary.Write(&b, binary.BigEndian, uint32(len(next)))
	for p, off := range next {
		_ = binary.Write(&b, binary.BigEndian, p)
		_ = binary.Write(&b, binary.BigEndian, off)
	}
	x.mu.RLock()
	_, err := x.online.WriteTo(&b)
	x.mu.RUnlock()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(x.cfg.Dir, 0o755); err != nil {
		return err
	}
	tmp := x.checkpointPath() + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(b.Bytes()); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, x.checkpointPath())
}

// loadCheckpoint returns the bitmap and offsets saved for topic, or an
// error saying why there is none to use.
func (x *Executor) loadCheckpoint(topic string) (*roaring.Bitmap, map[int32]int64, error) {
	data, err := os.ReadFile(x.checkpointPath())
	if err != nil {
		return nil, nil, err
	}
	r := bytes.NewReader(data)
	magic := make([]byte, len(checkpointMagic))
	if _, err := r.Read(magic); err != nil || string(magic) != checkpointMagic {
		return nil, nil, errors.New("not an online checkpoint")
	}
	var n16 uint16
	if err := binary.Read(r, binary.BigEndian, &n16); err != nil {
		return nil, nil, err
	}
	name := make([]byte, n16)
	if _, err := r.Read(name); err != nil || string(name) != topic {
		return nil, nil, fmt.Errorf("checkpoint of topic %q, not %q", name, topic)
	}
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil || n > 1<<16 {
		return nil, nil, errors.New("bad partition count")
	}
	next := make(map[int32]int64, n)
	for range n {
		var p int32
		var off int64
		if err := binary.Read(r, binary.BigEndian, &p); err != nil {
			return nil, nil, err
		}
		if err := binary.Read(r, binary.BigEndian, &off); err != nil {
			return nil, nil, err
		}
		next[p] = off
	}
	bm, err := uinset.Read(r)
	if err != nil {
		return nil, nil, fmt.Errorf("bitmap: %w", err)
	}
	return bm, next, nil
}
