package token

import (
	"errors"
	"testing"

	pb "surge/schemas/surgev1"
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
