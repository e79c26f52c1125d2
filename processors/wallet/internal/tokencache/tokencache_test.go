package tokencache

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	pb "surge/schemas/surgev1"
	"surge/streams/streamstest"
)

// The user's token hash is the order numbers' claim: the first token
// written for an order number stays, and undoing a grant removes only the
// token that grant wrote, never one a concurrent grant of the same order
// number wrote.
func TestTokenClaimAndRelease(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		toks := New(rdb, streamstest.Unique("tok")+":", 0)
		mine := &pb.Token{ActId: "u1", OutTradeNo: "u1_rain_r1_1_1", Amount: 5, Signature: []byte("first")}
		theirs := proto.Clone(mine).(*pb.Token)
		theirs.Signature = []byte("second")
		mineB, _ := proto.Marshal(mine)
		theirsB, _ := proto.Marshal(theirs)

		claim := func(tok *pb.Token, b []byte) bool {
			pipe := rdb.Pipeline()
			cmd := toks.Claim(ctx, pipe, tok, b)
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			return cmd.Val()
		}
		release := func(tok *pb.Token, b []byte) {
			pipe := rdb.Pipeline()
			toks.Release(ctx, pipe, tok, b)
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		held := func() []byte {
			got, err := toks.Get(ctx, "u1", mine.OutTradeNo)
			if err != nil {
				t.Fatal(err)
			}
			if got == nil {
				return nil
			}
			return got.Signature
		}

		if !claim(mine, mineB) {
			t.Fatal("the first claim of an order number was refused")
		}
		if claim(theirs, theirsB) {
			t.Fatal("a second claim of the same order number was granted")
		}
		release(theirs, theirsB) // the loser undoing: must not touch the winner's token
		if string(held()) != "first" {
			t.Fatalf("token held %q after the loser's release, want the first", held())
		}
		release(mine, mineB)
		if held() != nil {
			t.Fatal("the writer's release left its token")
		}
		if !claim(theirs, theirsB) {
			t.Fatal("a released order number could not be claimed again")
		}
	})
}
