// Package account is the user-data side of recycling: the core data of an
// account (profile, friends, moments) that the recycle queue backs up and
// deletes and the restore tool brings back. It stands in for the many
// business stores of the seed behind one Redis layout:
//
//	acct:{uin}          hash: username and profile fields
//	acct:{uin}:friends  set of friends' uins
//	acct:{uin}:moments  list of moments
//	uname:{username}    the account's uin (username -> uin)
//
// Backups are keyed by username, never by uin (seed: the uin may be reused
// once the account is deleted), so friends are converted to usernames on
// backup and back to their current uins on restore.
package account

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"surge/processors/uin/internal/luascript"
	pb "surge/schemas/surgev1"
)

// ErrNoAccount is returned for a uin without an account.
var ErrNoAccount = errors.New("account: no account")

// Account is one account's core data.
type Account struct {
	Uin      uint32
	Username string
	Profile  map[string]string
	Friends  []uint32
	Moments  []string
}

// Store reads and writes accounts in Redis.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewStore returns a store with keys under prefix.
func NewStore(rdb redis.UniversalClient, prefix string) *Store {
	return &Store{rdb: rdb, prefix: prefix}
}

// Key is the Redis key of the account on uin (scripts that must check
// it atomically name it).
func (s *Store) Key(uin uint32) string { return s.key(uin) }

func (s *Store) key(uin uint32) string {
	return s.prefix + "acct:" + strconv.FormatUint(uint64(uin), 10)
}
func (s *Store) unameKey(name string) string { return s.prefix + "uname:" + name }

// Create writes an account (replacing what the uin had).
func (s *Store) Create(ctx context.Context, a Account) error {
	if a.Username == "" {
		return errors.New("account: username required")
	}
	k := s.key(a.Uin)
	pipe := s.rdb.TxPipeline()
	pipe.Del(ctx, k, k+":friends", k+":moments")
	fields := map[string]any{"username": a.Username}
	for f, v := range a.Profile {
		fields["p:"+f] = v
	}
	pipe.HSet(ctx, k, fields)
	if len(a.Friends) > 0 {
		fr := make([]any, len(a.Friends))
		for i, f := range a.Friends {
			fr[i] = f
		}
		pipe.SAdd(ctx, k+":friends", fr...)
	}
	if len(a.Moments) > 0 {
		ms := make([]any, len(a.Moments))
		for i, m := range a.Moments {
			ms[i] = m
		}
		pipe.RPush(ctx, k+":moments", ms...)
	}
	pipe.Set(ctx, s.unameKey(a.Username), a.Uin, 0)
	_, err := pipe.Exec(ctx)
	return err
}

// Load reads the account on uin.
func (s *Store) Load(ctx context.Context, uin uint32) (Account, error) {
	k := s.key(uin)
	pipe := s.rdb.Pipeline()
	h := pipe.HGetAll(ctx, k)
	fr := pipe.SMembers(ctx, k+":friends")
	ms := pipe.LRange(ctx, k+":moments", 0, -1)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Account{}, err
	}
	if len(h.Val()) == 0 {
		return Account{}, fmt.Errorf("%w on uin %d", ErrNoAccount, uin)
	}
	a := Account{Uin: uin, Username: h.Val()["username"], Profile: map[string]string{}, Moments: ms.Val()}
	for f, v := range h.Val() {
		if len(f) > 2 && f[:2] == "p:" {
			a.Profile[f[2:]] = v
		}
	}
	for _, f := range fr.Val() {
		if u, err := strconv.ParseUint(f, 10, 32); err == nil {
			a.Friends = append(a.Friends, uint32(u))
		}
	}
	return a, nil
}

// BackupMany loads the accounts on uins and converts them to backups in two
// round trips whatever their number (the recycle controller's batches).
// Uins without an account are absent from the result.
func (s *Store) BackupMany(ctx context.Context, uins []uint32) (map[uint32]*pb.AccountBackup, error) {
	pipe := s.rdb.Pipeline()
	type cmds struct {
		h  *redis.MapStringStringCmd
		fr *redis.StringSliceCmd
		ms *redis.StringSliceCmd
	}
	got := make([]cmds, len(uins))
	for i, u := range uins {
		k := s.key(u)
		got[i] = cmds{pipe.HGetAll(ctx, k), pipe.SMembers(ctx, k+":friends"), pipe.LRange(ctx, k+":moments", 0, -1)}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make(map[uint32]*pb.AccountBackup, len(uins))
	names := s.rdb.Pipeline()
	friendNames := map[uint32][]*redis.StringCmd{}
	for i, u := range uins {
		h := got[i].h.Val()
		if len(h) == 0 {
			continue
		}
		b := &pb.AccountBackup{Username: h["username"], OldUin: uint64(u), Profile: map[string]string{}, Moments: got[i].ms.Val()}
		for f, v := range h {
			if len(f) > 2 && f[:2] == "p:" {
				b.Profile[f[2:]] = v
			}
		}
		for _, f := range got[i].fr.Val() {
			friendNames[u] = append(friendNames[u], names.HGet(ctx, s.prefix+"acct:"+f, "username"))
		}
		out[u] = b
	}
	if names.Len() > 0 {
		if _, err := names.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
	}
	for u, cmds := range friendNames {
		for _, c := range cmds {
			if c.Val() != "" {
				out[u].Friends = append(out[u].Friends, c.Val())
			}
		}
	}
	return out, nil
}

// Deletion names an account to delete.
type Deletion struct {
	Uin      uint32
	Username string
}

// DeleteMany deletes accounts in one round trip; see Delete.
func (s *Store) DeleteMany(ctx context.Context, ds []Deletion) error {
	if len(ds) == 0 {
		return nil
	}
	// Sent twice when the script was not loaded: the deletions are idempotent.
	return luascript.Pipelined(ctx, s.rdb, unmap, func() error { return s.deleteOnce(ctx, ds) })
}

func (s *Store) deleteOnce(ctx context.Context, ds []Deletion) error {
	pipe := s.rdb.Pipeline()
	var names []string // username keys, and the uin each must still point at
	var uins []any
	for _, d := range ds {
		k := s.key(d.Uin)
		pipe.Del(ctx, k, k+":friends", k+":moments")
		if d.Username != "" {
			names, uins = append(names, s.unameKey(d.Username)), append(uins, strconv.FormatUint(uint64(d.Uin), 10))
		}
	}
	for lo := 0; lo < len(names); lo += unmapChunk {
		hi := min(lo+unmapChunk, len(names))
		unmap.EvalSha(ctx, pipe, names[lo:hi], uins[lo:hi]...)
	}
	_, err := pipe.Exec(ctx)
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	return err
}

// unmapChunk is the most usernames one unmap call drops.
const unmapChunk = 500

// unmap drops each username's mapping (KEYS) only if it still points at
// its uin (ARGV).
var unmap = redis.NewScript(`for i, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[i] then redis.call('DEL', k) end
end
return 0`)

// Ban is one account banned for recycling: logins are refused until
// Until (the platform's login service reads Banned), and the ban ends by
// itself then, or earlier when recycling stops (Unban).
type Ban struct {
	Uin      uint32
	Until    time.Time
	TicketID string
	Reason   string
}

func (s *Store) banKey(uin uint32) string {
	return s.prefix + "ban:" + strconv.FormatUint(uint64(uin), 10)
}

// BanMany bans accounts; banning again with the same ticket changes
// nothing (an aborted batch writes its effects again).
func (s *Store) BanMany(ctx context.Context, bans []Ban) error {
	pipe := s.rdb.Pipeline()
	for _, b := range bans {
		pipe.Do(ctx, "SET", s.banKey(b.Uin), b.TicketID+"|"+b.Reason, "PXAT", b.Until.UnixMilli())
	}
	_, err := pipe.Exec(ctx)
	return err
}

// bansMarker says that the bans of partition p are in Redis: the recycle
// controller sets it once it wrote them all, and a Redis that lost its
// data has none, so the controller writes them again from its state.
func (s *Store) bansMarker(p int32) string { return s.prefix + "bans-gen:" + strconv.Itoa(int(p)) }

// BansMissing answers which of partitions ps have no bans marker.
func (s *Store) BansMissing(ctx context.Context, ps []int32) ([]int32, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(ps))
	for i, p := range ps {
		cmds[i] = pipe.Exists(ctx, s.bansMarker(p))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var out []int32
	for i, c := range cmds {
		if c.Val() == 0 {
			out = append(out, ps[i])
		}
	}
	return out, nil
}

// MarkBans sets partition p's bans marker.
func (s *Store) MarkBans(ctx context.Context, p int32) error {
	return s.rdb.Set(ctx, s.bansMarker(p), time.Now().UnixMilli(), 0).Err()
}

// UnbanMany lifts the bans of tickets that stopped (a login, an unban):
// only a ban that ticket set, so a later ticket's ban stays.
func (s *Store) UnbanMany(ctx context.Context, bans []Ban) error {
	pipe := s.rdb.Pipeline()
	for _, b := range bans {
		unban.Eval(ctx, pipe, []string{s.banKey(b.Uin)}, b.TicketID+"|")
	}
	_, err := pipe.Exec(ctx)
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	return err
}

var unban = redis.NewScript(`local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end return 0`)

// Banned reports whether uin is banned, for how much longer and why.
func (s *Store) Banned(ctx context.Context, uin uint32) (bool, time.Duration, string, error) {
	pipe := s.rdb.Pipeline()
	v := pipe.Get(ctx, s.banKey(uin))
	ttl := pipe.PTTL(ctx, s.banKey(uin))
	if _, err := pipe.Exec(ctx); errors.Is(err, redis.Nil) {
		return false, 0, "", nil
	} else if err != nil {
		return false, 0, "", err
	}
	_, reason, _ := strings.Cut(v.Val(), "|")
	return true, ttl.Val(), reason, nil
}

// Exists reports whether uin holds a live account.
func (s *Store) Exists(ctx context.Context, uin uint32) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.key(uin)).Result()
	return n == 1, err
}

// ExistMany reports, per uin, whether an account is on it, in pipelines
// of 10,000.
func (s *Store) ExistMany(ctx context.Context, uins []uint32) ([]bool, error) {
	out := make([]bool, 0, len(uins))
	for lo := 0; lo < len(uins); lo += 10_000 {
		chunk := uins[lo:min(lo+10_000, len(uins))]
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.IntCmd, len(chunk))
		for i, u := range chunk {
			cmds[i] = pipe.Exists(ctx, s.key(u))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, err
		}
		for _, c := range cmds {
			out = append(out, c.Val() == 1)
		}
	}
	return out, nil
}

// UinOf returns the uin an account name is on, if any.
func (s *Store) UinOf(ctx context.Context, username string) (uint32, bool, error) {
	v, err := s.rdb.Get(ctx, s.unameKey(username)).Uint64()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	return uint32(v), err == nil, err
}

// Delete removes the account on uin and its username mapping (if it still
// points at uin); deleting what is gone is not an error.
func (s *Store) Delete(ctx context.Context, uin uint32, username string) error {
	k := s.key(uin)
	pipe := s.rdb.TxPipeline()
	pipe.Del(ctx, k, k+":friends", k+":moments")
	if username != "" {
		unmap.Eval(ctx, pipe, []string{s.unameKey(username)}, strconv.FormatUint(uint64(uin), 10))
	}
	_, err := pipe.Exec(ctx)
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	return err
}

// Backup converts an account to its backup: friends become usernames (a
// friend whose account is gone is dropped).
func (s *Store) Backup(ctx context.Context, a Account) (*pb.AccountBackup, error) {
	b := &pb.AccountBackup{Username: a.Username, OldUin: uint64(a.Uin), Profile: a.Profile, Moments: a.Moments}
	if len(a.Friends) == 0 {
		return b, nil
	}
	pipe := s.rdb.Pipeline()
	names := make([]*redis.StringCmd, len(a.Friends))
	for i, f := range a.Friends {
		names[i] = pipe.HGet(ctx, s.key(f), "username")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	for _, n := range names {
		if n.Val() != "" {
			b.Friends = append(b.Friends, n.Val())
		}
	}
	return b, nil
}

// FromBackup rebuilds an account on uin from a backup: friends by username
// go back to their current uins.
func (s *Store) FromBackup(ctx context.Context, b *pb.AccountBackup, uin uint32) (Account, error) {
	a := Account{Uin: uin, Username: b.Username, Profile: b.Profile, Moments: b.Moments}
	for _, name := range b.Friends {
		u, ok, err := s.UinOf(ctx, name)
		if err != nil {
			return Account{}, err
		}
		if ok {
			a.Friends = append(a.Friends, u)
		}
	}
	return a, nil
}
