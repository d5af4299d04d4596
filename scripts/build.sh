#!/usr/bin/env bash
# Configures and builds dlm into build/ (Release). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDLM_PYTHON="$PWD/.venv/bin/python" "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
