#!/usr/bin/env bash
# What the uin-tracker's read-ahead (processors/uin/tracker/catchup.go)
# costs its throughput, on the real broker: one tracker consumes 50,000
# registrations and 150,000 usage records (two thirds of the usage a stock
# account's) with the read-ahead and without it, interleaved (-count),
# medians with min and max. Writes bench/tracker.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/kafka.sh start >/dev/null
count="${COUNT:-7}"
out=bench/tracker.txt
cmd="go test -run xxx -bench ReadAhead -benchtime 1x -count 1 ./processors/uin/tracker/"
runs=/tmp/bench-tracker.$$
{
  echo "# uin-tracker throughput with the read-ahead (on) and without it (off, the races of catchup.go left open)"
  echo "# made by: scripts/bench-tracker.sh on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3); the real broker on the same cores"
  echo "# one op: 200,000 records consumed from the group's start until its lag is 0 (the group's join included);"
  echo "# $count runs of the command below, each on then off"
  echo "\$ SURGE_TEST_KAFKA=127.0.0.1:${KAFKA_PORT:-19092} $cmd"
  for _ in $(seq "$count"); do
    SURGE_TEST_KAFKA="127.0.0.1:${KAFKA_PORT:-19092}" $cmd 2>/dev/null | grep -E '^Benchmark'
  done | tee "$runs"
  echo
  echo "# medians (min-max) of records/s; catch-ups and records read ahead per op, medians"
  median() { sort -n | awk '{v[NR]=$1} END {printf "%.0f %.0f %.0f\n", v[int((NR+1)/2)], v[1], v[NR]}'; }
  field() { grep "/$1-" "$runs" | awk -v f="$2" '{for (i=2;i<=NF;i++) if ($i==f) print $(i-1)}'; }
  for mode in on off; do
    read -r med lo hi < <(field "$mode" records/s | median)
    read -r cu _ _ < <(field "$mode" catchups/op | median)
    read -r ra _ _ < <(field "$mode" read-ahead/op | median)
    printf "%-4s %9s records/s (%s-%s)  %s catch-ups  %s records read ahead\n" "$mode" "$med" "$lo" "$hi" "$cu" "$ra"
    eval "med_$mode=$med"
  done
  awk -v on="$med_on" -v off="$med_off" 'BEGIN {printf "ratio of medians, on/off: %.2f\n", on/off}'
  rm -f "$runs"
} | tee "$out"
