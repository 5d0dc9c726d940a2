#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok, fake nodes and pods for the scale benchmark) from its Go module,
# once per content hash of this script, into $TESSERA_CACHE/kwok/<hash>/kwok, the way
# e2e/harness/build.sh caches the harness. Beside it, stages.yaml: the "fast" Stage set kwok's module
# ships (nodes become Ready and keep their lease, bound pods become Running, deleted pods go away),
# which kwok needs as its --config.
#   build-kwok.sh               build if needed, report where the binary is
#   build-kwok.sh --print-path  the same, but stdout carries only the binary's path (for Makefile use)
set -euo pipefail
KWOK_VERSION=v0.8.0
print_path=0
case "${1:-}" in
  --print-path) print_path=1 ;;
  "") ;;
  *) echo "usage: $0 [--print-path]" >&2; exit 2 ;;
esac

: "${TESSERA_CACHE:=$HOME/.cache/tessera}"
export GOMODCACHE="${GOMODCACHE:-$TESSERA_CACHE/go/mod}"
export GOCACHE="${GOCACHE:-$TESSERA_CACHE/go/build}"
# `go install module@version` resolves only what that module's go.mod and go.sum pin (checked against the
# checksum database); a newer toolchain is never fetched behind our back.
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
unset GOFLAGS

command -v go >/dev/null || { echo "build-kwok.sh: no 'go' on PATH; kwok $KWOK_VERSION needs Go >= 1.26" >&2; exit 1; }

hash="$(sha256sum "$0" | cut -c1-16)"
out_dir="$TESSERA_CACHE/kwok/$hash"
bin="$out_dir/kwok"

if [[ ! -x "$bin" ]]; then
  mkdir -p "$out_dir"
  exec 9>"$out_dir/.lock"
  flock 9
  if [[ ! -x "$bin" ]]; then
    echo "build-kwok.sh: building kwok $KWOK_VERSION with $(go version | cut -d' ' -f3)..." >&2
    start=$(date +%s)
    rm -rf "$out_dir/bin.tmp"
    GOBIN="$out_dir/bin.tmp" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
    src="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    stages=()
    for d in node/fast node/heartbeat-with-lease pod/fast; do
      for f in "$src/kustomize/stage/$d"/*.yaml; do
        [[ "$(basename "$f")" == kustomization.yaml ]] || stages+=("$f")
      done
    done
    (( ${#stages[@]} >= 5 )) || { echo "build-kwok.sh: kwok's stage files not found under $src/kustomize/stage" >&2; exit 1; }
    for f in "${stages[@]}"; do echo "---"; cat "$f"; done > "$out_dir/stages.yaml"
    mv "$out_dir/bin.tmp/kwok" "$bin"
    rmdir "$out_dir/bin.tmp"
    echo "build-kwok.sh: built in $(( $(date +%s) - start ))s -> $bin" >&2
  fi
  exec 9>&-
else
  echo "build-kwok.sh: up to date (kwok $KWOK_VERSION, $hash)" >&2
fi

if (( print_path )); then
  echo "$bin"
else
  echo "build-kwok.sh: $bin" >&2
fi
