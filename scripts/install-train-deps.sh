#!/usr/bin/env bash
# What model/train.py needs (Debian): PyTorch, NumPy, the KJV text, and an optimised BLAS
# (without libopenblas0-pthread Debian's torch falls back to the reference BLAS, 5-6x slower).
set -euo pipefail
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-torch python3-numpy bible-kjv libopenblas0-pthread
