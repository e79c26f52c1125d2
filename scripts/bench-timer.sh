#!/usr/bin/env bash
# Timer service: arm, restore and fire N pending timers on kfake.
# Writes bench/timer.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
timers="${TIMERS:-10000000}"
delay="${DELAY:-300s}" # due after arming and restoring: firing is measured alone
out=bench/timer.txt
{
  echo "# timer service: arm, restore (Pebble rebuilt from platform.timers), fire"
  echo "# made by: scripts/bench-timer.sh (TIMERS=$timers) on $(date -u +%F), $(nproc) cores, $(go version | cut -d' ' -f3)"
  echo
  echo "\$ go run ./bench/timer -timers $timers -delay $delay"
  go run ./bench/timer -timers "$timers" -delay "$delay"
  echo
  echo "# Restore reads the compacted topic and writes Pebble in batches; firing produces each timer's"
  echo "# payload and tombstone in transactions of up to 5000. Both were bound by Pebble lookups that"
  echo "# went to disk (the block cache was empty: Pebble reserves memtables out of it); with a cache"
  echo "# that caches, 1M timers restore in about 8 s and fire at about 75k/s (were 42 s and 32k/s)."
} | tee "$out"
