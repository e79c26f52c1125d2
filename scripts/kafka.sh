#!/usr/bin/env bash
# Runs a real single-node Apache Kafka broker in KRaft mode on loopback.
#   scripts/kafka.sh start   resolve jars from Maven Central (once), format, start, wait until ready
#   scripts/kafka.sh stop    stop it
# Env: KAFKA_PORT (19092), KAFKA_HOME (.cache/kafka), KAFKA_HEAP (1g).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
home="${KAFKA_HOME:-$root/.cache/kafka}"
port="${KAFKA_PORT:-19092}"
cport=$((port + 1))
lib="$home/lib"
data="$home/data"
pidf="$home/kafka.pid"
cp_="$lib/*"

fetch_jars() {
  if [ -f "$lib/.complete" ]; then return; fi
  command -v mvn >/dev/null || { echo "kafka.sh: mvn is needed to resolve Kafka from Maven Central" >&2; exit 1; }
  echo "kafka.sh: resolving org.apache.kafka:kafka_2.13 and dependencies into $lib"
  mkdir -p "$lib"
  mvn -q -B -f "$root/scripts/kafka/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$lib" -DincludeScope=runtime
  touch "$lib/.complete"
}

ready() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

start() {
  fetch_jars
  if [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; then echo "kafka.sh: already running (pid $(cat "$pidf"))"; return; fi
  rm -rf "$data"; mkdir -p "$data"
  cat > "$home/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$data
num.partitions=3
offsets.topic.replication.factor=1
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=6
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
message.max.bytes=2097152
PROPS
  local id
  id=$(java -cp "$cp_" kafka.tools.StorageTool random-uuid)
  java -cp "$cp_" kafka.tools.StorageTool format -t "$id" -c "$home/server.properties" >"$home/format.log" 2>&1 \
    || { cat "$home/format.log" >&2; exit 1; }
  # Every partition keeps files open, and a test run creates thousands of
  # topics: give the broker as many descriptors as the machine allows.
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  nohup java -Xms256m -Xmx"${KAFKA_HEAP:-1g}" -XX:+UseG1GC -cp "$cp_" kafka.Kafka "$home/server.properties" \
    >"$home/kafka.log" 2>&1 &
  echo $! > "$pidf"
  for _ in $(seq 1 120); do
    if ready; then echo "kafka.sh: broker ready on 127.0.0.1:$port (pid $(cat "$pidf"))"; return; fi
    kill -0 "$(cat "$pidf")" 2>/dev/null || { echo "kafka.sh: broker exited" >&2; tail -50 "$home/kafka.log" >&2; exit 1; }
    sleep 1
  done
  echo "kafka.sh: broker not ready after 120s" >&2; tail -50 "$home/kafka.log" >&2; exit 1
}

stop() {
  [ -f "$pidf" ] || return 0
  kill "$(cat "$pidf")" 2>/dev/null || true
  for _ in $(seq 1 30); do kill -0 "$(cat "$pidf")" 2>/dev/null || break; sleep 1; done
  kill -9 "$(cat "$pidf")" 2>/dev/null || true
  rm -f "$pidf"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
