package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"

	"surge/schemas"
	"surge/streams"
)

// registryTopic is the registry entry of topic: its own, or that of the
// registry name it ends with behind a namespace ("loadtest.push.jobs").
func registryTopic(topic string) (schemas.Topic, error) {
	if tp, err := schemas.TopicByName(topic); err == nil {
		return tp, nil
	}
	for _, tp := range schemas.Topics {
		if strings.HasSuffix(topic, "."+tp.Name) {
			return tp, nil
		}
	}
	return schemas.TopicByName(topic) // its error names the registry
}

func cmdProduce(ctx context.Context, args []string) error {
	var topic, body, key string
	var keyUin uint32
	v, _, err := loadConfig("produce", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&topic, "topic", "", "registry topic, or one behind a namespace (ns.push.jobs)")
		fs.StringVar(&body, "json", "", "the record in protobuf JSON form; without it, records are read from stdin, one JSON per line: the message, or {\"key\": HEX, \"key_uin\": N, \"value\": {message}} as 'surge consume' prints them")
		fs.StringVar(&key, "key", "", "record key (stdin lines without their own key too)")
		fs.Uint32Var(&keyUin, "key-uin", 0, "record key: this uin as 4 bytes big-endian (the key of every uin-keyed topic, so related topics stay co-partitioned)")
	})
	if err != nil {
		return err
	}
	if keyUin != 0 {
		if key != "" {
			return fmt.Errorf("give --key or --key-uin, not both")
		}
		key = string(schemas.UinKey(keyUin))
	}
	tp, err := registryTopic(topic)
	if err != nil {
		return err
	}
	s, ok := schemas.Lookup(tp.Schema)
	if !ok {
		return fmt.Errorf("topic %s carries no fixed schema", topic)
	}
	if body == "" {
		cl, err := newClient(ctx, v)
		if err != nil {
			return err
		}
		defer cl.Close()
		return produceLines(ctx, cl, topic, []byte(key), s, os.Stdin, os.Stdout, os.Stderr)
	}
	msg := s.New()
	if err := protojson.Unmarshal([]byte(body), msg); err != nil {
		return fmt.Errorf("--json is not a valid %s: %w", s.Name, err)
	}
	rec, err := streams.NewRecord(topic, []byte(key), msg)
	if err != nil {
		return err
	}
	r, err := produceOne(ctx, v, rec)
	if err != nil {
		return err
	}
	fmt.Printf("produced %s/%d@%d\n", r.Topic, r.Partition, r.Offset)
	return nil
}

// lineEnvelope is a stdin line with its own key, as 'surge consume'
// prints records (the other fields it prints are ignored).
type lineEnvelope struct {
	Key    *string         `json:"key"` // hex
	KeyUin *uint32         `json:"key_uin"`
	Value  json.RawMessage `json:"value"`
}

// parseLine is the record of one stdin line.
func parseLine(line []byte, topic string, key []byte, s schemas.Schema) (*kgo.Record, error) {
	value, recKey := line, key
	var env lineEnvelope
	if json.Unmarshal(line, &env) == nil && bytes.HasPrefix(bytes.TrimSpace(env.Value), []byte("{")) {
		value = env.Value
		switch {
		case env.Key != nil && env.KeyUin != nil:
			return nil, errors.New(`give "key" or "key_uin", not both`)
		case env.Key != nil:
			k, err := hex.DecodeString(*env.Key)
			if err != nil {
				return nil, fmt.Errorf(`"key" is not hex: %w`, err)
			}
			recKey = k
		case env.KeyUin != nil:
			recKey = schemas.UinKey(*env.KeyUin)
		}
	}
	msg := s.New()
	if err := protojson.Unmarshal(value, msg); err != nil {
		return nil, fmt.Errorf("not a valid %s: %w", s.Name, err)
	}
	return streams.NewRecord(topic, recKey, msg)
}

// produceLines produces a record per line of in, in order per partition,
// many in flight. It stops at the first line that is not a record, after
// what was read before it has landed, and says how many did: the rest can
// be sent again from that line. Progress goes to errw every second.
func produceLines(ctx context.Context, cl *kgo.Client, topic string, key []byte, s schemas.Schema, in io.Reader, out, errw io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var (
		mu      sync.Mutex
		failed  error
		landed  int
		started = time.Now()
		shown   = started
	)
	done := func(_ *kgo.Record, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil && failed == nil {
			failed = err
		}
		if err == nil {
			landed++
		}
	}
	n, lineNo, progress := 0, 0, false
	var bad error
	for sc.Scan() {
		lineNo++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		rec, err := parseLine(line, topic, key, s)
		if err != nil {
			bad = fmt.Errorf("line %d: %w", lineNo, err)
			break
		}
		n++
		cl.Produce(ctx, rec, done)
		mu.Lock()
		stop := failed != nil
		if time.Since(shown) >= time.Second {
			shown, progress = time.Now(), true
			fmt.Fprintf(errw, "\rproduced %d records (%.0f/s)", landed, float64(landed)/time.Since(started).Seconds())
		}
		mu.Unlock()
		if stop {
			break
		}
	}
	if err := sc.Err(); err != nil && bad == nil {
		bad = fmt.Errorf("line %d: %w", lineNo+1, err)
		lineNo++
	}
	flushErr := cl.Flush(ctx)
	mu.Lock()
	defer mu.Unlock()
	took := time.Since(started)
	if progress {
		fmt.Fprintln(errw)
	}
	fmt.Fprintf(out, "produced %d of %d records to %s in %v (%.0f/s)\n", landed, n, topic, took.Round(time.Millisecond), float64(landed)/max(took.Seconds(), 1e-9))
	switch {
	case failed != nil:
		return fmt.Errorf("produce to %s: %w (%d records landed; records are in order per partition, so resend from the first line whose partition failed)", topic, failed, landed)
	case flushErr != nil:
		return fmt.Errorf("produce to %s: %w", topic, flushErr)
	case bad != nil:
		return fmt.Errorf("%w: stopped there; the %d records before it were produced (resend from line %d)", bad, landed, lineNo)
	}
	return nil
}

// recordJSON renders a record with its decoded value.
func recordJSON(r *kgo.Record) map[string]any {
	out := map[string]any{"topic": r.Topic, "partition": r.Partition, "offset": r.Offset,
		"timestamp": r.Timestamp.UTC().Format(time.RFC3339Nano), "key": fmt.Sprintf("%x", r.Key)}
	hdrs := map[string]string{}
	for _, h := range r.Headers {
		hdrs[h.Key] = string(h.Value)
	}
	out["headers"] = hdrs
	if s, ok := schemas.Lookup(hdrs[schemas.HeaderSchema]); ok {
		m := s.New()
		if err := streams.Decode(r, m); err == nil {
			b, _ := protojson.Marshal(m)
			out["value"] = json.RawMessage(b)
			return out
		} else {
			out["decode_error"] = err.Error()
		}
	}
	out["value_hex"] = fmt.Sprintf("%x", r.Value)
	return out
}

func cmdConsume(ctx context.Context, args []string) error {
	var topic, key, since string
	var maxN int
	var partition int32
	var offset int64
	var keyUin uint32
	var follow, fromEnd bool
	v, _, err := loadConfig("consume", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&topic, "topic", "", "topic to print")
		fs.IntVar(&maxN, "max", 0, "stop after N records (0 = all currently in the topic, or with --follow until interrupted)")
		fs.BoolVar(&follow, "follow", false, "keep printing records as they are published, until interrupted (Ctrl-C)")
		fs.BoolVar(&fromEnd, "from-end", false, "with --follow: only records published from now on")
		fs.Int32Var(&partition, "partition", -1, "only this partition (-1: all)")
		fs.Int64Var(&offset, "offset", 0, "start at this offset in each partition read (0: the earliest retained)")
		fs.StringVar(&since, "since", "", "start at the first record at or after this RFC 3339 time")
		fs.StringVar(&key, "key", "", "only records with this key")
		fs.Uint32Var(&keyUin, "key-uin", 0, "only records keyed by this uin (4 bytes big-endian)")
	})
	if err != nil {
		return err
	}
	from := streams.ReplayFrom{Offset: offset}
	switch {
	case fromEnd && !follow:
		return errors.New("--from-end prints records published from now on: give --follow too")
	case fromEnd && (offset != 0 || since != ""):
		return errors.New("give one start: --from-end, --offset or --since")
	case offset != 0 && since != "":
		return errors.New("give one start: --offset or --since")
	case key != "" && keyUin != 0:
		return errors.New("give --key or --key-uin, not both")
	case since != "":
		if from.Time, err = time.Parse(time.RFC3339, since); err != nil {
			return fmt.Errorf("--since: %w", err)
		}
	}
	if keyUin != 0 {
		key = string(schemas.UinKey(keyUin))
	}
	bs, err := needKafka(ctx, v)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	n := 0
	stopAt := errors.New("max reached")
	print := func(r *kgo.Record) error {
		if partition >= 0 && r.Partition != partition || key != "" && string(r.Key) != key {
			return nil
		}
		if err := enc.Encode(recordJSON(r)); err != nil {
			return err
		}
		if n++; maxN > 0 && n >= maxN {
			return stopAt
		}
		return nil
	}
	if follow {
		start := kgo.NewOffset().At(offset)
		switch {
		case fromEnd:
			start = kgo.NewOffset().AtEnd()
		case !from.Time.IsZero():
			start = kgo.NewOffset().AfterMilli(from.Time.UnixMilli())
		case offset == 0:
			start = kgo.NewOffset().AtStart()
		}
		err = followTopic(ctx, bs, topic, partition, start, print)
	} else {
		err = streams.Replay(ctx, bs, topic, from, print)
	}
	if err == stopAt || follow && ctx.Err() != nil {
		return nil
	}
	return err
}

// followTopic calls fn with each committed record of topic (of one
// partition when partition >= 0) from start, until ctx ends or fn fails.
func followTopic(ctx context.Context, bs streams.Cluster, topic string, partition int32, start kgo.Offset, fn func(*kgo.Record) error) error {
	consume := kgo.ConsumeTopics(topic)
	if partition >= 0 {
		consume = kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: start}})
	}
	cl, err := bs.NewClient(consume, kgo.ConsumeResetOffset(start), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for _, e := range fs.Errors() {
			if !errors.Is(e.Err, context.Canceled) {
				return fmt.Errorf("consume %s/%d: %w", e.Topic, e.Partition, e.Err)
			}
		}
		var ferr error
		fs.EachRecord(func(r *kgo.Record) {
			if ferr == nil {
				ferr = fn(r)
			}
		})
		if ferr != nil {
			return ferr
		}
	}
}
