package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/auth"
	pb "surge/schemas/surgev1"
)

// The protobuf batch runs' callers are another OS process (this binary
// with -callers), as the activity services are other machines: the
// wallet process's CPU is then measured alone, and the callers' beside it.
// The parent sends a callerJob as a JSON line; the child makes its
// request bodies, says "ready", waits for "go", sends them and answers a
// callerResult as a JSON line.

// callerJob is one run of the callers.
type callerJob struct {
	URL, Path                    string
	Run, Size, N, Callers, Users int
	Key                          *auth.Key // nil: requests unsigned
	CPUs                         string    // taskset -c list the callers' process runs on; "": any
}

// callerResult is what the callers measured.
type callerResult struct {
	Elapsed, P50, P99 time.Duration
	CPU               time.Duration // the callers' process
	Err               string
}

// protoBodies are the run's requests: n grants in GrantBatch bodies of
// size, spread over users, with order numbers of their own.
func protoBodies(run, size, n, users int) [][]byte {
	bodies := make([][]byte, (n+size-1)/size)
	for r := range bodies {
		var b pb.GrantBatch
		for k := r * size; k < min(n, (r+1)*size); k++ {
			act := fmt.Sprintf("h%d", k%users)
			rain := fmt.Sprintf("hp%d-%d", run, k)
			b.Grants = append(b.Grants, &pb.RewardGrant{OrderNo: act + "_rain_" + rain + "_1_1", ActId: act, ActivityId: "spring",
				SceneId: "rain", RainId: rain, AwardType: pb.AwardType_CASH, Stage: 1, Amount: int64(1 + k%100), AppId: "bench"})
		}
		body, err := proto.Marshal(&b)
		must(err)
		bodies[r] = body
	}
	return bodies
}

// runCallers runs job in a callers' process. ready is called once the
// process has made its requests and is about to send them, answered as
// soon as its result arrives: the parent measures between the two.
func runCallers(job callerJob, ready, answered func()) callerResult {
	cmd := exec.Command(os.Args[0], "-callers")
	if job.CPUs != "" { // the callers on other cores than the wallet's
		cmd = exec.Command("taskset", "-c", job.CPUs, os.Args[0], "-callers")
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	must(err)
	stdout, err := cmd.StdoutPipe()
	must(err)
	must(cmd.Start())
	defer func() { _ = cmd.Wait() }()
	must(json.NewEncoder(stdin).Encode(job))
	out := bufio.NewScanner(stdout)
	if !out.Scan() || out.Text() != "ready" {
		return callerResult{Err: fmt.Sprintf("the callers' process did not get ready (%q)", out.Text())}
	}
	ready()
	_, err = io.WriteString(stdin, "go\n")
	must(err)
	var res callerResult
	if !out.Scan() {
		return callerResult{Err: "the callers' process ended without an answer"}
	}
	answered()
	must(json.Unmarshal(out.Bytes(), &res))
	_ = stdin.Close()
	return res
}

// callersMain is the callers' process: it reads one job from stdin and
// writes its result to stdout.
func callersMain() {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	must(err)
	var job callerJob
	must(json.Unmarshal(line, &job))
	bodies := protoBodies(job.Run, job.Size, job.N, job.Users)
	h := &httpBench{hc: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: job.Callers, MaxConnsPerHost: job.Callers}}}
	fmt.Println("ready")
	if _, err := in.ReadString('\n'); err != nil {
		must(err)
	}
	cpu0 := cpuTime()
	var res callerResult
	var mu sync.Mutex // the callers' goroutines report failures
	failed := func(msg string) { mu.Lock(); res.Err = msg; mu.Unlock() }
	lat, el := h.send(job.URL, job.Path, "application/x-protobuf", job.Key, job.Callers, bodies, func(_ int, body []byte) {
		var out pb.GrantResults
		if err := proto.Unmarshal(body, &out); err != nil {
			failed(err.Error())
			return
		}
		for _, g := range out.Results {
			if g.Code != 200 {
				failed(fmt.Sprintf("batch not all granted: %v", g))
			}
		}
	})
	res.Elapsed, res.P50, res.P99, res.CPU = el, pct(lat, 50), pct(lat, 99), cpuTime()-cpu0
	must(json.NewEncoder(os.Stdout).Encode(res))
}
