#!/usr/bin/env bash
# Runs a three-broker Apache Kafka cluster in KRaft mode on loopback, as a
# platform runs one: every node a broker and a voter of the controller
# quorum, internal topics with three copies (min.insync.replicas 2).
#   scripts/kafka-cluster.sh start        format anew and start every node (unless running), wait until all are up
#   scripts/kafka-cluster.sh stop         stop every node
#   scripts/kafka-cluster.sh kill N       kill -9 node N (1-3), as a machine dying would
#   scripts/kafka-cluster.sh restart N    start node N again on its data
# Env: KAFKA_CLUSTER_PORT (19192: brokers on it and the next two ports,
# controllers on +100), KAFKA_CLUSTER_HOME (.cache/kafka-cluster),
# KAFKA_CLUSTER_HEAP (384m each), KAFKA_CLUSTER_SESSION_MS (the
# controller's broker.session.timeout.ms: how soon a dead broker's
# partitions get new leaders; Kafka's default 9000). The jars are
# scripts/kafka.sh's.
# $KAFKA_CLUSTER_HOME/client.env holds SURGE_KAFKA_BROKERS for a client.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
home="${KAFKA_CLUSTER_HOME:-$root/.cache/kafka-cluster}"
base="${KAFKA_CLUSTER_PORT:-19192}"
heap="${KAFKA_CLUSTER_HEAP:-384m}"
nodes=(1 2 3)

bport() { echo $((base + $1 - 1)); }
cport() { echo $((base + 100 + $1 - 1)); }
up() { (exec 3<>"/dev/tcp/127.0.0.1/$(bport "$1")") 2>/dev/null; }
pidf() { echo "$home/node$1/kafka.pid"; }
running() { [ -f "$(pidf "$1")" ] && kill -0 "$(cat "$(pidf "$1")")" 2>/dev/null; }

voters() {
  local v=()
  for n in "${nodes[@]}"; do v+=("$n@127.0.0.1:$(cport "$n")"); done
  (IFS=,; echo "${v[*]}")
}

configure() { # node
  local n=$1 dir="$home/node$1"
  mkdir -p "$dir/data"
  cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$(voters)
listeners=PLAINTEXT://127.0.0.1:$(bport "$n"),CONTROLLER://127.0.0.1:$(cport "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(bport "$n")
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=3
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=6
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
message.max.bytes=2097152
unclean.leader.election.enable=false
broker.session.timeout.ms=${KAFKA_CLUSTER_SESSION_MS:-9000}
broker.heartbeat.interval.ms=$(( ${KAFKA_CLUSTER_SESSION_MS:-9000} / 4 ))
PROPS
}

launch() { # node
  local n=$1 dir="$home/node$1"
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  nohup java -Xms128m -Xmx"$heap" -XX:+UseG1GC -XX:TieredStopAtLevel=1 -cp "$lib/*" kafka.Kafka "$dir/server.properties" \
    >>"$dir/kafka.log" 2>&1 &
  echo $! > "$(pidf "$n")"
}

wait_up() { # nodes...
  for _ in $(seq 1 180); do
    local all=1
    for n in "$@"; do up "$n" || all=0; done
    if [ $all = 1 ]; then return 0; fi
    for n in "$@"; do running "$n" || { echo "kafka-cluster.sh: node $n exited" >&2; tail -30 "$home/node$n/kafka.log" >&2; exit 1; }; done
    sleep 1
  done
  echo "kafka-cluster.sh: nodes $* not up after 180s" >&2; exit 1
}

start() {
  lib="$("$root/scripts/kafka.sh" jars | tail -1)"
  # A fresh cluster at every start, as scripts/kafka.sh's broker: the
  # tests' topics would otherwise pile up run after run (thousands of
  # partitions in a small heap) and slow every broker down.
  if ! running 1 && ! running 2 && ! running 3; then rm -f "$home/formatted"; fi
  if [ ! -f "$home/formatted" ]; then
    rm -rf "$home"; mkdir -p "$home"
    local id
    id=$(java -cp "$lib/*" kafka.tools.StorageTool random-uuid)
    for n in "${nodes[@]}"; do
      configure "$n"
      java -cp "$lib/*" kafka.tools.StorageTool format -t "$id" -c "$home/node$n/server.properties" \
        >"$home/node$n/format.log" 2>&1 || { cat "$home/node$n/format.log" >&2; exit 1; }
    done
    touch "$home/formatted"
  fi
  for n in "${nodes[@]}"; do
    if ! running "$n"; then configure "$n"; launch "$n"; fi # settings from the environment of this start
  done
  wait_up "${nodes[@]}"
  local bs=()
  for n in "${nodes[@]}"; do bs+=("127.0.0.1:$(bport "$n")"); done
  printf 'SURGE_KAFKA_BROKERS=%s\nKAFKA_CLUSTER_SCRIPT=%s\n' "$(IFS=,; echo "${bs[*]}")" "$root/scripts/kafka-cluster.sh" > "$home/client.env"
  echo "kafka-cluster.sh: three brokers up on $(IFS=,; echo "${bs[*]}")"
}

stop() {
  for n in "${nodes[@]}"; do
    running "$n" && kill "$(cat "$(pidf "$n")")" 2>/dev/null || true
  done
  for n in "${nodes[@]}"; do
    for _ in $(seq 1 30); do running "$n" || break; sleep 1; done
    running "$n" && kill -9 "$(cat "$(pidf "$n")")" 2>/dev/null || true
    rm -f "$(pidf "$n")"
  done
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  kill) running "$2" && kill -9 "$(cat "$(pidf "$2")")"; rm -f "$(pidf "$2")" ;;
  restart) lib="$("$root/scripts/kafka.sh" jars | tail -1)"; running "$2" || launch "$2"; wait_up "$2"; echo "kafka-cluster.sh: node $2 up" ;;
  *) echo "usage: $0 start|stop|kill N|restart N" >&2; exit 2 ;;
esac
