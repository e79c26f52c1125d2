#!/usr/bin/env bash
# Mass push as deployed: the push services as separate OS processes on the
# real broker (scripts/kafka.sh), a 10M-user job over 2 executor processes,
# then one with an executor killed -9 and restarted. Writes bench/pushsvc.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
users="${USERS:-10000000}"
scripts/kafka.sh start >/dev/null
broker="127.0.0.1:${KAFKA_PORT:-19092}"
{
  echo "# mass push services (separate processes) on the real broker"
  echo "# made by: scripts/bench-pushsvc.sh (USERS=$users) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo
  echo "\$ go run ./bench/pushsvc -brokers $broker -users $users"
  go run ./bench/pushsvc -brokers "$broker" -users "$users"
} | tee bench/pushsvc.txt
