#!/usr/bin/env bash
# Quick start, part 1: install what is missing, build, train the demo model on
# Shakespeare (about 8 minutes on 2 cores), and write a sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
# A fresh run each time: the demo refuses to overwrite an earlier run's checkpoints.
rm -rf runs/shakespeare
./build/brigade train examples/shakespeare.toml "$@"
echo
./build/brigade sample --ckpt runs/shakespeare --prompt "ROMEO:" --tokens 400
