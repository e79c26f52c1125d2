#!/usr/bin/env bash
# `surge produce` from stdin against the real broker: LINES uin.usage
# records (protobuf JSON, one per line, half of them in the envelope with
# their own key) into the registry's uin.usage, RUNS
# times; the rate is the command's own summary (records acknowledged per
# second, acks=all, idempotent). Writes bench/produce.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
lines="${LINES:-200000}"
runs="${RUNS:-3}"
out=bench/produce.txt
scripts/kafka.sh start >/dev/null
brokers="127.0.0.1:${KAFKA_PORT:-19092}"
bin=$(mktemp -d)/surge
go build -buildvcs=false -o "$bin" ./cmd/surge
input=$(mktemp)
awk -v n="$lines" 'BEGIN { for (i = 1; i <= n; i++) {
  if (i % 2) printf "{\"uin\": %d, \"kind\": \"message\", \"at_ms\": %d}\n", i, i;
  else printf "{\"key_uin\": %d, \"value\": {\"uin\": %d, \"kind\": \"login\", \"atMs\": %d}}\n", i, i, i } }' > "$input"
"$bin" topics --create --kafka.brokers "$brokers" >/dev/null
topic=uin.usage
{
  echo "# surge produce from stdin: $lines lines into uin.usage on the local KRaft broker (scripts/kafka.sh)"
  echo "# made by: scripts/bench-produce.sh (LINES=$lines RUNS=$runs) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  for i in $(seq 1 "$runs"); do
    echo "\$ surge produce --kafka.brokers $brokers --topic $topic --key k < lines.jsonl"
    "$bin" produce --kafka.brokers "$brokers" --topic "$topic" --key k < "$input" 2>/dev/null
  done
} 2>&1 | tee "$out"
rm -f "$input"
