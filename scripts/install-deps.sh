#!/usr/bin/env bash
# Installs everything expertd needs to build and test on Debian 12 / Ubuntu 22.04+.
# Called by the README quick start and by .ci/run, so both install the same set.
set -euo pipefail
source "$(dirname "$0")/step.sh"
pkgs=(
  build-essential cmake ninja-build git
  libboost-dev liburing-dev libflatbuffers-dev flatbuffers-compiler
  libspdlog-dev libfmt-dev libgtest-dev nlohmann-json3-dev libcli11-dev
  libxxhash-dev libpcre2-dev libsystemd-dev systemd python3 python3-dev python3-numpy python3-venv xz-utils
  pkg-config binutils
  nginx-light  # tests/serve/anthropic_fleet_test.py: a plain proxy in front of workers
  libzmq3-dev  # expert-serve --kv-events-endpoint
  chromium     # tests/serve/web_test.py: the page in a real browser (driven by Playwright)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  step apt-update "apt-get update" $SUDO apt-get update -qq
  step apt-install "installing ${#missing[@]} Debian packages (${missing[*]})" \
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi
step xgrammar "xgrammar's C++ core (built from PyPI once, about 4 min on 2 cores)" \
  bash "$(dirname "$0")/install-xgrammar.sh"
