#!/usr/bin/env bash
# Regenerates go.mod for the harness from Kubernetes' own go.mod: every staging module that
# k8s.io/kubernetes maps to ./staging/src/k8s.io/X is pinned to the published k8s.io/X tag of the
# same release, so new staging modules of a future release are picked up without hand edits.
# Run only when moving to another Kubernetes release: `bash e2e/harness/gen-gomod.sh v1.36.3`.
set -euo pipefail
cd "$(dirname "$0")"
k8s_version="${1:-v1.36.3}"
staging_version="v0.${k8s_version#v1.}"
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod
: "${TESSERA_CACHE:=$HOME/.cache/tessera}"
export GOMODCACHE="${GOMODCACHE:-$TESSERA_CACHE/go/mod}" GOCACHE="${GOCACHE:-$TESSERA_CACHE/go/build}"

upstream_mod="$(go mod download -json "k8s.io/kubernetes@${k8s_version}" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
[[ -f "$upstream_mod" ]] || { echo "could not download go.mod of k8s.io/kubernetes@${k8s_version}" >&2; exit 1; }

# Keep the module line and go directive; drop old requires/replaces so the result is reproducible.
cat > go.mod <<MOD
module tessera.dev/e2e/harness

go 1.26.0

require k8s.io/kubernetes ${k8s_version}
MOD

count=0
while read -r module; do
  go mod edit -replace "${module}=${module}@${staging_version}"
  count=$((count + 1))
done < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/k8s\.io/.*#\1#p' "$upstream_mod")
echo "pinned ${count} staging modules to ${staging_version}" >&2

# The etcd server embedded by the `etcd` subcommand must be the one k8s.io/apiserver was tested with.
etcd_version="$(sed -n 's#^[[:space:]]*go.etcd.io/etcd/client/v3 \(v[^ ]*\).*#\1#p' "$upstream_mod" | head -1)"
go mod edit -require "go.etcd.io/etcd/server/v3@${etcd_version}"
go mod tidy
