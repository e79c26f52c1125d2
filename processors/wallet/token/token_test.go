package token

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "surge/schemas/surgev1"
	"surge/schemas/wire"
)

func TestSignVerifyTamper(t *testing.T) {
	k, err := Generate("k1")
	if err != nil {
		t.Fatal(err)
	}
	tok := &pb.Token{AppId: "app", ActId: "a1", ActivityId: "act", SceneId: "s", Amount: 88, OutTradeNo: "a1_s_r_1_1",
		OpenTime: 1, RainId: "r", Status: pb.TokenStatus_PROCESSING}
	k.Sign(tok)
	if err := k.Verify(tok); err != nil {
		t.Fatal(err)
	}
	tok.Status = pb.TokenStatus_SUCCESS // status is not signed: booking keeps the signature
	if err := k.Verify(tok); err != nil {
		t.Fatal(err)
	}
	for name, tamper := range map[string]func(*pb.Token){
		"amount": func(t *pb.Token) { t.Amount = 8800 },
		"owner":  func(t *pb.Token) { t.ActId = "a2" },
		"order":  func(t *pb.Token) { t.OutTradeNo = "x" },
		"sig":    func(t *pb.Token) { t.Signature[0] ^= 1 },
		"key":    func(t *pb.Token) { t.KeyId = "other" },
	} {
		c := &pb.Token{}
		*c = pb.Token{AppId: tok.AppId, ActId: tok.ActId, ActivityId: tok.ActivityId, SceneId: tok.SceneId, Amount: tok.Amount,
			OutTradeNo: tok.OutTradeNo, OpenTime: tok.OpenTime, RainId: tok.RainId, KeyId: tok.KeyId, Signature: append([]byte(nil), tok.Signature...)}
		tamper(c)
		if err := k.Verify(c); !errors.Is(err, ErrForged) {
			t.Errorf("%s tampered, verify says %v", name, err)
		}
	}
	other, _ := Generate("k1")
	if err := other.Verify(tok); err == nil {
		t.Fatal("a token signed by another key with the same id verified")
	}
	if _, err := FromSeed("k", "short"); err == nil {
		t.Fatal("bad seed accepted")
	}
}

// The per-core cost of the token scheme: what bounds intake and booking.
func BenchmarkSign(b *testing.B) {
	k, _ := Generate("k")
	tok := &pb.Token{AppId: "app", ActId: "a1", ActivityId: "act", SceneId: "s", Amount: 88, OutTradeNo: "a1_s_r_1_1", OpenTime: 1, RainId: "r"}
	for b.Loop() {
		k.Sign(tok)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "signs/s")
}

func BenchmarkVerify(b *testing.B) {
	k, _ := Generate("k")
	tok := &pb.Token{AppId: "app", ActId: "a1", ActivityId: "act", SceneId: "s", Amount: 88, OutTradeNo: "a1_s_r_1_1", OpenTime: 1, RainId: "r"}
	k.Sign(tok)
	for b.Loop() {
		if k.Verify(tok) != nil {
			b.Fatal("verify")
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verifies/s")
}

func batchOf(n int) []*pb.Token {
	toks := make([]*pb.Token, n)
	for i := range toks {
		toks[i] = &pb.Token{AppId: "app", ActId: fmt.Sprintf("a%d", i), ActivityId: "act", SceneId: "s", Amount: int64(1 + i),
			OutTradeNo: fmt.Sprintf("a%d_s_r_1_%d", i, i), OpenTime: 1, RainId: "r", Status: pb.TokenStatus_PROCESSING}
	}
	return toks
}

// Every token of a batch verifies on its own, whatever the batch's size;
// one Ed25519 signature per BatchSize tokens.
func TestSignBatchVerifies(t *testing.T) {
	k, _ := Generate("k1")
	for _, n := range []int{1, 2, 3, 7, 64, 65, BatchSize, BatchSize + 1, 2*BatchSize + 7} {
		toks := batchOf(n)
		k.SignBatch(toks)
		sigs := map[string]bool{}
		for i, tok := range toks {
			if err := k.Verify(tok); err != nil {
				t.Fatalf("batch of %d, token %d: %v", n, i, err)
			}
			if len(tok.BatchProof) == 0 || len(tok.BatchProof) > bits.Len(BatchSize-1)*hashSize {
				t.Fatalf("batch of %d: proof of %d bytes", n, len(tok.BatchProof))
			}
			sigs[string(tok.Signature)] = true
		}
		if want := (n + BatchSize - 1) / BatchSize; len(sigs) != want {
			t.Fatalf("batch of %d: %d signatures, want %d", n, len(sigs), want)
		}
		// A fresh keyring with the same public key (a reader elsewhere)
		// verifies them too, from nothing cached.
		id, pub := k.Public()
		reader := newKeyring("", nil, map[string]ed25519.PublicKey{id: pub})
		for _, tok := range toks {
			if err := reader.Verify(tok); err != nil {
				t.Fatalf("reader: %v", err)
			}
		}
	}
}

// Altering any signed field, the proof, the index or the signature of a
// batch token is refused, also after its root was verified and cached.
func TestBatchTamper(t *testing.T) {
	k, _ := Generate("k1")
	toks := batchOf(5)
	k.SignBatch(toks)
	for _, tok := range toks {
		if err := k.Verify(tok); err != nil { // warms the root cache
			t.Fatal(err)
		}
	}
	clone := func(x *pb.Token) *pb.Token { return proto.Clone(x).(*pb.Token) }
	for name, tamper := range map[string]func(*pb.Token){
		"amount":       func(t *pb.Token) { t.Amount++ },
		"owner":        func(t *pb.Token) { t.ActId = "a9" },
		"order":        func(t *pb.Token) { t.OutTradeNo = "x" },
		"open time":    func(t *pb.Token) { t.OpenTime++ },
		"index":        func(t *pb.Token) { t.BatchIndex ^= 1 },
		"index range":  func(t *pb.Token) { t.BatchIndex = 1 << 20 },
		"proof":        func(t *pb.Token) { t.BatchProof[3] ^= 1 },
		"top of proof": func(t *pb.Token) { t.BatchProof[len(t.BatchProof)-1] ^= 1 },
		"short proof":  func(t *pb.Token) { t.BatchProof = t.BatchProof[:hashSize] },
		"ragged proof": func(t *pb.Token) { t.BatchProof = t.BatchProof[:len(t.BatchProof)-1] },
		"signature":    func(t *pb.Token) { t.Signature[0] ^= 1 },
		"key":          func(t *pb.Token) { t.KeyId = "other" },
		"other's proof": func(t *pb.Token) {
			t.BatchProof, t.BatchIndex = toks[2].BatchProof, toks[2].BatchIndex
		},
	} {
		c := clone(toks[0])
		tamper(c)
		if err := k.Verify(c); !errors.Is(err, ErrForged) {
			t.Errorf("%s tampered, verify says %v", name, err)
		}
	}
	// A whole second batch signed by another key with the same id.
	other, _ := Generate("k1")
	forged := batchOf(2)
	other.SignBatch(forged)
	if err := k.Verify(forged[0]); !errors.Is(err, ErrForged) {
		t.Fatalf("a batch signed by another key verified: %v", err)
	}
	// A batch root's signature is not a single token's signature.
	single := clone(toks[0])
	single.BatchProof, single.BatchIndex = nil, 0
	if err := k.Verify(single); !errors.Is(err, ErrForged) {
		t.Fatalf("a batch signature verified as a single token's: %v", err)
	}
}

// A reader keeps the tree nodes it proved and checks later tokens of the
// batch against them. In any order of arrival every token of a batch
// verifies, and a token whose index or any proof hash was changed is
// refused, whichever proven nodes its climb meets.
func TestProvenNodesInAnyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	k, _ := Generate("k1")
	id, pub := k.Public()
	for _, n := range []int{2, 5, 64, 100, BatchSize} {
		toks := batchOf(n)
		k.SignBatch(toks)
		for round := range 3 {
			reader := newKeyring("", nil, map[string]ed25519.PublicKey{id: pub})
			for _, i := range rng.Perm(n) {
				tok := toks[i]
				// Before the genuine token, a tampered copy of it.
				c := proto.Clone(tok).(*pb.Token)
				what := ""
				if rng.IntN(3) == 0 {
					bit := rng.IntN(bits.Len(uint(n - 1)))
					c.BatchIndex ^= 1 << bit
					what = fmt.Sprintf("index bit %d", bit)
				} else {
					level := rng.IntN(len(c.BatchProof) / hashSize)
					c.BatchProof[level*hashSize+rng.IntN(hashSize)] ^= 1 << rng.IntN(8)
					what = fmt.Sprintf("proof hash %d", level)
				}
				if err := reader.Verify(c); !errors.Is(err, ErrForged) {
					t.Fatalf("batch of %d, round %d, token %d with its %s changed: %v", n, round, i, what, err)
				}
				if err := reader.Verify(tok); err != nil {
					t.Fatalf("batch of %d, round %d, token %d: %v", n, round, i, err)
				}
			}
		}
	}
}

// signed covers every Token field except status, the signature fields and
// the grant it rides with on wallet.tokens, so a field added to the schema
// is signed unless deliberately left out.
func TestSignedCoversEveryField(t *testing.T) {
	unsigned := map[string]bool{"status": true, "signature": true, "batch_index": true, "batch_proof": true,
		"grant": true} // the token's own fields carry what the user is owed
	base := &pb.Token{}
	alone, err := wire.EachFieldAlone(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range alone {
		changed := string(signed(f.Msg.(*pb.Token))) != string(signed(base))
		if changed == unsigned[string(f.Name)] {
			t.Errorf("field %s: signed=%v, want %v", f.Name, changed, !unsigned[string(f.Name)])
		}
	}
}

// Per token, in batches of BatchSize: what intake pays to sign.
func BenchmarkSignBatch(b *testing.B) {
	k, _ := Generate("k")
	toks := batchOf(BatchSize)
	n := 0
	for b.Loop() {
		k.SignBatch(toks)
		n += len(toks)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tokens/s")
}

// Per token, each batch root verified once (as the ledger and the balance
// reads meet them): what booking pays to check.
func BenchmarkVerifyBatch(b *testing.B) {
	k, _ := Generate("k")
	var toks []*pb.Token
	for range 1024 {
		batch := batchOf(BatchSize)
		k.SignBatch(batch)
		toks = append(toks, batch...)
	}
	id, pub := k.Public()
	i := 0
	reader := newKeyring("", nil, map[string]ed25519.PublicKey{id: pub})
	for b.Loop() {
		if i == len(toks) {
			i, reader = 0, newKeyring("", nil, map[string]ed25519.PublicKey{id: pub})
		}
		if reader.Verify(toks[i]) != nil {
			b.Fatal("verify")
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verifies/s")
}

// TestAppendSignedIsTheProtobufEncoding: the hand-written encoding of the
// signed fields must stay the deterministic protobuf encoding, or tokens
// signed by another build (or before this one) would no longer verify.
func TestAppendSignedIsTheProtobufEncoding(t *testing.T) {
	toks := []*pb.Token{
		{},
		{AppId: "app", ActId: "a1", ActivityId: "act", SceneId: "s", Amount: 88, OutTradeNo: "a1_s_r_1_1", OpenTime: 1700000000000, RainId: "r", KeyId: "k1"},
		{ActId: "只有中文", Amount: -5, OpenTime: -1, Status: pb.TokenStatus_SUCCESS, Signature: []byte{1}, BatchIndex: 3, BatchProof: []byte{2}},
		{AppId: string(make([]byte, 300)), Amount: 1 << 62, KeyId: "k"},
	}
	for i, tok := range toks {
		c := &pb.Token{AppId: tok.AppId, ActId: tok.ActId, ActivityId: tok.ActivityId, SceneId: tok.SceneId, Amount: tok.Amount,
			OutTradeNo: tok.OutTradeNo, OpenTime: tok.OpenTime, RainId: tok.RainId, KeyId: tok.KeyId}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if got := signed(tok); string(got) != string(want) {
			t.Errorf("token %d: signed bytes\n%x\nwant the protobuf encoding\n%x", i, got, want)
		}
	}
}

// TestMarshalIsTheProtobufEncoding: the hand-written encoding of a whole
// token, and MarshalWithGrant's with its grant, is byte for byte
// proto.Marshal's deterministic one, for tokens with every field set and
// for each field set alone (a field added to the schema and not to Marshal
// fails here).
func TestMarshalIsTheProtobufEncoding(t *testing.T) {
	k, _ := Generate("k1")
	batch := batchOf(3)
	k.SignBatch(batch)
	withGrant := proto.Clone(batch[1]).(*pb.Token)
	withGrant.Grant = &pb.RewardGrant{OrderNo: "a1_s_r_1_1", ActId: "a1", Amount: 88, AwardType: pb.AwardType_CASH, Shadow: true}
	toks := []*pb.Token{
		{},
		batch[2],
		withGrant,
		{ActId: "只有中文", Amount: -5, OpenTime: -1, Status: pb.TokenStatus_SUCCESS, Signature: []byte{1}, BatchIndex: 3, BatchProof: []byte{2}},
		{AppId: string(make([]byte, 300)), Amount: 1 << 62, KeyId: "k", Status: pb.TokenStatus(-1), BatchIndex: 1 << 31},
	}
	record := func(tok *pb.Token) []byte {
		b := Marshal(tok)
		if tok.Grant == nil {
			return b
		}
		v, n := MarshalWithGrant(tok, tok.Grant)
		if !bytes.Equal(v[:n], b) {
			t.Errorf("the first %d bytes of the record are not Marshal's token:\n%x\n%x", n, v[:n], b)
		}
		return v
	}
	bad, err := wire.Mismatches(record, toks...)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range bad {
		t.Error(m)
	}
}

// TestGrantEncodingIsTheProtobufEncoding: the grant inside a token's
// record is written by hand too; it must be proto.Marshal's encoding for
// every field alone (a field added to RewardGrant and not to appendGrant
// fails here), for grants with many fields, and with long fields whose
// lengths take more than one varint byte.
func TestGrantEncodingIsTheProtobufEncoding(t *testing.T) {
	grants := []*pb.RewardGrant{
		{},
		{OrderNo: "a1_rain_r1_1_1", ActId: "a1", ActivityId: "spring-live", SceneId: "rain", RainId: "r1", AwardType: pb.AwardType_CASH,
			Stage: 1, Amount: 88, AppId: "app", AtMs: 1796585019840, TemplateId: "tpl", Shadow: true, ParentActivityId: "spring"},
		{OrderNo: string(make([]byte, 300)), ActId: "只有中文", Amount: -5, AtMs: -1, AwardType: pb.AwardType(-2), Stage: 1 << 31},
	}
	bad, err := wire.Mismatches(func(g *pb.RewardGrant) []byte { return appendGrant(nil, g) }, grants...)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range bad {
		t.Error(m)
	}
	// Inside a record: the header is moved in front of a grant of any size.
	for _, g := range grants {
		tok := &pb.Token{ActId: "a1", Amount: 1, Grant: g}
		v, n := MarshalWithGrant(tok, g)
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(tok)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(v, want) || n != len(Marshal(tok)) {
			t.Errorf("record of a grant of %d bytes:\n%x\nwant\n%x", proto.Size(g), v, want)
		}
	}
}

// GrantOf gives a record's grant as protobuf decodes it, joins a grant
// field written twice as protobuf merges them, finds none in a token
// without one, and refuses a truncated record.
func TestGrantOf(t *testing.T) {
	g := &pb.RewardGrant{OrderNo: "a1_rain_r1_1_1", ActId: "a1", AwardType: pb.AwardType_CASH, Stage: 1, Amount: 88}
	tok := &pb.Token{ActId: "a1", Amount: 88}
	v, _ := MarshalWithGrant(tok, g)
	raw, found, err := GrantOf(v)
	got := new(pb.RewardGrant)
	if err != nil || !found || proto.Unmarshal(raw, got) != nil || !proto.Equal(got, g) {
		t.Fatalf("GrantOf a cash token's record: %v %v %v, want %v", got, found, err, g)
	}
	if _, found, err := GrantOf(Marshal(tok)); found || err != nil {
		t.Errorf("a token without a grant: found %v, %v", found, err)
	}
	// The field twice: protobuf merges the second into the first.
	second, _ := MarshalWithGrant(&pb.Token{}, &pb.RewardGrant{Amount: 99})
	raw, _, err = GrantOf(append(slices.Clone(v), second...))
	merged := new(pb.RewardGrant)
	if err != nil || proto.Unmarshal(raw, merged) != nil || merged.Amount != 99 || merged.OrderNo != g.OrderNo {
		t.Errorf("a grant field twice: %v, %v; want the two merged", merged, err)
	}
	if _, _, err := GrantOf(v[:len(v)-1]); err == nil {
		t.Error("a truncated record was read")
	}
}

// TestRootCheckedOnceAtATime: the tokens of one batch reach the ledger's
// verifying goroutines together; only one of them may pay the Ed25519
// verification, and all must get its answer.
func TestRootCheckedOnceAtATime(t *testing.T) {
	for _, pass := range []bool{true, false} {
		c := newCheckedSet(16)
		var runs atomic.Int32
		release := make(chan struct{})
		var wg sync.WaitGroup
		answers := make([]bool, 8)
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i] = c.check("root", func() bool {
					runs.Add(1)
					<-release
					return pass
				})
			}()
		}
		time.Sleep(50 * time.Millisecond) // let every caller arrive while the first check runs
		close(release)
		wg.Wait()
		for i, a := range answers {
			if a != pass {
				t.Errorf("pass=%v: caller %d got %v", pass, i, a)
			}
		}
		if pass && runs.Load() != 1 {
			t.Errorf("a passing root was checked %d times at once; want 1", runs.Load())
		}
		if !pass && c.has("root") {
			t.Error("a failed check was remembered as passed")
		}
	}
}

// Intake's batches are shallow enough for their nodes to be kept; a deeper
// tree (which no intake signs) still verifies, by climbing to its root
// each time, and is not sized in memory.
func TestDeepTreeVerifiesWithoutKeepingNodes(t *testing.T) {
	if d := bits.Len(BatchSize - 1); d > maxProvenDepth {
		t.Fatalf("a batch of %d is %d levels deep; nodes are kept only up to %d", BatchSize, d, maxProvenDepth)
	}
	k, _ := Generate("k1")
	tok := batchOf(1)[0]
	tok.KeyId = "k1"
	depth := maxProvenDepth + 1
	proof := make([]byte, depth*hashSize)
	for i := range proof {
		proof[i] = byte(i * 7)
	}
	tok.BatchIndex, tok.BatchProof = 5, proof
	root, _ := climb(leafHash(tok), tok.BatchIndex, proof, nil)
	tok.Signature = ed25519.Sign(k.signer, rootMessage(root))
	for range 2 {
		if err := k.Verify(tok); err != nil {
			t.Fatalf("a token of a %d-level tree: %v", depth, err)
		}
	}
	var id batchID
	copy(id.pub[:], k.public["k1"])
	copy(id.sig[:], tok.Signature)
	if k.proven.get(id) != nil {
		t.Fatal("the nodes of a tree deeper than maxProvenDepth were kept")
	}
	tok.BatchProof[len(proof)-1] ^= 1
	if err := k.Verify(tok); !errors.Is(err, ErrForged) {
		t.Fatalf("changed proof of a deep tree: %v", err)
	}
}
