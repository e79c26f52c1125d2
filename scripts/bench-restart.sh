#!/usr/bin/env bash
# Restart after kill -9, with default settings: every long-running surge
# service of docker-compose.yml runs as the image's user against the real
# broker and redis-server (TestComposeServicesStartAsTheImageUser); each is
# killed with -9 in turn and started again at once, as a restart policy
# does, and timed until it is ready again (/readyz: joined its groups) and,
# for the wallet and the uin pool, until their APIs answer a read.
# RUNS times over. Writes bench/restart.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
runs="${RUNS:-3}"
out=bench/restart.txt
scripts/kafka.sh start >/dev/null
scripts/redis.sh start >/dev/null
export SURGE_TEST_KAFKA="127.0.0.1:${KAFKA_PORT:-19092}" SURGE_TEST_REDIS="127.0.0.1:${REDIS_PORT:-16379}"
cmd="go test -count=1 -run ^TestComposeServicesStartAsTheImageUser\$ ./cmd/surge"
{
  echo "# restart after kill -9 of each compose service with default settings (static membership under its instance id)"
  echo "# made by: scripts/bench-restart.sh (RUNS=$runs) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo "# seconds from the kill to ready again (surge probe) and to the first answered read"
  echo "\$ SURGE_BENCH_OUT=<file> $cmd"
  for i in $(seq 1 "$runs"); do
    tmp=$(mktemp)
    SURGE_BENCH_OUT="$tmp" $cmd >/dev/null
    echo "## run $i"
    cat "$tmp"
    rm -f "$tmp"
  done
} 2>&1 | tee "$out"
