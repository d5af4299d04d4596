#!/usr/bin/env bash
# Set-up command 1: installs every dependency, builds, and runs the main job on a small embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
scripts/demo.sh
