#!/usr/bin/env bash
# Runs a real single-node Apache Kafka broker in KRaft mode on loopback.
#   scripts/kafka.sh start   resolve jars from Maven Central (once), format, start, wait until ready
#   scripts/kafka.sh stop    stop it
#   scripts/kafka.sh jars    resolve the jars only and print their directory
# Env: KAFKA_PORT (19092), KAFKA_HOME (.cache/kafka), KAFKA_HEAP (1g).
#
# Two client listeners: PLAINTEXT on KAFKA_PORT, and SASL_SSL on
# KAFKA_PORT+2 as a managed cluster has it (TLS with a CA made at start,
# SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 for user "surge", whose
# password is made at start too). What a client needs for the secured
# listener is written to $KAFKA_HOME/secure/client.env (SURGE_KAFKA_* keys).
set -euo pipefail
. "$(dirname "$0")/certs.sh"
root="$(cd "$(dirname "$0")/.." && pwd)"
home="${KAFKA_HOME:-$root/.cache/kafka}"
port="${KAFKA_PORT:-19092}"
cport=$((port + 1))
sport=$((port + 2))
secure="$home/secure"
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

# make_secrets makes a CA, the broker's certificate (127.0.0.1, localhost)
# in a PKCS12 keystore, and the password of SASL user surge: new at every
# start, never in the repository.
make_secrets() {
  rm -rf "$secure"; mkdir -p "$secure"; chmod 700 "$secure"
  local store_pw
  store_pw=$(openssl rand -hex 16)
  user_pw=$(openssl rand -hex 16)
  make_server_cert "$secure" broker
  openssl pkcs12 -export -in "$secure/broker.crt" -inkey "$secure/broker.key" -name broker \
    -out "$secure/broker.p12" -passout "pass:$store_pw"
  printf '%s' "$user_pw" > "$secure/password"
  chmod 600 "$secure"/*
  cat > "$secure/broker.properties" <<SEC
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$secure/broker.p12
listener.name.sasl_ssl.ssl.keystore.password=$store_pw
listener.name.sasl_ssl.ssl.key.password=$store_pw
listener.name.sasl_ssl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_surge="$user_pw";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
SEC
  cat > "$secure/client.env" <<ENV
SURGE_KAFKA_BROKERS=127.0.0.1:$sport
SURGE_KAFKA_TLS_CA_FILE=$secure/ca.crt
SURGE_KAFKA_SASL_MECHANISM=SCRAM-SHA-512
SURGE_KAFKA_SASL_USERNAME=surge
SURGE_KAFKA_SASL_PASSWORD_FILE=$secure/password
ENV
}

start() {
  fetch_jars
  if [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; then echo "kafka.sh: already running (pid $(cat "$pidf"))"; return; fi
  rm -rf "$data"; mkdir -p "$data"
  make_secrets
  cat > "$home/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,SASL_SSL://127.0.0.1:$sport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
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
  cat "$secure/broker.properties" >> "$home/server.properties"
  local id
  id=$(java -cp "$cp_" kafka.tools.StorageTool random-uuid)
  java -cp "$cp_" kafka.tools.StorageTool format -t "$id" -c "$home/server.properties" \
    --add-scram "SCRAM-SHA-256=[name=surge,password=$user_pw]" \
    --add-scram "SCRAM-SHA-512=[name=surge,password=$user_pw]" >"$home/format.log" 2>&1 \
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
  jars) fetch_jars; echo "$lib" ;;
  *) echo "usage: $0 start|stop|jars" >&2; exit 2 ;;
esac
