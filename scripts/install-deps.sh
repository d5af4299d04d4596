#!/usr/bin/env bash
# Installs every system and Python dependency of dlm on Debian 12 (idempotent; run as root or with sudo).
#   system: the C++ toolchain and libraries, from Debian's packages
#   python: the interop peers, pinned, into .venv at the repository root
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libsimdjson-dev libzstd-dev zstd libhdf5-dev
  libsentencepiece-dev sentencepiece
  libboost-program-options-dev
  libopenmpi-dev openmpi-bin
  libgloo-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libpcre2-dev libutf8proc-dev libfmt-dev nlohmann-json3-dev
  libopenblas-dev
  clang libclang-rt-14-dev
  python3-venv time
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

# Python peers and the header-only libraries PyPI ships: reinstalled only when a requirements file changes.
PY=${PYTHON:-python3}
stamp=.venv/.requirements.sha256
want=$(cat scripts/requirements.txt scripts/requirements-headers.txt | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "install-deps: creating .venv with the pinned interop peers"
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r scripts/requirements.txt
  .venv/bin/pip install -q --no-deps -r scripts/requirements-headers.txt
  echo "$want" > "$stamp"
fi
echo "install-deps: ok"
