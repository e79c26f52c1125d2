#!/usr/bin/env bash
# A service under overload, default settings (SERVICE=wallet, the default:
# a real `surge wallet`; SERVICE=uin-pool: a real `surge run uin-pool`
# handing out BATCH uins per call from a pool of SEED) on the real broker
# and redis-server, its capacity measured
# (closed loop), then offered 1x, 2x and 4x of it open loop for PHASE each,
# and 4x again with 10,000 idle and 250 stalled connections held open.
# The load generator shares the machine's cores with the wallet, the
# broker and redis-server. Writes bench/overload.txt (the uin pool's:
# bench/overload-pool.txt). The run leaves its grants' claims (or the
# pool) in Redis (millions of keys): use a scratch redis-server.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
phase="${PHASE:-60s}"
service="${SERVICE:-wallet}"
out=bench/overload.txt
what="wallet under overload: goodput, latency of admitted requests, refusals, RSS, recovery (batches of 100 signed JSON grants)"
extra=""
if [ "$service" = uin-pool ]; then
  out=bench/overload-pool.txt
  what="uin pool under overload: goodput, latency of admitted requests, refusals, RSS, recovery (POST /v1/uins?count=${BATCH:-10})"
  extra="-service uin-pool -batch ${BATCH:-10} -seed ${SEED:-3000000}"
fi
scripts/kafka.sh start >/dev/null
scripts/redis.sh start >/dev/null
cmd="go run ./bench/overload $extra -phase $phase -brokers 127.0.0.1:${KAFKA_PORT:-19092} -redis 127.0.0.1:${REDIS_PORT:-16379}"
{
  echo "# $what"
  echo "# made by: scripts/bench-overload.sh (PHASE=$phase) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo "# columns: offered grants (uins) per second; goodput (grants or uins answered 200 per second); its share of the measured capacity; p50/p99 of"
  echo "# admitted requests; requests refused (503/429) and the p99 of their answer time; client timeouts (10 s); the service's"
  echo "# highest RSS in the phase; how soon after the phase a lone request was answered within twice the 1x p50"
  echo "\$ $cmd"
  $cmd 2>&1 | grep -v ' level='
} 2>&1 | tee "$out"
