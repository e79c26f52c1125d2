#!/usr/bin/env bash
# Lint and breaking-change check of the .proto files with buf (from npm's
# @bufbuild/buf-linux-x64, cached under .cache/buf):
#   scripts/buf.sh             buf lint, then buf breaking against the last
#                              release's schemas (schemas/proto/release.binpb)
#   scripts/buf.sh release     a release: write the current schemas as the
#                              baseline the next changes are checked against
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ver="${BUF_VERSION:-1.47.2}"
dir="$root/.cache/buf"
buf="$dir/buf-$ver"
if [ ! -x "$buf" ]; then
  "$root/scripts/npm-fetch.sh" "@bufbuild/buf-linux-x64@$ver" "$dir/pkg"
  mv "$dir/pkg/package/bin/buf" "$buf"
  rm -rf "$dir/pkg"
fi
cd "$root/schemas/proto"
case "${1:-check}" in
  release)
    "$buf" build -o release.binpb
    echo "buf.sh: schemas/proto/release.binpb is the baseline now"
    ;;
  check)
    "$buf" lint
    "$buf" breaking --against release.binpb
    echo "buf.sh: lint clean, nothing breaking since the last release"
    ;;
  *) echo "usage: scripts/buf.sh [check|release]" >&2; exit 2 ;;
esac
