#!/usr/bin/env bash
# One-command, idempotent set-up for a fresh Debian/Ubuntu machine with Python 3.11 and Node 20.
# Re-running it is cheap: each step is skipped when its inputs have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAMPS=.setup-stamps
mkdir -p "$STAMPS"

say() { printf '\033[1;34m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[setup] error:\033[0m %s\n' "$*" >&2; exit 1; }

# stamp NAME FILE...: true when the recorded hash of FILE... is current.
fresh() {
  local name=$1; shift
  local want; want=$(cat "$@" 2>/dev/null | sha256sum | cut -d' ' -f1)
  [ -f "$STAMPS/$name" ] && [ "$(cat "$STAMPS/$name")" = "$want" ]
}
stamp() {
  local name=$1; shift
  cat "$@" 2>/dev/null | sha256sum | cut -d' ' -f1 >"$STAMPS/$name"
}

# ---------------------------------------------------------------- toolchains
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for c in python3.11 python3.12 python3; do
    if command -v "$c" >/dev/null 2>&1; then PYTHON=$(command -v "$c"); break; fi
  done
fi
[ -n "$PYTHON" ] || die "Python 3.11 or 3.12 is required (apt-get install python3 python3-venv)."
"$PYTHON" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)' \
  || die "$PYTHON is $("$PYTHON" -V 2>&1); Python 3.11 or 3.12 is required."
command -v node >/dev/null 2>&1 || die "Node.js 20 is required (apt-get install nodejs npm)."
node -e 'process.exit(+process.versions.node.split(".")[0] >= 18 ? 0 : 1)' \
  || die "Node.js $(node --version) is too old; 18 or newer is required."

# ---------------------------------------------------------------- npm: solc, anvil, cast
if ! fresh npm package-lock.json || [ ! -x node_modules/.bin/anvil ]; then
  say "npm install from package-lock.json (solc compiler, anvil devnet, js-ipfs; ~2 min)"
  # Not `npm ci`: js-ipfs pulls electron-eval, whose optional dependency `headless` is a GitHub
  # tarball that cannot be locked or fetched here, and `npm ci` refuses the lock for it.
  # `npm install` installs exactly the locked tree and skips that optional package.
  npm install --no-audit --no-fund --loglevel=error
  stamp npm package-lock.json
fi

# ---------------------------------------------------------------- python venv
if [ ! -x .venv/bin/python ]; then
  say "creating virtualenv .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
if ! fresh pip pyproject.toml; then
  say "pip install -e '.[dev]' (pinned chain toolchain: docs/platform.md)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  stamp pip pyproject.toml
fi

# ---------------------------------------------------------------- compiler entry
"$ROOT/tools/solc/solc-v0.8.37" --version | grep -q 'Version: 0.8.37+commit' \
  || die "tools/solc/solc-v0.8.37 does not answer --version; is node_modules/solc installed?"

# ---------------------------------------------------------------- local services
# dockerd (Debian docker.io) and the busybox rootfs for the local test image; js-ipfs came with
# `npm ci` above. The process managers in devstack start them on demand.
bash scripts/setup_services.sh

say "ready (.venv, node_modules, offline solc 0.8.37, anvil, js-ipfs, dockerd)"
