#!/usr/bin/env bash
# System packages for the agent's real local services (docs/platform.md, "IPFS and Docker"):
#   - Debian's docker.io, for dockerd (started by hand by devstack/dockerd.py);
#   - Debian's busybox-static .deb, cached under .cache/debs/, the rootfs of the local test image
#     (built on demand by devstack/images.py: no registry is ever contacted);
#   - Debian's chromium, the browser of the front end's tests (driven by npm playwright-core:
#     its own browser download cannot work offline).
# js-ipfs is an npm dependency (package.json), installed by `npm ci` in scripts/setup.sh.
# Idempotent; a no-op taking milliseconds once done. Needs root (or sudo) only the first time.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1;34m[services]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[services] error:\033[0m %s\n' "$*" >&2; exit 1; }

SUDO=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "root or sudo is needed to apt-get install docker.io"
  SUDO=(sudo -n)
fi

apt_updated=0
apt_install() {
  # A fresh CI image may have empty apt lists: update once, only when an install fails.
  if ! DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends \
    "$@" >/dev/null; then
    [ "$apt_updated" = 0 ] || die "apt-get install $* failed"
    say "apt-get update"
    "${SUDO[@]}" apt-get update -q >/dev/null
    apt_updated=1
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends \
      "$@" >/dev/null || die "apt-get install $* failed"
  fi
}

# ---------------------------------------------------------------- dockerd (Debian docker.io)
if ! command -v dockerd >/dev/null 2>&1; then
  say "apt-get install docker.io (dockerd, containerd, runc; ~30 s)"
  apt_install docker.io
fi
command -v dockerd >/dev/null 2>&1 || die "dockerd still missing after apt-get install docker.io"
# mkfs.ext4 gives the executor its hard-capped /output file system (e2fsprogs: always on Debian).
command -v mkfs.ext4 >/dev/null 2>&1 || apt_install e2fsprogs

# ---------------------------------------------------------------- chromium (browser tests)
if [ ! -x /usr/bin/chromium ]; then
  say "apt-get install chromium (the front end's browser tests; ~1 min)"
  apt_install chromium
fi
[ -x /usr/bin/chromium ] || die "/usr/bin/chromium still missing after apt-get install chromium"

# ---------------------------------------------------------------- busybox-static .deb
DEBS=.cache/debs
mkdir -p "$DEBS"
if ! compgen -G "$DEBS/busybox-static_*.deb" >/dev/null; then
  say "apt-get download busybox-static -> $DEBS/"
  if ! (cd "$DEBS" && apt-get download -q busybox-static >/dev/null 2>&1); then
    "${SUDO[@]}" apt-get update -q >/dev/null
    (cd "$DEBS" && apt-get download -q busybox-static >/dev/null) \
      || die "apt-get download busybox-static failed"
  fi
fi

say "ready (dockerd: $(command -v dockerd), busybox: $(ls "$DEBS"/busybox-static_*.deb), chromium)"
