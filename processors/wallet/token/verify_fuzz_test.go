package token

import (
	"bytes"
	"encoding/base64"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "surge/schemas/surgev1"
)

// FuzzVerify: a token read from any bytes verifies only when what its
// signature covers is exactly what was signed, alone or in a Merkle
// batch; the cache of verified tokens and roots changes no answer.
func FuzzVerify(f *testing.F) {
	seed := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	k, err := FromSeed("k1", seed)
	if err != nil {
		f.Fatal(err)
	}
	batch := batchOf(5)
	k.SignBatch(batch)
	single := batchOf(1)[0]
	single.OutTradeNo = "single_s_r_1_1"
	k.Sign(single)
	issued := map[string]bool{}
	for _, t := range append(batch, single) {
		issued[string(signed(t))] = true
		b, err := proto.Marshal(t)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	cache := NewVerified(1000)
	f.Fuzz(func(t *testing.T, b []byte) {
		var tok pb.Token
		if Unmarshal(b, &tok) != nil {
			return
		}
		direct, cached := k.Verify(&tok), cache.Verify(k, &tok)
		if (direct == nil) != (cached == nil) {
			t.Fatalf("%x: verify %v, through the cache %v", b, direct, cached)
		}
		if direct == nil && !issued[string(signed(&tok))] {
			t.Fatalf("%x verifies but was never signed: %v", b, &tok)
		}
	})
}
