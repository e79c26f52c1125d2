#!/usr/bin/env bash
# The rebuild of Redis state from the topics at a platform's size, on the
# real broker and redis-server; writes bench/rebuild.txt:
#   wallet: GRANTS (10M) grants published, then the rebuild of the budget
#           and stock counters and the order claims (bench/rebuild);
#   uin:    UINS (10M) uins pooled and ALLOCATED (2M) of them handed out,
#           journaled on uin.pool, then the pool's rebuild (bench/rebuildpool).
# Each is timed and its result checked against what was published.
# SYSTEMS (default "wallet uin") picks the sections to run again; the
# others are kept from the file as they were made.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
grants="${GRANTS:-10000000}"
uins="${UINS:-10000000}"
allocated="${ALLOCATED:-2000000}"
out=bench/rebuild.txt
scripts/kafka.sh start >/dev/null
scripts/redis.sh start >/dev/null
brokers="127.0.0.1:${KAFKA_PORT:-19092}"
redis="127.0.0.1:${REDIS_PORT:-16379}"
wallet="go run ./bench/rebuild -grants $grants -brokers $brokers -redis $redis"
pool="go run ./bench/rebuildpool -uins $uins -allocated $allocated -brokers $brokers -redis $redis"
systems="${SYSTEMS:-wallet uin}"
section() { # the kept section of system $1 from the file
  [ -f "$out" ] && awk -v s="# $1:" 'index($0, s) == 1 {on=1} on && /^$/ {exit} on' "$out" || true
}
wallet_section() {
  echo "# wallet: rebuild of the budget and stock counters and the order claims from wallet.grants and wallet.tokens (surge rebuild wallet; after a Redis loss)"
  echo "# made by: scripts/bench-rebuild.sh (GRANTS=$grants) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo "\$ $wallet"
  $wallet
}
uin_section() {
  echo "# uin: rebuild of the pool (buckets, used and held bits) from uin.pool (surge rebuild uin; after a Redis loss)"
  echo "# made by: scripts/bench-rebuild.sh (UINS=$uins ALLOCATED=$allocated) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo "\$ $pool"
  $pool
}
kept_wallet="$(section wallet)"
kept_uin="$(section uin)"
{
  if [[ " $systems " == *" wallet "* ]]; then wallet_section; else echo "$kept_wallet"; fi
  echo
  if [[ " $systems " == *" uin "* ]]; then uin_section; else echo "$kept_uin"; fi
} 2>&1 | tee "$out.new"
mv "$out.new" "$out"
