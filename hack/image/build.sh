#!/usr/bin/env bash
# Builds tessera's OCI image without Docker and without a registry; `make image` calls it. The build
# (hack/image/build.py) is cached under $TESSERA_CACHE/image by content hash like the Go builds, so a
# warm cache makes this a check of the keys. It needs root (mmdebstrap, chroot, overlay mounts) and
# installs Debian's mmdebstrap when missing (CI starts from a clean machine and runs as root).
#   build.sh [--tag TAG] [--print-path] [--print-ref] [--rebuild STAGE]   (build.sh --help says more)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python="$(command -v python3 || true)"; fi
fi
[[ -n "$python" ]] || { echo "image/build.sh: no python3 (>= 3.11) on PATH; set PYTHON=" >&2; exit 1; }

case " $* " in
  *" --help "*|*" -h "*) cd "$root" && exec "$python" -m hack.image.build --help ;;
esac
if [[ $(id -u) -ne 0 ]]; then
  echo "image/build.sh: the image build needs root (mmdebstrap --mode=root, chroot and overlay mounts in a private mount namespace); run it as root, as CI does" >&2
  exit 1
fi

missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
[[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] || missing+=(debian-archive-keyring)
command -v unshare >/dev/null || missing+=(util-linux)
if (( ${#missing[@]} )); then
  echo "image/build.sh: installing ${missing[*]} from Debian..." >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
    || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
fi

# A mount namespace of its own: mmdebstrap's /proc and /dev mounts and the build's overlays vanish with
# the process and never show in the machine's mount table (hack/image/chroot.py says the rest).
cd "$root"
exec unshare --mount --propagation private env TESSERA_IMAGE_PRIVATE_MOUNTS=1 PYTHONPATH="$root" \
  PYTHONDONTWRITEBYTECODE=1 "$python" -m hack.image.build "$@"
