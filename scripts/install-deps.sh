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
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Chromium, for serve.WebPage (tests/serve/web_test.py: the page in a real browser): Debian's
# package. Ubuntu ships it only as a snap; there the test skips, saying so.
want_chromium=0
dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed" || want_chromium=1
if ((${#missing[@]} || want_chromium)); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  step apt-update "apt-get update" $SUDO apt-get update -qq
  if ((want_chromium)); then
    if apt-cache policy chromium 2>/dev/null | grep -q "Candidate: [0-9]"; then
      missing+=(chromium)
    else
      echo "== chromium: no Debian package here (Ubuntu ships a snap): serve.WebPage will skip"
    fi
  fi
  if ((${#missing[@]})); then
    step apt-install "installing ${#missing[@]} Debian packages (${missing[*]})" \
      $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}"
  fi
fi
step xgrammar "xgrammar's C++ core (built from PyPI once, about 4 min on 2 cores)" \
  bash "$(dirname "$0")/install-xgrammar.sh"
