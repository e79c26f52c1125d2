#!/usr/bin/env bash
# Installs chDB (the ClickHouse engine as a library) from the npm package
# @chdb/lib-linux-x64-gnu. Prints the library path; chdb-go finds it through
# CHDB_LIB_PATH, and also at /usr/local/lib/libchdb.so where we link it when root.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ver="${CHDB_NPM_VERSION:-26.7.3-stable.1}"
dir="$root/.cache/chdb"
lib="$dir/libchdb.so"
if [ ! -f "$dir/.complete-$ver" ]; then
  "$root/scripts/npm-fetch.sh" "@chdb/lib-linux-x64-gnu@$ver" "$dir/pkg"
  mv "$dir/pkg/package/libchdb.so" "$lib"
  rm -rf "$dir/pkg"
  touch "$dir/.complete-$ver"
fi
if [ "$(id -u)" = 0 ] && [ ! -e /usr/local/lib/libchdb.so ]; then ln -sf "$lib" /usr/local/lib/libchdb.so; fi
echo "$lib"
