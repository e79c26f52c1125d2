// Package tokencache keeps each user's tokens in Redis, for the intake
// that writes them (and claims their order numbers with them), the ledger
// that marks them booked, and the user-facing reads: one owner for that
// state.
package tokencache

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/token"
	pb "surge/schemas/surgev1"
)

// Cache keeps each user's tokens in Redis, one hash per user (order number
// -> token). It is a cache of wallet.tokens for the user-facing reads; the
// ledger is the truth about what is booked.
type Cache struct {
	rdb    redis.UniversalClient
	prefix string
	ttl    time.Duration // 0 = keep; shadow traffic expires
}

// New returns a token cache with keys prefix+actID.
func New(rdb redis.UniversalClient, prefix string, ttl time.Duration) *Cache {
	return &Cache{rdb: rdb, prefix: prefix, ttl: ttl}
}

func (t *Cache) key(actID string) string { return t.prefix + actID }

// Put stores a token.
func (t *Cache) Put(ctx context.Context, tok *pb.Token) error {
	b, err := proto.Marshal(tok)
	if err != nil {
		return err
	}
	pipe := t.rdb.Pipeline()
	pipe.HSet(ctx, t.key(tok.ActId), tok.OutTradeNo, b)
	if t.ttl > 0 {
		pipe.Expire(ctx, t.key(tok.ActId), t.ttl)
	}
	_, err = pipe.Exec(ctx)
	return err
}

// Claim adds to a pipeline the write of a token (b, already marshalled)
// unless its order number has one: the command's value says whether it
// was written. The user's hash is the order numbers' idempotency record.
func (t *Cache) Claim(ctx context.Context, pipe redis.Pipeliner, tok *pb.Token, b []byte) *redis.BoolCmd {
	cmd := pipe.HSetNX(ctx, t.key(tok.ActId), tok.OutTradeNo, b)
	if t.ttl > 0 {
		pipe.Expire(ctx, t.key(tok.ActId), t.ttl)
	}
	return cmd
}

// releaseScript deletes a hash field only if it still holds the given
// value: a token written by this grant, not one a concurrent grant of the
// same order number wrote.
var releaseScript = redis.NewScript(`if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0`)

// Release adds to a pipeline the removal of tok (encoded as b), if the
// user's hash still holds exactly it.
func (t *Cache) Release(ctx context.Context, pipe redis.Pipeliner, tok *pb.Token, b []byte) {
	releaseScript.Eval(ctx, pipe, []string{t.key(tok.ActId)}, tok.OutTradeNo, b)
}

// All returns the user's tokens; undecodable ones are returned as nil
// entries in bad (counted by the caller as forged).
func (t *Cache) All(ctx context.Context, actID string) (toks []*pb.Token, bad int, err error) {
	m, err := t.rdb.HGetAll(ctx, t.key(actID)).Result()
	if err != nil {
		return nil, 0, err
	}
	for _, v := range m {
		tok := new(pb.Token)
		if token.Unmarshal([]byte(v), tok) != nil {
			bad++
			continue
		}
		toks = append(toks, tok)
	}
	return toks, bad, nil
}

// Get returns one token (nil if absent).
func (t *Cache) Get(ctx context.Context, actID, orderNo string) (*pb.Token, error) {
	return Decode(t.rdb.HGet(ctx, t.key(actID), orderNo))
}

// GetIn adds the read of one token to a pipeline; Decode decodes it.
func (t *Cache) GetIn(ctx context.Context, pipe redis.Pipeliner, actID, orderNo string) *redis.StringCmd {
	return pipe.HGet(ctx, t.key(actID), orderNo)
}

// Decode decodes the answer to a token read: nil if absent.
func Decode(cmd *redis.StringCmd) (*pb.Token, error) {
	v, err := cmd.Bytes()
	if err == redis.Nil {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	tok := new(pb.Token)
	return tok, token.Unmarshal(v, tok)
}

// MarkBooked sets the status of booked tokens to SUCCESS, in toks and in
// Redis (the signature does not cover the status).
func (t *Cache) MarkBooked(ctx context.Context, toks []*pb.Token) error {
	if len(toks) == 0 {
		return nil
	}
	pipe := t.rdb.Pipeline()
	for _, tok := range toks {
		tok.Status = pb.TokenStatus_SUCCESS
		pipe.HSet(ctx, t.key(tok.ActId), tok.OutTradeNo, token.Marshal(tok))
	}
	_, err := pipe.Exec(ctx)
	return err
}
