#!/usr/bin/env bash
# The wallet's rebuild of its Redis state from the topics at a platform's
# size: GRANTS (10M) grants published to the real broker, then the rebuild
# of the budget and stock counters and the order claims into redis-server,
# timed and checked (bench/rebuild). Writes bench/rebuild.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
grants="${GRANTS:-10000000}"
out=bench/rebuild.txt
scripts/kafka.sh start >/dev/null
scripts/redis.sh start >/dev/null
cmd="go run ./bench/rebuild -grants $grants -brokers 127.0.0.1:${KAFKA_PORT:-19092} -redis 127.0.0.1:${REDIS_PORT:-16379}"
{
  echo "# wallet: rebuild of the budget and stock counters and the order claims from wallet.grants and wallet.tokens (surge rebuild wallet; after a Redis loss)"
  echo "# made by: scripts/bench-rebuild.sh (GRANTS=$grants) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo "\$ $cmd"
  $cmd
} 2>&1 | tee "$out"
