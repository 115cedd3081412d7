#!/usr/bin/env bash
# Installs everything expertd needs to build and test on Debian 12 / Ubuntu 22.04+.
# Called by the README quick start and by .ci/run, so both install the same set.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build git
  libboost-dev liburing-dev libflatbuffers-dev flatbuffers-compiler
  libspdlog-dev libfmt-dev libgtest-dev nlohmann-json3-dev libcli11-dev
  libxxhash-dev libpcre2-dev libsystemd-dev systemd python3 python3-numpy python3-venv xz-utils
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
bash "$(dirname "$0")/install-xgrammar.sh"
