#!/usr/bin/env bash
# Wallet figures: grant intake, booking, balance reads under a 1M-token
# backlog, then grants and reads through the HTTP API with authentication
# on and off;
# on kfake and on the real broker, both with redis-server.
# Writes bench/wallet.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
grants="${GRANTS:-200000}"
# Grants per HTTP run: long enough (over a second for the batch runs) that
# the ramp-up of the callers does not weigh on the rate.
http="${HTTP:-300000}"
out=bench/wallet.txt
scripts/kafka.sh start >/dev/null
scripts/redis.sh start >/dev/null
redis="127.0.0.1:${REDIS_PORT:-16379}"
# The other processes sharing the two cores, whose CPU the bench reports.
redis_pid="$(redis-cli -p "${REDIS_PORT:-16379}" info server | tr -d '\r' | sed -n 's/^process_id://p')"
broker_pid="$(cat "${KAFKA_HOME:-$root/.cache/kafka}/kafka.pid")"
{
  echo "# reward wallet: intake, booking, balance reads; the HTTP API with authentication on and off"
  echo "# made by: scripts/bench-wallet.sh (GRANTS=$grants HTTP=$http) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo
  echo "\$ GOMAXPROCS=1 go test -run xxx -bench . ./processors/wallet/token/"
  GOMAXPROCS=1 go test -run xxx -bench . ./processors/wallet/token/ | grep -E '^Benchmark'
  echo
  echo "\$ go test -run xxx -bench BenchmarkRebuild -benchtime 3x ./processors/wallet/ledger/   # the store rebuilt from wallet.ledger on start"
  go test -run xxx -bench BenchmarkRebuild -benchtime 3x ./processors/wallet/ledger/ | grep -E '^Benchmark'
  echo
  echo "\$ go run ./bench/wallet -grants $grants -backlog 1000000 -http $http -redis $redis -watch redis=<pid>"
  go run ./bench/wallet -grants "$grants" -backlog 1000000 -http "$http" -redis "$redis" -watch "redis=$redis_pid" 2>&1 | grep -v ' INFO '
  echo
  # A broker just started runs interpreted until its JIT has compiled the
  # hot paths: warm it with discarded runs, as a broker in service is warm.
  # One run of 200k grants was not enough: the three runs after it
  # measured intake at 81k, 98k and 106k grants/s.
  echo "# the broker warmed first by three discarded runs (-grants 300000 -backlog 10000)"
  go build -o bin/bench-wallet ./bench/wallet
  for _ in 1 2 3; do
    bin/bench-wallet -grants 300000 -backlog 10000 -reads 1000 -redis "$redis" -brokers "127.0.0.1:${KAFKA_PORT:-19092}" >/dev/null 2>&1
  done
  echo "\$ go run ./bench/wallet -grants $grants -backlog 1000000 -http $http -redis $redis -brokers 127.0.0.1:${KAFKA_PORT:-19092} -watch broker=<pid>,redis=<pid>"
  go run ./bench/wallet -grants "$grants" -backlog 1000000 -http "$http" -redis "$redis" -brokers "127.0.0.1:${KAFKA_PORT:-19092}" -watch "broker=$broker_pid,redis=$redis_pid" 2>&1 | grep -v ' INFO '
  echo
  # The wallet process on a core of its own, as deployed (the broker and
  # Redis are other machines): the broker, redis-server and the callers
  # pinned to the other core. A short run: the protobuf batches alone.
  echo "# the wallet process alone on core 0 (taskset -c 0); the broker, redis-server and the callers on core 1"
  trap 'taskset -a -p -c 0-$(( $(nproc) - 1 )) "$broker_pid" >/dev/null 2>&1; taskset -a -p -c 0-$(( $(nproc) - 1 )) "$redis_pid" >/dev/null 2>&1' EXIT
  taskset -a -p -c 1 "$broker_pid" >/dev/null
  taskset -a -p -c 1 "$redis_pid" >/dev/null
  echo "\$ taskset -c 0 bin/bench-wallet -callers-cpus 1 -grants 10000 -backlog 1000 -reads 100 -http $http -http-json=false -redis $redis -brokers 127.0.0.1:${KAFKA_PORT:-19092} -watch broker=<pid>,redis=<pid>"
  taskset -c 0 bin/bench-wallet -callers-cpus 1 -grants 10000 -backlog 1000 -reads 100 -http "$http" -http-json=false -redis "$redis" \
    -brokers "127.0.0.1:${KAFKA_PORT:-19092}" -watch "broker=$broker_pid,redis=$redis_pid" 2>&1 | grep -v ' INFO ' | grep -E '^(backend|HTTP grants|  other|protobuf|  derived)'
  echo
  echo "# what bounds each figure: bench/wallet-notes.md"
} | tee "$out"
