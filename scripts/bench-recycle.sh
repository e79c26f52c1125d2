#!/usr/bin/env bash
# Uin recycling: the whole stock pipeline on N synthetic accounts (produce,
# sink into chDB, classify, recycle through every step into the pool),
# against redis-server, on kfake and (if running) the real broker.
# Writes bench/recycle.txt.
set -euo pipefail
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-tags=chdb" # chDB, the embedded ClickHouse, is opt-in
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/redis.sh start >/dev/null
CHDB_LIB_PATH="$(scripts/chdb.sh)"
export CHDB_LIB_PATH
accounts="${ACCOUNTS:-1000000}"
redis="127.0.0.1:${REDIS_PORT:-16379}"
out=bench/recycle.txt
{
  echo "# uin recycling: $accounts synthetic accounts through produce, sink, classify, recycle (time and memory)"
  echo "# made by: scripts/bench-recycle.sh (ACCOUNTS=$accounts) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo
  echo "\$ go run ./bench/recycle -accounts $accounts -redis $redis"
  go run ./bench/recycle -accounts "$accounts" -redis "$redis" 2>/dev/null
  if [ -n "${KAFKA:-}" ]; then
    echo
    echo "\$ go run ./bench/recycle -accounts $accounts -redis $redis -brokers $KAFKA"
    go run ./bench/recycle -accounts "$accounts" -redis "$redis" -brokers "$KAFKA" 2>/dev/null
  fi
} | tee "$out"
