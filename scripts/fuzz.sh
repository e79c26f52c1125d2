#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a while each.
#
#   scripts/fuzz.sh              each target for FUZZTIME (default 10s)
#   FUZZTIME=5m scripts/fuzz.sh  a longer hunt
#   scripts/fuzz.sh --keep       then keeps up to 40 of the inputs the run found
#                                interesting per target in its package's
#                                testdata/fuzz/<target>/ (the corpus `go test`
#                                replays on every run)
#
# `go test` alone already replays each target's seeds and kept corpus; this
# script is the search for new inputs. A failing input is written to
# testdata/fuzz/<target>/ by Go itself: commit it with the fix.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
keep=0
[ "${1:-}" = "--keep" ] && keep=1
fuzztime="${FUZZTIME:-10s}"
cache="$(go env GOCACHE)/fuzz"
module="$(go list -m)"
# Every "func FuzzX(" in a test file, as "package-dir target".
targets=$(grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r f; do
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed "s|^func ||; s|^|$(dirname "$f") |"
done)
n=$(echo "$targets" | wc -l)
i=0
echo "$targets" | while read -r dir target; do
  i=$((i + 1))
  echo "fuzz.sh: [$i/$n] $dir $target for $fuzztime"
  # On a loaded machine Go sometimes ends a run with "context deadline
  # exceeded" and no failing input (a fuzz worker that did not answer in
  # time; it failed FuzzVerify in a CI run): the target is run again with
  # twice the time, up to twice. A failing input is always a failure.
  t="$fuzztime"
  for attempt in 1 2 3; do
    out="$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$t" -fuzzminimizetime 5s "$dir" 2>&1)" && { echo "$out" | grep -v '^fuzz: elapsed'; break; }
    echo "$out" | grep -v '^fuzz: elapsed'
    if [ $attempt -lt 3 ] && echo "$out" | grep -q 'context deadline exceeded' && ! echo "$out" | grep -q 'Failing input written to'; then
      case "$t" in *[0-9]s) t="$(( ${t%s} * 2 ))s" ;; esac
      echo "fuzz.sh: $dir $target: context deadline exceeded, no input failed; again for $t"
      continue
    fi
    echo "fuzz.sh: $dir $target FAILED: the input is in $dir/testdata/fuzz/$target" >&2
    exit 1
  done
  if [ $keep -eq 1 ]; then
    found="$cache/$module/${dir#./}/$target"
    if [ -d "$found" ]; then
      mkdir -p "$dir/testdata/fuzz/$target"
      # The smallest inputs: they say most per byte.
      ls -S -r "$found" | head -40 | while read -r f; do cp "$found/$f" "$dir/testdata/fuzz/$target/"; done
    fi
  fi
done
