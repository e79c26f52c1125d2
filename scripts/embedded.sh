#!/usr/bin/env bash
# The main job on the embedded default: installs chDB (once), builds surge,
# and runs `surge embedded` (in-process Kafka and ClickHouse, every
# processor and sink, generated traffic). Extra arguments go to surge.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
CHDB_LIB_PATH="$(scripts/chdb.sh)"
export CHDB_LIB_PATH
go build -o bin/surge ./cmd/surge
exec bin/surge embedded "$@"
