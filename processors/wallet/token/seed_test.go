package token

import (
	"bytes"
	"encoding/base64"
	"testing"
)

// A seed is accepted in standard or URL-safe base64, padded or not (what
// `surge wallet keygen` prints): each spelling is the same key. Anything
// else, or a seed of the wrong size, is refused.
func TestSeedInEitherBase64(t *testing.T) {
	seed := bytes.Repeat([]byte{0xfb, 0xff, 0x3e}, 11)[:32] // bytes whose encodings differ (+/ versus -_)
	var want string
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		k, err := FromSeed("k", enc.EncodeToString(seed))
		if err != nil {
			t.Fatalf("%q: %v", enc.EncodeToString(seed), err)
		}
		_, pub := k.Public()
		if want == "" {
			want = string(pub)
		} else if string(pub) != want {
			t.Fatalf("%q gives another key", enc.EncodeToString(seed))
		}
	}
	for _, bad := range []string{"", "not base64!", base64.StdEncoding.EncodeToString(seed[:31])} {
		if _, err := FromSeed("k", bad); err == nil {
			t.Fatalf("seed %q accepted", bad)
		}
	}
}
