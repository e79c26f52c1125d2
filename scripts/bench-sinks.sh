#!/usr/bin/env bash
# ClickHouse figures on chDB: sink rows per second, one hourly
# reconciliation over 10M grants. Writes bench/sinks.txt.
set -euo pipefail
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-tags=chdb" # chDB, the embedded ClickHouse, is opt-in
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
CHDB_LIB_PATH="$(scripts/chdb.sh)"
export CHDB_LIB_PATH
rows="${ROWS:-2000000}"
grants="${GRANTS:-10000000}"
out=bench/sinks.txt
{
  echo "# ClickHouse (chDB): sink throughput, hourly reconciliation"
  echo "# made by: scripts/bench-sinks.sh (ROWS=$rows GRANTS=$grants) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo
  echo "\$ go test -run xxx -bench BenchmarkGrantRows ./sinks/clickhouse/   # the Go side of a sink, per row"
  go test -run xxx -bench BenchmarkGrantRows ./sinks/clickhouse/ | grep -E '^Benchmark'
  echo
  echo "\$ go run ./bench/sinks -rows $rows -grants $grants -runs 3"
  go run ./bench/sinks -rows "$rows" -grants "$grants" -runs 3 2>&1 | grep -v 'level=DEBUG'
} | tee "$out"
