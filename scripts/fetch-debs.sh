#!/usr/bin/env bash
# Saves the .deb files of expertd's build dependencies in .debs/ (git-ignored), for a GPU machine
# without network access: scripts/gpu-check.sh unpacks them into a private prefix there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .debs
cd .debs
apt-get update -qq
apt-get download libboost1.74-dev liburing-dev liburing2 libflatbuffers-dev flatbuffers-compiler libflatbuffers2 \
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libgtest-dev googletest nlohmann-json3-dev libcli11-dev \
  libxxhash-dev libxxhash0 libpcre2-dev libpcre2-8-0 libpcre2-32-0 libsystemd-dev 2>&1 | tail -3
du -sh .
