#!/usr/bin/env bash
# System packages for the agent's real local services (docs/platform.md, "IPFS and Docker"):
#   - Debian's docker.io, for dockerd (started by hand by devstack/dockerd.py);
#   - Debian's docker-registry (the CNCF distribution registry 2.8), for a local OCI registry on
#     a free loopback port (started by hand by devstack/registry.py; the package's own service,
#     on :5000, is stopped and disabled);
#   - Debian's busybox-static .deb, cached under .cache/debs/, the rootfs of the local test image
#     (built on demand by devstack/images.py, then pushed to that local registry);
#   - the .debs of Debian's python3 + numpy (their dependency closure), cached under
#     .cache/debs/python-numpy/, the rootfs of the Python data job's image (devstack/images.py);
#   - the .debs of Debian's python3 + torch 1.13 (their dependency closure), cached under
#     .cache/debs/python-torch/, the rootfs of the training example's image
#     (devstack/torch_image.py);
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

# ---------------------------------------------------------------- docker-registry (local OCI registry)
# devstack/registry.py runs /usr/bin/docker-registry with its own config (127.0.0.1, a free port,
# storage under its work dir). The package's postinst starts a system service on :5000 (all
# interfaces) where an init system lets it (policy-rc.d in container images usually does not):
# stop and disable that one, once, right after installing; nothing of ours uses it.
if [ ! -x /usr/bin/docker-registry ]; then
  say "apt-get install docker-registry (a local OCI registry; ~10 s)"
  apt_install docker-registry
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    "${SUDO[@]}" systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/docker-registry ]; then
    "${SUDO[@]}" /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
    "${SUDO[@]}" update-rc.d docker-registry disable >/dev/null 2>&1 || true
  fi
fi
[ -x /usr/bin/docker-registry ] || die "/usr/bin/docker-registry still missing after apt-get install"

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

# ---------------------------------------------------------------- python3 + numpy, + torch .debs
# The rootfs of gridmarket/python-numpy:test (devstack/images.py) and gridmarket/python-torch:test
# (devstack/torch_image.py): the whole dependency closure of the named packages, as apt resolves
# it for an empty system (an empty dpkg status file: packages installed on this host count as
# missing, unlike `apt-get install --download-only`, which would skip them), minus dpkg and tar
# (pre-dependencies of python3-minimal's maintainer scripts, which the images never run).
#   python-numpy: python3-minimal python3-numpy, ~45 packages, ~23 MB, 3-14 s;
#   python-torch: python3-minimal python3-torch (1.13), ~390 packages, ~260 MB. libtorch1.13 needs
#     OpenCV, FFmpeg, GDAL, Qt...: all are downloaded (that is the closure apt installs), and the
#     image keeps only the shared libraries torch and python really load (ELF DT_NEEDED closure,
#     devstack/torch_image.py), so libtorch-test (a hard dependency) and most of the rest stay out.
# closure.txt lists the .debs and is written last: its presence, with every .deb it names, means
# done.
debs_ok() {  # debs_ok DIR: closure.txt and every .deb it names are there
  [ -f "$1/closure.txt" ] || return 1
  local f
  while read -r f; do [ -f "$1/$f" ] || return 1; done <"$1/closure.txt"
}
debs_closure() {  # debs_closure PKG...: pkg=version per line, the closure for an empty system
  local empty
  empty=$(mktemp)
  apt-get -s -q -o Dir::State::status="$empty" install --no-install-recommends "$@" \
    2>/dev/null | awk '$1 == "Inst" { v = $3; gsub(/[()]/, "", v); print $2 "=" v }' \
    | grep -v -E '^(dpkg|tar)='
  rm -f "$empty"
}
debs_download() {  # debs_download DIR PKG...: the closure into a fresh DIR.tmp; fails unless every .deb came
  local dir=$1 pins want got
  shift
  pins=$(debs_closure "$@" || true)
  [ -n "$pins" ] || return 1
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  # As root into a root-owned dir apt warns that it downloads unsandboxed: expected, filtered
  # out; success is judged by the count of .debs.
  # shellcheck disable=SC2086 # one pkg=version per word
  (cd "$dir.tmp" && apt-get download -q $pins 2>&1 >/dev/null) \
    | { grep -v '^W: Download is performed unsandboxed' >&2 || true; } || true
  want=$(wc -w <<<"$pins")
  got=$(find "$dir.tmp" -maxdepth 1 -name '*.deb' | wc -l)
  [ "$got" = "$want" ] || { say "got $got of $want .debs"; return 1; }
}
debs_cache() {  # debs_cache DIR PKG...: download the closure of PKG... into DIR once
  local dir=$1 started
  shift
  debs_ok "$dir" && return 0
  say "apt-get download $* and their dependency closure -> $dir/"
  started=$(date +%s)
  if ! debs_download "$dir" "$@"; then  # empty or stale apt lists: update once, then it must work
    "${SUDO[@]}" apt-get update -q >/dev/null
    debs_download "$dir" "$@" || die "apt-get download of the $* closure failed"
  fi
  (cd "$dir.tmp" && ls -1 -- *.deb >closure.txt)
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  say "$dir: $(wc -l <"$dir/closure.txt") .debs, $(du -sh "$dir" | cut -f1), $(($(date +%s) - started)) s"
}
PYDEBS=$DEBS/python-numpy
debs_cache "$PYDEBS" python3-minimal python3-numpy
TORCHDEBS=$DEBS/python-torch
debs_cache "$TORCHDEBS" python3-minimal python3-torch

# The store and replica tests need a PostgreSQL server on 127.0.0.1:5432 that lets the local
# `postgres` role in without a password (GRIDMARKET_PG_ADMIN_URL points elsewhere). When none
# answers there, install Debian's `postgresql`, make sure a cluster exists, let `postgres` in
# from 127.0.0.1 only (trust: a development machine's loopback, never a server's), and start it.
pg_up() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
if [ -z "${GRIDMARKET_PG_ADMIN_URL:-}" ] && ! pg_up; then
  if ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
    say "apt-get install postgresql (no server answers on 127.0.0.1:5432; ~30 s)"
    apt_install postgresql
  fi
  pgver=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
  if ! pg_lsclusters -h 2>/dev/null | awk '{print $1}' | grep -qx "$pgver"; then
    say "pg_createcluster $pgver main"
    "${SUDO[@]}" pg_createcluster "$pgver" main >/dev/null
  fi
  pgcluster=$(pg_lsclusters -h | awk -v v="$pgver" '$1 == v {print $2; exit}')
  hba=/etc/postgresql/$pgver/$pgcluster/pg_hba.conf
  if ! "${SUDO[@]}" grep -qE '^host\s+all\s+postgres\s+127\.0\.0\.1/32\s+trust' "$hba"; then
    say "pg_hba.conf: trust the postgres role from 127.0.0.1 (loopback only)"
    "${SUDO[@]}" sed -i '0,/^[^#]/s//host all postgres 127.0.0.1\/32 trust\n&/' "$hba"
  fi
  say "starting PostgreSQL $pgver/$pgcluster"
  "${SUDO[@]}" pg_ctlcluster --skip-systemctl-redirect "$pgver" "$pgcluster" start \
    || "${SUDO[@]}" pg_ctlcluster --skip-systemctl-redirect "$pgver" "$pgcluster" reload
  for _ in $(seq 50); do pg_up && break; sleep 0.2; done
  pg_up || die "PostgreSQL $pgver/$pgcluster did not start listening on 127.0.0.1:5432"
fi

say "ready (dockerd: $(command -v dockerd), docker-registry, busybox: $(ls "$DEBS"/busybox-static_*.deb), python3 + numpy: $(wc -l <"$PYDEBS/closure.txt") .debs, python3 + torch: $(wc -l <"$TORCHDEBS/closure.txt") .debs, chromium, PostgreSQL)"
