#!/usr/bin/env bash
# Runs redis-server (Debian's package) on loopback for the tests.
#   scripts/redis.sh start|stop     Env: REDIS_PORT (16379)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
port="${REDIS_PORT:-16379}"
dir="$root/.cache/redis"
case "${1:-start}" in
  start)
    if ! command -v redis-server >/dev/null; then
      echo "redis.sh: installing redis-server"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    fi
    mkdir -p "$dir"
    if redis-cli -p "$port" ping >/dev/null 2>&1; then echo "redis.sh: already running on $port"; exit 0; fi
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
      --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
    for _ in $(seq 1 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && { echo "redis.sh: ready on 127.0.0.1:$port"; exit 0; }; sleep 0.2; done
    echo "redis.sh: not ready" >&2; exit 1 ;;
  stop) redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
