#!/usr/bin/env bash
# Fetches an npm package's tarball and unpacks it into a directory (no
# node_modules, nothing run): scripts/npm-fetch.sh PACKAGE@VERSION DIR.
# The package's files are then in DIR/package. Used for the binaries and
# libraries the tests need that npm ships (chDB's libchdb.so, buf).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: scripts/npm-fetch.sh PACKAGE@VERSION DIR" >&2; exit 2; }
command -v npm >/dev/null || { echo "npm-fetch.sh: npm is needed" >&2; exit 1; }
spec="$1" dir="$2"
mkdir -p "$dir"
rm -rf "$dir/package"
echo "npm-fetch.sh: fetching $spec" >&2
tgz=$(cd "$dir" && npm pack --silent "$spec" | tail -1)
tar xzf "$dir/$tgz" -C "$dir"
rm -f "$dir/$tgz"
