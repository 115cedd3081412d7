#!/usr/bin/env bash
# Prepares .gpu-carry/ (git-ignored) for a GPU machine that cannot reach the network, such as the
# project's lent H200s: the .deb files of the build dependencies, and a subset of the golden data
# (the whole of ../shared/golden is too large to carry). The libraries libsystemd0 needs are carried
# too: scripts/gpu-check.sh puts on the loader's path only those the machine lacks. Then, on that machine:
#   GPU_CARRY=.gpu-carry bash scripts/gpu-check.sh
# (with the device tool: carry [".gpu-carry"]).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-carry
golden=${GOLDEN_DIR:-../shared/golden}
mkdir -p "$out/debs" "$out/golden/cases"
(cd "$out/debs" && apt-get update -qq && apt-get download -q libboost1.74-dev liburing-dev liburing2 \
  libflatbuffers-dev flatbuffers-compiler libflatbuffers2 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 \
  libgtest-dev googletest nlohmann-json3-dev libcli11-dev libxxhash-dev libxxhash0 libpcre2-dev libpcre2-8-0 \
  libpcre2-32-0 libsystemd-dev libsystemd0 \
  libgcrypt20 libgpg-error0 liblz4-1 liblzma5 libzstd1 libcap2 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
# One case per architecture, across the weight types (MXFP4 with gpt-oss); about 17 MB.
for c in qwen3moe-B-s11-q4_k_m qwen2moe-A-s1-q8_0 llama-A-s1-f16 olmoe-A-s1-q8_0 deepseek2-A-s1-q8_0 \
  gpt-oss-A-s1-mxfp4py; do
  cp -r "$golden/cases/$c" "$out/golden/cases/"
done
cp "$golden/README.md" "$out/golden/"
du -sh "$out"/*
