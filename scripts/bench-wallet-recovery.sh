#!/usr/bin/env bash
# Wallet recovery after kill -9: `surge wallet` as an OS process under
# grant and withdrawal traffic is killed and restarted (TestWalletSurvivesKill9,
# which also checks every balance and the live total); this keeps its
# measurements: how long the restarted process took to serve reads, on
# kfake+miniredis and on the real broker with redis-server, RUNS times.
# Writes bench/wallet-recovery.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
runs="${RUNS:-3}"
out=bench/wallet-recovery.txt
scripts/kafka.sh start >/dev/null
scripts/redis.sh start >/dev/null
export SURGE_TEST_KAFKA="127.0.0.1:${KAFKA_PORT:-19092}" SURGE_TEST_REDIS="127.0.0.1:${REDIS_PORT:-16379}"
{
  echo "# wallet: time from the restart of a kill -9ed 'surge wallet' to its first answered read (goal < 5 s)"
  echo "# made by: scripts/bench-wallet-recovery.sh (RUNS=$runs) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo "\$ go test -count=1 -run TestWalletSurvivesKill9 -v ./cmd/surge/   # $runs times"
  for i in $(seq 1 "$runs"); do
    go test -count=1 -run TestWalletSurvivesKill9 -v ./cmd/surge/ 2>&1 | grep -E "served reads|killed with|--- (PASS|FAIL)" | sed 's/^ *//'
  done
} | tee "$out"
