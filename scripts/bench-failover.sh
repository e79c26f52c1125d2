#!/usr/bin/env bash
# Fail-over of the push's exactly-once services after kill -9 under load,
# on default settings and the real broker: the active planner, then an
# executor, each once restarted at once and once left dead, while a
# real-time job is published every 200 ms (TestFailoverBench). Every job
# must complete exactly once and no user get a job twice. RUNS times over.
# Writes bench/failover.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
runs="${RUNS:-3}"
out=bench/failover.txt
scripts/kafka.sh start >/dev/null
export SURGE_TEST_KAFKA="127.0.0.1:${KAFKA_PORT:-19092}"
cmd="go test -count=1 -timeout 30m -run ^TestFailoverBench\$ ./cmd/surge"
{
  echo "# fail-over after kill -9 under load (a real-time job every 200 ms), default settings, real broker"
  echo "# made by: scripts/bench-failover.sh (RUNS=$runs) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo "# first done: kill to the first completion of a job published after it; worst latency: publish to"
  echo "# COMPLETED of any job published from 1 s before the kill; all back: kill to the last completion of"
  echo "# a job that took over 1 s. Every job completed exactly once, no user got a job twice (asserted)."
  echo "\$ SURGE_BENCH_OUT=<file> $cmd"
  for i in $(seq 1 "$runs"); do
    tmp=$(mktemp)
    SURGE_BENCH_OUT="$tmp" $cmd >/dev/null
    echo "## run $i"
    cat "$tmp"
    rm -f "$tmp"
  done
} 2>&1 | tee "$out"
