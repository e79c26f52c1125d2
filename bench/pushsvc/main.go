// Command pushsvc measures mass push as deployed: the push services run as
// separate OS processes (`surge run push-presence|push-planner|
// push-executor ×2|push-offline`) on a broker, fed only through topics.
// It times a job of N users from its submission to the first delivery and
// to COMPLETED, with the executors' CPU time; then a second job during
// which one executor is killed with -9 and restarted: the recovery time
// (kill to the restarted executor's first report) and the job's total, and
// checks nobody was delivered twice.
//
//	go run ./bench/pushsvc -brokers 127.0.0.1:19092 -users 10000000
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/bench/internal/proccpu"
	push "surge/processors/push/app"
	"surge/processors/push/directory"
	"surge/processors/push/numpkg"
	"surge/processors/push/recovery"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

type proc struct {
	name string
	args []string
	env  []string
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  strings.Builder
}

func (p *proc) start(bin string) {
	p.cmd = exec.Command(bin, append([]string{"run"}, p.args...)...)
	p.cmd.Env = append(os.Environ(), p.env...)
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	must(p.cmd.Start())
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
	}()
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// cpu is the process's user+system CPU time so far.
func (p *proc) cpu() time.Duration {
	c, _ := proccpu.Of(p.cmd.Process.Pid)
	return c
}

func main() {
	brokersFlag := flag.String("brokers", "127.0.0.1:19092", "the broker the services run on")
	users := flag.Int("users", 10_000_000, "targets of each job (uins 1..users)")
	onlineShare := flag.Float64("online", 0.8, "share of targets online")
	flag.Parse()
	kc := streams.Seeds(strings.Split(*brokersFlag, ",")...)
	ctx := context.Background()
	ns := fmt.Sprintf("psvc%d.", time.Now().UnixNano())
	dir, err := os.MkdirTemp("", "pushsvc-")
	must(err)
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "surge")
	out, err := exec.Command("go", "build", "-o", bin, "./cmd/surge").CombinedOutput()
	if err != nil {
		must(fmt.Errorf("go build: %v\n%s", err, out))
	}
	cl, err := kc.NewClient(kgo.ProducerLinger(5*time.Millisecond),
		kgo.MaxBufferedRecords(1<<20), kgo.ProducerBatchMaxBytes(1<<20))
	must(err)
	defer cl.Close()
	must(streams.EnsureTopics(ctx, cl, streams.OneCopy, push.Topics(ns)...))
	fmt.Printf("broker %s; %d cores, %s; %d users, %.0f%% online; services as OS processes\n",
		*brokersFlag, runtime.NumCPU(), runtime.Version(), *users, 100**onlineShare)

	env := []string{"SURGE_KAFKA_BROKERS=" + *brokersFlag, "SURGE_PUSH_NAMESPACE=" + ns, "SURGE_LOG_LEVEL=info", "SURGE_METRICS_ADDR="}
	svc := func(name, component string, extra ...string) *proc {
		p := &proc{name: name, env: env, args: append([]string{component, "--processor.instance_id=" + name,
			"--push.dir=" + filepath.Join(dir, name)}, extra...)}
		p.start(bin)
		return p
	}

	// Logins: the online users, through presence.
	t0 := time.Now()
	pres := svc("presence", "push-presence")
	online := int(float64(*users) * *onlineShare)
	for u := 1; u <= online; u++ {
		r, err := streams.NewRecord(ns+schemas.TopicLogin, schemas.UinKey(uint32(u)), &pb.LoginEvent{Uin: uint64(u), Online: true})
		must(err)
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) { must(err) })
	}
	must(cl.Flush(ctx))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	must(streams.WaitConsumed(wctx, kc, ns+"presence", ns+schemas.TopicLogin))
	cancel()
	fmt.Printf("setup: %d logins through push-presence in %s\n", online, time.Since(t0).Round(time.Millisecond))

	execs := []*proc{svc("exec-a", "push-executor", "--push.executor_name=ea"), svc("exec-b", "push-executor", "--push.executor_name=eb")}
	planner := svc("planner", "push-planner")
	offline := svc("offline", "push-offline")
	defer func() {
		for _, p := range append(execs, pres, planner, offline) {
			p.kill()
		}
	}()
	must(cl.ProduceSync(ctx, directory.AccountRecord(ns, &pb.AccountInfo{AccountId: 1, Filters: proto.Uint32(0)})).FirstErr())
	wctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
	must(streams.WaitConsumed(wctx, kc, push.PlannerGroup(ns), ns+schemas.TopicAccounts))
	cancel()
	for _, x := range execs {
		waitLog(x, "online bitmap loaded")
		x.mu.Lock()
		for _, l := range strings.Split(x.log.String(), "\n") {
			if strings.Contains(l, "online bitmap loaded") {
				fmt.Println("  " + x.name + ": " + l[strings.Index(l, "msg="):])
			}
		}
		x.mu.Unlock()
	}

	pkg := roaring.New()
	pkg.AddRange(1, uint64(*users)+1)
	data, err := numpkg.Encode(pkg)
	must(err)
	job := func(id string, onFirst func()) (first, done time.Duration, cpu time.Duration) {
		before := execs[0].cpu() + execs[1].cpu()
		seen := reportsFrom(ctx, kc, ns)
		start := time.Now()
		rec, err := streams.NewRecord(ns+schemas.TopicJobs, []byte(id), &pb.SendJob{JobId: id, AccountId: 1,
			Source: pb.TargetSource_PACKAGE, ContentId: id, ContentCrc: uint32(len(id)), InlinePackage: data})
		must(err)
		must(cl.ProduceSync(ctx, rec).FirstErr())
		waitFirstDelivery(seen, id)
		first = time.Since(start)
		if onFirst != nil {
			onFirst()
		}
		waitCompleted(ctx, kc, ns, id)
		done = time.Since(start)
		return first, done, execs[0].cpu() + execs[1].cpu() - before
	}
	first, done, cpu := job("bench-1", nil)
	fmt.Printf("job 1, %d users over 2 executor processes: first delivery %s, COMPLETED %s; executors' CPU %s (%.2f s per 10M users)\n",
		*users, first.Round(time.Millisecond), done.Round(time.Millisecond), cpu.Round(time.Millisecond), cpu.Seconds()*1e7/float64(*users))
	check(ctx, kc, ns, "bench-1", online)

	var recovered time.Duration
	first, done, _ = job("bench-22", func() {
		kill := time.Now()
		loaded := countLog(execs[0], "executor: online bitmap loaded")
		execs[0].kill()
		execs[0].start(bin)
		for countLog(execs[0], "executor: online bitmap loaded") == loaded {
			time.Sleep(5 * time.Millisecond)
		}
		recovered = time.Since(kill)
	})
	fmt.Printf("job 2, executor ea killed -9 at the first delivery and restarted: first delivery %s; ea serving again %s after the kill; COMPLETED %s after submission\n",
		first.Round(time.Millisecond), recovered.Round(time.Millisecond), done.Round(time.Millisecond))
	check(ctx, kc, ns, "bench-22", online)
}

// reportsFrom streams push.reports from now on.
func reportsFrom(ctx context.Context, kc streams.Cluster, ns string) <-chan *pb.DeliveryReport {
	c, err := kc.NewClient(kgo.ConsumeTopics(ns+schemas.TopicReports),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	must(err)
	// Make sure the consumer has its end offsets before the caller acts.
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	c.PollRecords(pctx, 1)
	cancel()
	out := make(chan *pb.DeliveryReport, 1<<16)
	go func() {
		defer c.Close()
		for {
			f := c.PollFetches(ctx)
			f.EachRecord(func(r *kgo.Record) {
				var rep pb.DeliveryReport
				if streams.Decode(r, &rep) == nil {
					select {
					case out <- &rep:
					default:
					}
				}
			})
		}
	}()
	return out
}

func waitFirstDelivery(c <-chan *pb.DeliveryReport, id string) {
	for r := range c {
		if r.JobId == id && r.Status == pb.DeliveryStatus_DELIVERED {
			return
		}
	}
}

func waitCompleted(ctx context.Context, kc streams.Cluster, ns, id string) {
	c, err := kc.NewClient(kgo.ConsumeTopics(ns+schemas.TopicJobTransitions),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	must(err)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		f := c.PollFetches(pctx)
		cancel()
		done := false
		f.EachRecord(func(r *kgo.Record) {
			var t pb.JobTransition
			if streams.Decode(r, &t) == nil && t.JobId == id && t.To == pb.JobState_COMPLETED {
				done = true
			}
		})
		if done {
			return
		}
	}
	must(fmt.Errorf("job %s not COMPLETED in 10 minutes", id))
}

func check(ctx context.Context, kc streams.Cluster, ns, id string, online int) {
	o, err := recovery.Read(ctx, kc, ns, id)
	must(err)
	fmt.Printf("  check: %d delivered online (want %d), %d delivered twice, %d reports\n",
		o.Delivered.GetCardinality(), online, o.Duplicate, o.Reports)
	if o.Duplicate != 0 || int(o.Delivered.GetCardinality()) != online {
		fmt.Println("FAIL")
		os.Exit(1)
	}
}

func countLog(p *proc, what string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Count(p.log.String(), what)
}

func waitLog(p *proc, what string) {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		ok := strings.Contains(p.log.String(), what)
		p.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	must(fmt.Errorf("%s never logged %q:\n%s", p.name, what, p.log.String()))
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
