#!/usr/bin/env bash
# The main job on the embedded default: installs chDB (once), builds surge,
# and runs `surge embedded` (in-process Kafka and ClickHouse, every
# processor and sink, generated traffic; extra arguments go to it), then
# `surge loadgen` (the mass-push stack under generated load), then `surge uin
# demo` (the stock recycling pipeline end to end on synthetic accounts).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
CHDB_LIB_PATH="$(scripts/chdb.sh)"
export CHDB_LIB_PATH
go build -tags chdb -o bin/surge ./cmd/surge
bin/surge embedded "$@"
case " $* " in *" --demo.users 0 "*|*" --demo.users=0 "*) exit 0 ;; esac
# Mass push under generated load, on its own embedded broker.
bin/surge loadgen --loadgen.users 300000 --loadgen.accounts 300 --loadgen.jobs 100
# Uin recycling: 100,000 synthetic accounts through sinks, classification and
# every recycle step into the pool, on its own embedded broker and Redis.
exec bin/surge uin demo --uin.accounts 100000
