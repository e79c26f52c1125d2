#!/usr/bin/env bash
# Runs redis-server (Debian's package) on loopback for the tests, in the
# three shapes a platform has:
#   plain     one server on REDIS_PORT (16379), no password
#   secure    one server on REDIS_PORT+1 (16380): TLS only (a CA made at
#             start), the default user off, ACL user "surge" with a password
#             made at start
#   cluster   a Redis Cluster of three masters on REDIS_CLUSTER_PORT (17001)
#             and the two ports after it (cluster bus: +10000)
# What a client needs for the secure server and the cluster is written to
# .cache/redis/secure/client.env and .cache/redis/cluster/client.env
# (SURGE_REDIS_* keys).
#   scripts/redis.sh start|stop
set -euo pipefail
. "$(dirname "$0")/certs.sh"
root="$(cd "$(dirname "$0")/.." && pwd)"
port="${REDIS_PORT:-16379}"
sport=$((port + 1))
cport="${REDIS_CLUSTER_PORT:-17001}"
dir="$root/.cache/redis"
secure="$dir/secure"
cluster="$dir/cluster"

wait_ping() { # port [redis-cli args...]
  local p=$1; shift
  for _ in $(seq 1 50); do redis-cli -p "$p" "$@" ping >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "redis.sh: server on $p not ready" >&2; return 1
}

start_plain() {
  if redis-cli -p "$port" ping >/dev/null 2>&1; then echo "redis.sh: already running on $port"; return; fi
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  wait_ping "$port"
  echo "redis.sh: ready on 127.0.0.1:$port"
}

start_secure() {
  if [ -f "$secure/redis.pid" ] && kill -0 "$(cat "$secure/redis.pid")" 2>/dev/null; then
    echo "redis.sh: secure server already running on $sport"; return
  fi
  rm -rf "$secure"; mkdir -p "$secure"; chmod 700 "$secure"
  make_server_cert "$secure" redis
  local pw
  pw=$(openssl rand -hex 16)
  printf '%s' "$pw" > "$secure/password"
  # The ACL lives in a file the server reads, so the password is on no
  # command line.
  printf 'user default off\nuser surge on >%s ~* &* +@all\n' "$pw" > "$secure/users.acl"
  chmod 600 "$secure"/*
  redis-server --port 0 --tls-port "$sport" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --tls-cert-file "$secure/redis.crt" --tls-key-file "$secure/redis.key" --tls-ca-cert-file "$secure/ca.crt" \
    --tls-auth-clients no --aclfile "$secure/users.acl" \
    --dir "$secure" --pidfile "$secure/redis.pid" --logfile "$secure/redis.log"
  wait_ping "$sport" --tls --cacert "$secure/ca.crt" --user surge --pass "$pw" --no-auth-warning
  cat > "$secure/client.env" <<ENV
SURGE_REDIS_ADDR=127.0.0.1:$sport
SURGE_REDIS_USERNAME=surge
SURGE_REDIS_PASSWORD_FILE=$secure/password
SURGE_REDIS_TLS_CA_FILE=$secure/ca.crt
ENV
  echo "redis.sh: secure server (TLS, ACL user surge) ready on 127.0.0.1:$sport"
}

start_cluster() {
  local ports=("$cport" $((cport + 1)) $((cport + 2)))
  if redis-cli -p "${ports[0]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
    echo "redis.sh: cluster already running on ${ports[*]}"; return
  fi
  rm -rf "$cluster"; mkdir -p "$cluster"
  local addrs=()
  for p in "${ports[@]}"; do
    mkdir -p "$cluster/$p"
    redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
      --cluster-enabled yes --cluster-config-file "$cluster/$p/nodes.conf" --cluster-node-timeout 2000 \
      --dir "$cluster/$p" --pidfile "$cluster/$p/redis.pid" --logfile "$cluster/$p/redis.log"
    wait_ping "$p"
    addrs+=("127.0.0.1:$p")
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$cluster/create.log" 2>&1 \
    || { cat "$cluster/create.log" >&2; exit 1; }
  for _ in $(seq 1 50); do
    redis-cli -p "${ports[0]}" cluster info | grep -q 'cluster_state:ok' && break; sleep 0.2
  done
  cat > "$cluster/client.env" <<ENV
SURGE_REDIS_ADDR=$(IFS=,; echo "${addrs[*]}")
SURGE_REDIS_MODE=cluster
ENV
  echo "redis.sh: cluster of three masters ready on ${addrs[*]}"
}

stop_pidfile() { [ -f "$1" ] && kill "$(cat "$1")" 2>/dev/null || true; }

case "${1:-start}" in
  start)
    if ! command -v redis-server >/dev/null; then
      echo "redis.sh: installing redis-server"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    fi
    command -v openssl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; }
    mkdir -p "$dir"
    start_plain
    start_secure
    start_cluster ;;
  stop)
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    stop_pidfile "$secure/redis.pid"
    for p in "$cport" $((cport + 1)) $((cport + 2)); do stop_pidfile "$cluster/$p/redis.pid"; done ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
