#!/usr/bin/env bash
# Broker death under load: TestBrokerKill9 kills -9 the broker of a
# three-broker KRaft cluster (scripts/kafka-cluster.sh) that leads most of
# the wallet's token partitions, while `surge wallet` takes grants and
# `surge run push-presence` takes logins; it checks that nothing was lost
# or booked twice and logs how long answers paused. This keeps those
# figures, RUNS times. Writes bench/faults.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
runs="${RUNS:-3}"
out=bench/faults.txt
scripts/kafka-cluster.sh start >/dev/null
scripts/redis.sh start >/dev/null
export SURGE_TEST_REDIS="127.0.0.1:${REDIS_PORT:-16379}"
export SURGE_TEST_KAFKA_CLUSTER="${KAFKA_CLUSTER_HOME:-$root/.cache/kafka-cluster}/client.env"
{
  echo "# a broker killed -9 under load (3 brokers, replication 3, min.insync.replicas 2)"
  echo "# made by: scripts/bench-faults.sh (RUNS=$runs) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  # Kafka's default broker.session.timeout.ms, then a shorter one: the
  # pause is the controller's wait before it moves the dead broker's
  # leaders, not the services'.
  for session in 9000 3000; do
    scripts/kafka-cluster.sh stop >/dev/null
    KAFKA_CLUSTER_SESSION_MS=$session scripts/kafka-cluster.sh start >/dev/null
    echo
    echo "## broker.session.timeout.ms=$session"
    echo "\$ KAFKA_CLUSTER_SESSION_MS=$session scripts/kafka-cluster.sh start; go test -count=1 -run '^TestBrokerKill9$' -v ./cmd/surge/   # $runs times"
    for i in $(seq 1 "$runs"); do
      go test -count=1 -run '^TestBrokerKill9$' -v ./cmd/surge/ 2>&1 | grep -E "fault:|--- (PASS|FAIL)" | sed 's/^ *//; s/^faults_test.go:[0-9]*: //'
    done
  done
  scripts/kafka-cluster.sh stop >/dev/null
  scripts/kafka-cluster.sh start >/dev/null
} | tee "$out"
