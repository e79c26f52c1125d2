#!/usr/bin/env bash
# Mass-push figures: the filter chain per core, a 10M-user job end to end on
# kfake and on the real broker, online-bitmap memory. Writes bench/push.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
users="${USERS:-10000000}"
out=bench/push.txt
scripts/kafka.sh start >/dev/null
{
  echo "# mass push: filter chain, end-to-end job, online-bitmap memory"
  echo "# made by: scripts/bench-push.sh (USERS=$users) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo
  echo "\$ GOMAXPROCS=1 go test -run xxx -bench Chain -benchtime 10x ./processors/push/filter/"
  GOMAXPROCS=1 go test -run xxx -bench Chain -benchtime 10x ./processors/push/filter/ | grep -E '^Benchmark'
  echo
  echo "\$ go run ./bench/push -users $users"
  go run ./bench/push -users "$users"
  echo
  echo "\$ go run ./bench/push -users $users -brokers 127.0.0.1:${KAFKA_PORT:-19092}"
  go run ./bench/push -users "$users" -brokers "127.0.0.1:${KAFKA_PORT:-19092}"
  echo
  echo "# what bounds each figure: bench/push-notes.md"
} | tee "$out"
