#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a separate project that finds it with
# find_package(dlm). argv: BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -x "$work/prefix/bin/dlm-preprocess"
test -f "$work/prefix/include/dlm/data/indexed_dataset.h"
cmake -S "$source/tests/install/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/consumer" > "$work/build.log"
"$work/consumer/consumer" "$work/ds"
