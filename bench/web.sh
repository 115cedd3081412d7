#!/usr/bin/env bash
# The page's own cost (docs/web.md): expert-serve's decode tok/s with the dashboard closed, with
# one reader of its event stream (the server's share of the cost), and with the real page open on
# the dashboard in headless Chromium on the same machine (the server's share plus the browser's
# CPU). ROUNDS rounds of the three in turn (each round begins with the next one), each one generation of MAX_TOKENS tokens (greedy, the
# same prompt); medians and ratios. Through a real expertd serving the bundled model's pack (SLOTS
# cache slots: 128 holds all its experts, so the drive adds no noise; 64 keeps it missing). Needs the build (expertd,
# expert-pack, expert-serve), /usr/bin/chromium and PyPI (Playwright in the venv serve.WebPage
# makes under the build directory; made here if missing).
#   ROUNDS=7 MAX_TOKENS=8000 THREADS=1 SLOTS=128 bash bench/web.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
venv="$build/web-venv-playwright1.65.3"
if [ ! -e "$venv/.ready" ]; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check playwright==1.65.3
  touch "$venv/.ready"
fi
grep -m1 "model name" /proc/cpuinfo
echo "cores: $(nproc)"
exec "$venv/bin/python" bench/web.py --bin "$build" --rounds "${ROUNDS:-7}" \
  --max-tokens "${MAX_TOKENS:-8000}" --threads "${THREADS:-1}" --slots "${SLOTS:-128}"
