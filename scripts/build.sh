#!/usr/bin/env bash
# Configures and builds into build/ (Release, warnings as errors).
#   scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRIGADE_WERROR=ON "$@" >/dev/null
ninja -C build
