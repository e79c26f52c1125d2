#!/usr/bin/env bash
# The test command: starts the real components the tests need (Apache Kafka
# in KRaft mode from Maven Central, one broker with a plaintext and a
# SASL_SSL listener and a three-broker cluster; redis-server plain, with TLS
# and an ACL user, and as a three-master cluster; chDB from npm, chromium
# from Debian for the web page), then runs every Go test
# against both the embedded kfake broker and the real one. Safe to re-run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
trap 'scripts/kafka.sh stop >/dev/null 2>&1 || true; scripts/kafka-cluster.sh stop >/dev/null 2>&1 || true; scripts/redis.sh stop || true' EXIT
scripts/kafka.sh start
KAFKA_CLUSTER_HEAP=320m scripts/kafka-cluster.sh start
scripts/redis.sh start
CHDB_LIB_PATH="$(scripts/chdb.sh)"
SURGE_TEST_CHROME="$(scripts/chromium.sh)"
export CHDB_LIB_PATH SURGE_TEST_CHROME
export SURGE_TEST_KAFKA="127.0.0.1:${KAFKA_PORT:-19092}" SURGE_TEST_REDIS="127.0.0.1:${REDIS_PORT:-16379}"
export SURGE_TEST_KAFKA_SECURE="${KAFKA_HOME:-$root/.cache/kafka}/secure/client.env"
export SURGE_TEST_KAFKA_CLUSTER="${KAFKA_CLUSTER_HOME:-$root/.cache/kafka-cluster}/client.env"
export SURGE_TEST_REDIS_SECURE="$root/.cache/redis/secure/client.env" SURGE_TEST_REDIS_CLUSTER="$root/.cache/redis/cluster/client.env"
export SURGE_TEST_REQUIRE_REAL=1
# The embedded ClickHouse (chDB) is opt-in at build time; the tests use it.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-tags=chdb"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))
if [ -n "$unformatted" ]; then echo "test.sh: not gofmt-ed: $unformatted" >&2; exit 1; fi
go vet ./...
# The .proto files: buf lint, and nothing breaking since the last release.
scripts/buf.sh
# Four packages at once: the tests mostly wait on brokers, groups and
# child processes (a sequential run kept 2 cores about 20% busy).
go test -p 4 -count=1 -timeout 40m "$@" ./...
# The README's main job, bounded, so it cannot break unnoticed (only on a
# full run: arguments narrow the run to some tests).
if [ $# -eq 0 ]; then
  # A short search by every fuzz target (go test above replayed their
  # seeds and kept corpora); scripts/fuzz.sh --keep grows the corpora.
  echo "test.sh: fuzzing each target for ${FUZZTIME:-5s}"
  FUZZTIME="${FUZZTIME:-5s}" scripts/fuzz.sh
  echo "test.sh: the main job (scripts/embedded.sh), bounded at 15 minutes"
  timeout 900 scripts/embedded.sh
fi
