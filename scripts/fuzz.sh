#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan) and runs
# each for a bounded time from its seed corpus.
#
#   scripts/fuzz.sh [SECONDS]   default 20 per target; scripts/test.sh (CI) runs 10
#
# Only the sources a target needs are compiled, so the build takes seconds.
# A crash leaves its input as build-fuzz/crash-* and the script fails.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
out=build-fuzz
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -Isrc -DTOML_HEADER_ONLY=0)
libs=(-lfmt -lxxhash)
common=(src/brigade/core/files.cc)

build() {  # name sources...
  local name="$1"; shift
  if [[ ! -x "$out/$name" || -n "$(find fuzz src/brigade/ckpt src/brigade/comm src/brigade/core -newer "$out/$name" -name '*.[ch]*' -print -quit)" ]]; then
    echo "fuzz: building $name"
    clang++ "${flags[@]}" "fuzz/$name.cc" "$@" "${common[@]}" "${libs[@]}" -o "$out/$name"
  fi
}
# The three builds side by side: each is one clang process, and together
# they are most of this script's time on a fresh checkout.
build safetensors_fuzz src/brigade/ckpt/safetensors.cc &
safetensors_build=$!
build manifest_fuzz src/brigade/ckpt/manifest.cc src/brigade/ckpt/tensor_box.cc &
manifest_build=$!
build store_frame_fuzz src/brigade/comm/store_protocol.cc
wait "$safetensors_build"
wait "$manifest_build"

for name in safetensors_fuzz manifest_fuzz store_frame_fuzz; do
  corpus="$out/corpus_$name"
  mkdir -p "$corpus"
  cp -n fuzz/seeds/"${name%_fuzz}"/* "$corpus"/ 2>/dev/null || true
  echo "fuzz: $name for ${seconds}s"
  (cd "$out" && "./$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 "corpus_$name" 2>&1 | tail -n 12)
done
