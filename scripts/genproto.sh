#!/usr/bin/env bash
# Regenerates schemas/surgev1 from schemas/proto. Needs protoc (Debian:
# protobuf-compiler) and protoc-gen-go at the version in go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v protoc >/dev/null || { echo "protoc missing: apt-get install -y protobuf-compiler" >&2; exit 1; }
GOBIN="$(go env GOPATH)/bin"
ver=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)
[ -x "$GOBIN/protoc-gen-go" ] || go install "google.golang.org/protobuf/cmd/protoc-gen-go@$ver"
rm -f schemas/surgev1/*.pb.go
PATH="$GOBIN:$PATH" protoc -I schemas/proto --go_out=. --go_opt=module=surge schemas/proto/surge/v1/*.proto
echo "generated: $(ls schemas/surgev1/*.pb.go | tr '\n' ' ')"
