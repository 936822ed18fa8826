#!/usr/bin/env bash
# Quick start, part 1: install what is missing, build, train the demo model on
# Shakespeare (5.5-8 minutes on 2 cores), and write a sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
# A new run directory each time: brigade refuses to start a fresh run on top
# of an earlier run's checkpoints, and the earlier runs stay for comparison.
run_dir="runs/shakespeare-$(date +%Y%m%d-%H%M%S)"
./build/brigade train examples/shakespeare.toml --set "train.run_dir=$run_dir" "$@"
echo
./build/brigade sample --ckpt "$run_dir" --prompt "ROMEO:" --tokens 400
