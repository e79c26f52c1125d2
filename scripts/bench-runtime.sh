#!/usr/bin/env bash
# Runtime throughput vs bare franz-go, on kfake and on the real broker.
# Writes bench/runtime.txt (the commands, the machine, the figures).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
records="${RECORDS:-1000000}"
out=bench/runtime.txt
scripts/kafka.sh start >/dev/null
{
  echo "# streams runtime throughput: consume, copy, produce, commit"
  echo "# made by: scripts/bench-runtime.sh (RECORDS=$records) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo
  echo "\$ go run ./bench/runtime -records $records"
  go run ./bench/runtime -records "$records"
  echo
  echo "\$ go run ./bench/runtime -records $records -brokers 127.0.0.1:${KAFKA_PORT:-19092}"
  go run ./bench/runtime -records "$records" -brokers "127.0.0.1:${KAFKA_PORT:-19092}"
} | tee "$out"
