#!/usr/bin/env bash
# Builds what a real e2e node runs, once per content hash of its Go module files, into
# $TESSERA_CACHE/node/<hash>/: kubelet (k8s.io/kubernetes v1.36.3, version stamped), containerd v2,
# its runc shim, ctr, and the pod sandbox's pause binary. runc and the CNI plugins come from Debian and
# are installed when missing (CI runs as root). Like the harness, a warm cache makes this a no-op.
#   build.sh               build if needed, report where the binaries are
#   build.sh --print-path  the same, but stdout carries only the binaries' directory
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
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0
k8s_version=v1.36.3

command -v go >/dev/null || { echo "node/build.sh: no 'go' on PATH; a real node needs Go >= 1.26" >&2; exit 1; }

missing=()
command -v runc >/dev/null || missing+=(runc)
[[ -x /usr/lib/cni/host-local || -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
if (( ${#missing[@]} )); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "node/build.sh: missing Debian packages ${missing[*]}; install them as root (apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "node/build.sh: installing ${missing[*]} from Debian..." >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2 \
    || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2; }
fi

hash="$(cd "$here" && LC_ALL=C ls build.sh kubelet/go.mod kubelet/go.sum kubelet/tools.go containerd/go.mod containerd/go.sum containerd/tools.go containerd/pause/main.go \
  | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
out="$TESSERA_CACHE/node/$hash"

if [[ ! -x "$out/kubelet" ]]; then
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [[ ! -x "$out/kubelet" ]]; then
    start=$(date +%s)
    echo "node/build.sh: building containerd, ctr, containerd-shim-runc-v2 and pause ($hash)..." >&2
    (cd "$here/containerd" && go build -tags no_btrfs,no_devmapper,no_zfs -o "$out/" \
      github.com/containerd/containerd/v2/cmd/containerd \
      github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
      github.com/containerd/containerd/v2/cmd/ctr \
      ./pause) >&2
    echo "node/build.sh: containerd built in $(( $(date +%s) - start ))s; building kubelet $k8s_version..." >&2
    (cd "$here/kubelet" && go build -o "$out/kubelet.tmp" \
      -ldflags "-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36" \
      k8s.io/kubernetes/cmd/kubelet) >&2
    mv "$out/kubelet.tmp" "$out/kubelet"
    echo "node/build.sh: built in $(( $(date +%s) - start ))s -> $out" >&2
  fi
  exec 9>&-
else
  echo "node/build.sh: up to date ($hash)" >&2
fi

if (( print_path )); then echo "$out"; else echo "node/build.sh: $out" >&2; fi
