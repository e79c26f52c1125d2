#!/usr/bin/env bash
# The uin-pool allocation API from one client process: allocations per
# second and latency per call, with plain HTTP calls and through
# allocation.Client (-client: one uin per Allocate, concurrent callers
# served together), against redis-server, the client, the
# service and Redis sharing this machine's cores; every allocation is
# journaled on uin.pool (the real broker) before it is answered. Writes
# bench/alloc.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/redis.sh start >/dev/null
scripts/kafka.sh start >/dev/null
redis="127.0.0.1:${REDIS_PORT:-16379}"
brokers="127.0.0.1:${KAFKA_PORT:-19092}"
out=bench/alloc.txt
{
  echo "# uin-pool allocation API: one client, POST /v1/uins (plain, or through allocation.Client with -client), on redis-server, journaled on uin.pool on the real broker"
  echo "# made by: scripts/bench-alloc.sh on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  for args in "-conns 8 -count 1" "-conns 16 -count 1" "-conns 32 -count 1" "-conns 32 -count 1 -h2c" "-conns 8 -count 10" \
    "-conns 16 -client" "-conns 32 -client" "-conns 32 -client" "-conns 32 -client" "-conns 32 -client -inflight 4" "-conns 64 -client" \
    "-conns 32 -client -local 4000" "-conns 32 -client -local 4000"; do
    echo
    echo "\$ go run ./bench/alloc -redis $redis -brokers $brokers -for 5s $args"
    go run ./bench/alloc -redis "$redis" -brokers "$brokers" -for 5s $args 2>/dev/null
  done
} | tee "$out"
