// Package classify is the stock classification of seed 003: accounts older
// than the registration checks (90 days) are judged from the analytical
// store (ClickHouse: the uin_registrations and uin_usage sinks). One query
// narrows the whole stock to candidate groups, each with its own strategy
// (category, and so ban and cool-down), and every candidate then passes a
// last check of its online state before a ticket is requested:
//
//	never_completed  registration never finished, no login since      -> abandoned
//	never_logged_in  finished, but no login by either source, and no
//	                 usage within InactiveFor                           -> spam
//	inactive         newest login (auth and device merged) and newest
//	                 usage both older than InactiveFor                  -> inactive
//
// Last login is read from two independent sources, the login service
// (auth) and the device records (device), and merged (the newer wins), so
// one stale source cannot make an active user look inactive. The ticket
// request carries that merged time, and the recycle controller refuses it
// if its own live index (fed by uin.usage directly) knows a newer login:
// the double check happens once here and once again at the ticket.
package classify

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/streams"
)

// Groups.
const (
	GroupNeverCompleted = "never_completed"
	GroupNeverLoggedIn  = "never_logged_in"
	GroupInactive       = "inactive"
)

// Options configures a run.
type Options struct {
	Namespace   string
	MinAge      time.Duration // accounts younger are the registration checks' (default 90 days)
	InactiveFor time.Duration // default 180 days
	Limit       int           // most tickets requested in one run (0: no limit)
	// Batch is the most tickets one record requests (0: recycling.MaxBatch;
	// 1: a record per uin). A record's tickets are of
	// one partition of uin.recycle-requests.
	Batch int
	// Online is the final online check (nil: nobody is online).
	Online   func(ctx context.Context, uin uint32) (bool, error)
	Now      func() time.Time
	Progress func(done, total int)
	Log      *slog.Logger
}

// Report is what a run found and did.
type Report struct {
	Scanned   int            // accounts old enough to classify
	Groups    map[string]int // candidates per group
	Online    int            // candidates skipped because online
	Requested int            // tickets requested
	Took      time.Duration
}

// Candidate is one account a group picked.
type Candidate struct {
	Uin       uint32
	Username  string
	Group     string
	Category  string
	LastLogin int64 // auth and device merged
	// RegisteredAt is the newest registration record's time: the
	// controller refuses the ticket when the uin was recycled after it.
	RegisteredAt int64
}

// Query returns the SQL that picks the candidates.
func Query(now time.Time, minAge, inactiveFor time.Duration) string {
	born := now.Add(-minAge).UnixMilli()
	idle := now.Add(-inactiveFor).UnixMilli()
	// uin_registrations keeps the newest record per uin (ReplacingMergeTree
	// by at_ms); usage is aggregated per uin, one scan. An unfinished
	// registration whose user logged in since is not abandoned (its
	// ticket was stopped by that login before; it is judged as inactive
	// like any other account).
	return fmt.Sprintf(`
SELECT r.uin, r.username,
       multiIf(r.completed = 0 AND greatest(u.auth, u.device) = 0, '%[3]s', greatest(u.auth, u.device) = 0, '%[4]s', '%[5]s') AS grp,
       greatest(u.auth, u.device) AS last_login, r.reg_at
FROM (SELECT uin, argMax(username, at_ms) AS username, argMax(completed, at_ms) AS completed, max(at_ms) AS reg_at
      FROM uin_registrations GROUP BY uin HAVING reg_at < %[1]d) AS r
LEFT JOIN (SELECT uin,
                  maxIf(at_ms, kind = 'login' AND source != 'device') AS auth,
                  maxIf(at_ms, kind = 'login' AND source = 'device') AS device,
                  max(at_ms) AS last_usage
           FROM uin_usage GROUP BY uin) AS u ON u.uin = r.uin
WHERE (r.completed = 0 AND greatest(u.auth, u.device) = 0)
   OR (greatest(u.auth, u.device) < %[2]d AND u.last_usage < %[2]d)
ORDER BY r.uin`, born, idle, GroupNeverCompleted, GroupNeverLoggedIn, GroupInactive)
}

var categoryOf = map[string]string{
	GroupNeverCompleted: recycling.Abandoned,
	GroupNeverLoggedIn:  recycling.Spam,
	GroupInactive:       recycling.Inactive,
}

// Candidates runs the classification query.
func Candidates(ctx context.Context, st clickhouse.Store, o Options) ([]Candidate, int, error) {
	o = o.withDefaults()
	now := o.Now()
	total, err := st.QueryStrings(ctx, fmt.Sprintf("SELECT count() FROM (SELECT uin, max(at_ms) AS reg_at FROM uin_registrations GROUP BY uin HAVING reg_at < %d)",
		now.Add(-o.MinAge).UnixMilli()))
	if err != nil {
		return nil, 0, fmt.Errorf("classify: count: %w", err)
	}
	rows, err := st.QueryStrings(ctx, Query(now, o.MinAge, o.InactiveFor))
	if err != nil {
		return nil, 0, fmt.Errorf("classify: query: %w", err)
	}
	out := make([]Candidate, 0, len(rows))
	for _, r := range rows {
		if len(r) != 5 {
			return nil, 0, fmt.Errorf("classify: unexpected row %q", r)
		}
		uin, err := strconv.ParseUint(r[0], 10, 32)
		if err != nil {
			return nil, 0, fmt.Errorf("classify: uin %q: %w", r[0], err)
		}
		last, _ := strconv.ParseInt(r[3], 10, 64)
		regAt, _ := strconv.ParseInt(r[4], 10, 64)
		out = append(out, Candidate{Uin: uint32(uin), Username: r[1], Group: r[2], Category: categoryOf[r[2]], LastLogin: last, RegisteredAt: regAt})
	}
	n := 0
	if len(total) == 1 && len(total[0]) == 1 {
		n, _ = strconv.Atoi(total[0][0])
	}
	return out, n, nil
}

func (o Options) withDefaults() Options {
	if o.MinAge == 0 {
		o.MinAge = 90 * 24 * time.Hour
	}
	if o.InactiveFor == 0 {
		o.InactiveFor = 180 * 24 * time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o
}

// Run classifies the stock and requests a ticket for every candidate that
// passes the online check, producing to uin.recycle-requests.
func Run(ctx context.Context, st clickhouse.Store, cl *kgo.Client, o Options) (Report, error) {
	o = o.withDefaults()
	start := time.Now()
	cands, scanned, err := Candidates(ctx, st, o)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Scanned: scanned, Groups: map[string]int{}}
	now := o.Now()
	topic := o.Namespace + schemas.TopicRecycleReqs
	partitions := 1 // no candidates: no topic to ask
	if len(cands) > 0 {
		if partitions, err = streams.PartitionCountVia(ctx, cl, topic); err != nil {
			return rep, fmt.Errorf("classify: partitions of %s (create the topics first: surge topics --create): %w", topic, err)
		}
	}
	var (
		mu         sync.Mutex
		produceErr error
		batches    = recycling.NewBatches(partitions, o.Batch)
	)
	// send produces one partition's grants as one record.
	send := func(grants []*pb.RecycleStep) error {
		rec, err := streams.NewRecord(topic, recycling.Key(grants), recycling.Batch(grants))
		if err != nil {
			return err
		}
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			mu.Lock()
			if err != nil && produceErr == nil {
				produceErr = err
			}
			mu.Unlock()
		})
		return nil
	}
	for i, c := range cands {
		rep.Groups[c.Group]++
		if o.Limit > 0 && rep.Requested >= o.Limit {
			continue
		}
		if o.Online != nil {
			on, err := o.Online(ctx, c.Uin)
			if err != nil {
				return rep, fmt.Errorf("classify: online check of %d: %w", c.Uin, err)
			}
			if on {
				rep.Online++
				continue
			}
		}
		if full := batches.Add(recycling.Grant(recycling.Finding{Uin: c.Uin, Category: c.Category, Username: c.Username,
			Reason: "stock group " + c.Group, LastLoginMs: c.LastLogin, RegisteredAtMs: c.RegisteredAt}, now)); full != nil {
			if err := send(full); err != nil {
				return rep, err
			}
		}
		rep.Requested++
		if o.Progress != nil && (i+1)%10000 == 0 {
			o.Progress(i+1, len(cands))
		}
	}
	for _, grants := range batches.Rest() {
		if err := send(grants); err != nil {
			return rep, err
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return rep, err
	}
	if o.Progress != nil {
		o.Progress(len(cands), len(cands))
	}
	rep.Took = time.Since(start)
	o.Log.Info("classify: stock classified", "scanned", rep.Scanned, "groups", rep.Groups, "online", rep.Online,
		"requested", rep.Requested, "took", rep.Took.Round(time.Millisecond))
	return rep, produceErr
}
