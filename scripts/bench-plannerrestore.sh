#!/usr/bin/env bash
# Push planner restore: full replay of push.job-transitions against its
# newest checkpoint plus the transitions after it, on kfake and on the real
# broker. Writes bench/planner-restore.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
jobs="${JOBS:-20000}"
out=bench/planner-restore.txt
scripts/kafka.sh start >/dev/null
{
  echo "# push planner restore: full replay vs checkpoint + tail"
  echo "# made by: scripts/bench-plannerrestore.sh (JOBS=$jobs) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo
  echo "\$ go run ./bench/plannerrestore -jobs $jobs"
  go run ./bench/plannerrestore -jobs "$jobs"
  echo
  echo "\$ go run ./bench/plannerrestore -jobs $jobs -brokers 127.0.0.1:${KAFKA_PORT:-19092}"
  go run ./bench/plannerrestore -jobs "$jobs" -brokers "127.0.0.1:${KAFKA_PORT:-19092}"
  echo
  echo "\$ go run ./bench/plannerrestore -jobs $((jobs * 5)) -brokers 127.0.0.1:${KAFKA_PORT:-19092}"
  go run ./bench/plannerrestore -jobs "$((jobs * 5))" -brokers "127.0.0.1:${KAFKA_PORT:-19092}"
} | tee "$out"
