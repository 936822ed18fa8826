#!/usr/bin/env bash
# Installs the Debian 12 packages Brigade needs, and only those missing.
# Idempotent: a second run installs nothing and takes about a second.
#
#   scripts/install_deps.sh          build and run (the demo)
#   scripts/install_deps.sh --test   also what the test suite needs
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config
  libdnnl-dev   # oneDNN: the GEMMs, JIT-compiled for the CPU's ISA; on OpenMP like our kernels
  ocl-icd-opencl-dev  # only a Recommends of libdnnl-dev, but Debian's dnnl-config.cmake requires OpenCL
  libfmt-dev nlohmann-json3-dev libtomlplusplus-dev libcli11-dev
  libgloo-dev   # TCP collectives for the gloo communicator backend
  libxxhash-dev # checksums of checkpoint shards
  libjs-chart.js  # Chart.js, inlined into the page `brigade report` writes
  libcurl4-openssl-dev  # HTTP to etcd's v3 gateway (brigade launch --rdzv-backend etcd)
  libopenblas0-openmp  # the weight gradients at the AVX2 level (kernels/cpu/gemm.h)
)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(
    libgtest-dev libbenchmark-dev
    libopenblas-openmp-dev   # the GEMM peer in bench/gemm_backends (and PyTorch's BLAS)
    python3 python3-numpy python3-torch   # reference tests against PyTorch (CPU)
    clang-format
    clang libclang-rt-14-dev   # libFuzzer targets (scripts/fuzz.sh)
    slurm-wlm munge   # the slurm label: a one-node Slurm the test starts (tests/cli/srun_slurm_test.cc)
    chromium     # renders `brigade report` headless (ctest -L external)
    prometheus   # scrapes the agent's /metrics (ctest -L external)
    etcd-server etcd-client   # a real etcd for the coordinator's etcd backend (ctest -L external)
  )
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install_deps: missing ${missing[*]}; run as root (or with sudo) to install them" >&2
  exit 1
fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
