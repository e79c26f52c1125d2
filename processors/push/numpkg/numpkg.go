// Package numpkg is the number package: every target source of a send job
// (followers, an uploaded list, tags) is converged into one sorted uin set,
// stored where every executor can read it. On disk it is a roaring bitmap
// behind a small header (magic, format version, count, CRC-32C of the
// body), so a truncated or corrupted package is refused, not half-sent.
package numpkg

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"regexp"
	"surge/schemas/uinset"

	"github.com/RoaringBitmap/roaring/v2"
)

const (
	magic      = "SNPK"
	version    = 1
	headerSize = 4 + 2 + 8 + 4
)

var (
	// ErrEmpty is a package with no targets.
	ErrEmpty = errors.New("numpkg: package is empty")
	// ErrCorrupt is a package that fails its checks.
	ErrCorrupt = errors.New("numpkg: package is corrupt")
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// Encode serialises a non-empty target set.
func Encode(b *roaring.Bitmap) ([]byte, error) {
	if b == nil || b.IsEmpty() {
		return nil, ErrEmpty
	}
	b.RunOptimize()
	var body bytes.Buffer
	if _, err := b.WriteTo(&body); err != nil {
		return nil, err
	}
	out := make([]byte, headerSize, headerSize+body.Len())
	copy(out, magic)
	binary.BigEndian.PutUint16(out[4:], version)
	binary.BigEndian.PutUint64(out[6:], b.GetCardinality())
	binary.BigEndian.PutUint32(out[14:], crc32.Checksum(body.Bytes(), castagnoli))
	return append(out, body.Bytes()...), nil
}

// Decode checks and reads a package.
func Decode(data []byte) (*roaring.Bitmap, error) {
	if len(data) < headerSize || string(data[:4]) != magic {
		return nil, fmt.Errorf("%w: no package header", ErrCorrupt)
	}
	if v := binary.BigEndian.Uint16(data[4:]); v != version {
		return nil, fmt.Errorf("%w: format version %d, this build reads %d", ErrCorrupt, v, version)
	}
	body := data[headerSize:]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(data[14:]) {
		return nil, fmt.Errorf("%w: checksum mismatch (truncated or altered)", ErrCorrupt)
	}
	b, err := uinset.Decode(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if want := binary.BigEndian.Uint64(data[6:]); b.GetCardinality() != want {
		return nil, fmt.Errorf("%w: %d targets, header says %d", ErrCorrupt, b.GetCardinality(), want)
	}
	if b.IsEmpty() {
		return nil, ErrEmpty
	}
	return b, nil
}

// Store keeps packages where every executor can read them.
type Store interface {
	Put(ctx context.Context, jobID string, targets *roaring.Bitmap) (uri string, err error)
	Get(ctx context.Context, uri string) (*roaring.Bitmap, error)
}

// FileStore keeps packages as files in a directory shared by the executors
// (a network file system or object-store mount in production).
type FileStore struct{ Dir string }

var jobIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// Put writes the package atomically (temporary file, then rename).
func (s FileStore) Put(_ context.Context, jobID string, targets *roaring.Bitmap) (string, error) {
	if !jobIDPattern.MatchString(jobID) {
		return "", fmt.Errorf("numpkg: job id %q must match %s", jobID, jobIDPattern)
	}
	data, err := Encode(targets)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(s.Dir, jobID+".snpk")
	tmp, err := os.CreateTemp(s.Dir, jobID+".*.tmp")
	if err != nil {
		return "", err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", err
	}
	tmp.Close()
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	return "file://" + path, nil
}

// Get reads and checks a package by the URI Put returned.
func (s FileStore) Get(_ context.Context, uri string) (*roaring.Bitmap, error) {
	path, ok := bytes.CutPrefix([]byte(uri), []byte("file://"))
	if !ok {
		return nil, fmt.Errorf("numpkg: %q is not a file:// package URI", uri)
	}
	data, err := os.ReadFile(string(path))
	if err != nil {
		return nil, fmt.Errorf("numpkg: %w", err)
	}
	return Decode(data)
}
