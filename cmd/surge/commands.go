package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/cmd/surge/topology"
	push "surge/processors/push/app"
	uinapp "surge/processors/uin/app"
	"surge/schemas"
	"surge/sinks/clickhouse"
	"surge/streams"
	"surge/streams/connect"
)

// newClient connects a plain client to the configured cluster.
func newClient(ctx context.Context, v *viper.Viper) (*kgo.Client, error) {
	kc, err := needKafka(ctx, v)
	if err != nil {
		return nil, err
	}
	return kc.NewClient()
}

func cmdRun(ctx context.Context, args []string) error {
	v, fs, err := loadConfig("run", args, nil)
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("run takes one component name: %v", components)
	}
	name := fs.Arg(0)
	if !slices.Contains(components, name) {
		return fmt.Errorf("unknown component %q (have %v)", name, components)
	}
	if name == "wallet" { // the API with the ledger whose reads it serves
		return serveWallet(ctx, v, true)
	}
	log := newLogger(v)
	bs, err := needKafka(ctx, v)
	if err != nil {
		return err
	}
	release, err := claimInstanceID(v, name, log)
	if err != nil {
		return err
	}
	defer release()
	opts, err := runnerOptions(v, log)
	if err != nil {
		return err
	}
	if err := serveMetrics(ctx, v, log); err != nil {
		return err
	}
	if c, ok := pushServices[name]; ok {
		return runPush(ctx, v, log, bs, c)
	}
	if c, ok := uinServices[name]; ok {
		return runUin(ctx, v, log, bs, c)
	}
	if name == "wallet-identities" {
		return runWalletIdentities(ctx, v, log, bs, opts)
	}
	var mirrorRedis redis.UniversalClient // no mirror without redis.addr
	if v.GetString("redis.addr") != "" {
		if mirrorRedis, err = redisAt(v, connect.List(v.GetString, "redis.addr")...); err != nil {
			return err
		}
		defer mirrorRedis.Close()
	}
	mirror, err := openMirror(ctx, mirrorRedis, v.GetString("redis.prefix"), log)
	if err != nil {
		return err
	}
	var st clickhouse.Store
	if strings.HasPrefix(name, "sink-") {
		if st, err = openStore(ctx, v, log); err != nil {
			return err
		}
		defer st.Close()
		opts = append(opts, streams.MaxBatch(v.GetInt("sink.max_batch")))
	}
	p, err := startPipeline(ctx, log, bs, st, mirror, []string{name}, v.GetInt("sink.tasks"), map[string][]streams.Option{name: opts})
	if err != nil {
		return err
	}
	return p.wait()
}

func cmdTopics(ctx context.Context, args []string) error {
	var create, graph bool
	var format string
	v, _, err := loadConfig("topics", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&create, "create", false, "create every registry topic that does not exist")
		fs.BoolVar(&graph, "graph", false, "print who produces and who consumes each topic (every processor's declared spec)")
		fs.StringVar(&format, "format", "text", "with --graph: text, mermaid or dot")
	})
	if err != nil {
		return err
	}
	if graph {
		uses := topology.Describe()
		switch format {
		case "text":
			return streams.WriteText(os.Stdout, uses)
		case "mermaid":
			return streams.WriteMermaid(os.Stdout, topology.All(), uses)
		case "dot":
			return streams.WriteDOT(os.Stdout, topology.All(), uses)
		}
		return fmt.Errorf("topics --graph: unknown --format %q (text, mermaid or dot)", format)
	}
	if !create {
		fmt.Printf("%-22s %-26s %-5s %-12s %s\n", "TOPIC", "SCHEMA", "PARTS", "RETENTION", "KEY")
		for _, t := range schemas.Topics {
			ret := "compacted"
			if !t.Compacted {
				ret = fmt.Sprintf("%dd", int(t.Retention.Hours()/24))
			}
			sch := t.Schema
			if sch == "" {
				sch = "(any, dead letters)"
			}
			fmt.Printf("%-22s %-26s %-5d %-12s %s\n", t.Name, sch, t.Partitions, ret, t.Key)
		}
		return nil
	}
	cl, err := newClient(ctx, v)
	if err != nil {
		return err
	}
	defer cl.Close()
	topics := schemas.Topics
	pns, uns := v.GetString("push.namespace"), v.GetString("uin.namespace")
	if pns != "" || uns != "" {
		// Namespaced stacks (shadow. for load tests): each system's topics
		// under its namespace.
		topics = nil
		seen := map[string]bool{}
		for _, t := range append(push.Topics(pns), uinapp.Topics(uns)...) {
			if !seen[t.Name] {
				seen[t.Name] = true
				topics = append(topics, t)
			}
		}
	}
	if err := streams.EnsureTopics(ctx, cl, replication(v), topics...); err != nil {
		return err
	}
	fmt.Printf("%d topics ensured\n", len(topics))
	return nil
}

func cmdReplay(ctx context.Context, args []string) error {
	var topic, into, since string
	var offset int64
	v, _, err := loadConfig("replay", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&topic, "topic", "", "topic to re-read")
		fs.Int64Var(&offset, "offset", 0, "start offset in every partition (0 = earliest retained)")
		fs.StringVar(&since, "since", "", "start at the first record at or after this RFC 3339 time")
		fs.StringVar(&into, "into", "", "produce the records to this topic (empty: print them)")
	})
	if err != nil {
		return err
	}
	bs, err := needKafka(ctx, v)
	if err != nil {
		return err
	}
	from := streams.ReplayFrom{Offset: offset}
	if since != "" {
		if from.Time, err = time.Parse(time.RFC3339, since); err != nil {
			return fmt.Errorf("--since: %w", err)
		}
	}
	var cl *kgo.Client
	if into != "" {
		if cl, err = bs.NewClient(); err != nil {
			return err
		}
		defer cl.Close()
	}
	enc := json.NewEncoder(os.Stdout)
	n := 0
	start := time.Now()
	var produceErr atomic.Pointer[error] // the first record that did not land
	failed := func(_ *kgo.Record, err error) {
		if err != nil {
			produceErr.CompareAndSwap(nil, &err)
		}
	}
	err = streams.Replay(ctx, bs, topic, from, func(r *kgo.Record) error {
		n++
		if n%100000 == 0 {
			fmt.Fprintf(os.Stderr, "\rreplayed %d records (%.0f/s)", n, float64(n)/time.Since(start).Seconds())
		}
		if cl == nil {
			return enc.Encode(recordJSON(r))
		}
		if e := produceErr.Load(); e != nil {
			return fmt.Errorf("replay into %s: %w", into, *e)
		}
		cl.Produce(ctx, &kgo.Record{Topic: into, Key: r.Key, Value: r.Value, Headers: r.Headers}, failed)
		return nil
	})
	if cl != nil {
		if ferr := cl.Flush(ctx); err == nil {
			err = ferr
		}
		if e := produceErr.Load(); err == nil && e != nil {
			err = fmt.Errorf("replay into %s: %w", into, *e)
		}
	}
	fmt.Fprintf(os.Stderr, "\rreplayed %d records from %s in %v\n", n, topic, time.Since(start).Round(time.Millisecond))
	return err
}
