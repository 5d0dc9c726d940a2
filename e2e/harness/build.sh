#!/usr/bin/env bash
# Builds the e2e harness binary once per content hash of its Go sources, go.mod and go.sum, into
# $TESSERA_CACHE/harness/<hash>/tessera-harness, so CI machines and developers that keep the cache
# pay the (long) cold build only when the harness changes.
#   build.sh               build if needed, report where the binary is and how long the build took
#   build.sh --print-path  the same, but stdout carries only the binary's path (for Makefile use)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
print_path=0
case "${1:-}" in
  --print-path) print_path=1 ;;
  "") ;;
  *) echo "usage: $0 [--print-path]" >&2; exit 2 ;;
esac

: "${TESSERA_CACHE:=$HOME/.cache/tessera}"
export GOMODCACHE="${GOMODCACHE:-$TESSERA_CACHE/go/mod}"
export GOCACHE="${GOCACHE:-$TESSERA_CACHE/go/build}"
# A drifting go.mod must fail loudly instead of silently resolving new versions; a newer Go
# toolchain must never be downloaded behind our back; cgo is not needed for any role.
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0

command -v go >/dev/null || { echo "build.sh: no 'go' on PATH; the e2e harness needs Go >= 1.26" >&2; exit 1; }

# The build script is part of the key: its flags (the version stamp) change the binary too.
hash="$(cd "$here" && LC_ALL=C ls build.sh go.mod go.sum *.go | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
# The control plane reports the Kubernetes release it is built from (helm checks a chart's kubeVersion
# against it, kubectl version parses it); without the stamp it says v0.0.0-master+$Format:%H$.
k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/go.mod")"
[[ "$k8s_version" =~ ^v([0-9]+)\.([0-9]+)\. ]] || { echo "build.sh: cannot read the k8s.io/kubernetes version from go.mod" >&2; exit 1; }
ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=${BASH_REMATCH[1]}"
ldflags+=" -X k8s.io/component-base/version.gitMinor=${BASH_REMATCH[2]} -X k8s.io/component-base/version.gitTreeState=clean"
out_dir="$TESSERA_CACHE/harness/$hash"
bin="$out_dir/tessera-harness"

if [[ ! -x "$bin" ]]; then
  mkdir -p "$out_dir"
  # Two concurrent callers (make e2e in two shells) must not both spend 20 minutes building.
  exec 9>"$out_dir/.lock"
  flock 9
  if [[ ! -x "$bin" ]]; then
    free_kb="$(df -Pk "$TESSERA_CACHE" | awk 'NR==2 {print $4}')"
    if (( free_kb < 4 * 1024 * 1024 )); then
      echo "build.sh: warning: only $((free_kb / 1024)) MiB free under $TESSERA_CACHE; a cold build needs ~4 GiB" >&2
    fi
    echo "build.sh: building tessera-harness ($hash) with $(go version | cut -d' ' -f3)..." >&2
    start=$(date +%s)
    # No -trimpath: the apiserver's packages locate fixtures through runtime.Caller paths.
    (cd "$here" && go build -ldflags "$ldflags" -o "$bin.tmp" .) >&2
    mv "$bin.tmp" "$bin"
    echo "build.sh: built in $(( $(date +%s) - start ))s -> $bin" >&2
  fi
  exec 9>&-
else
  echo "build.sh: up to date ($hash)" >&2
fi

if (( print_path )); then
  echo "$bin"
else
  echo "build.sh: $bin" >&2
fi
