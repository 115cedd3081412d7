#!/usr/bin/env bash
# Builds xgrammar's C++ core (JSON schema -> grammar, the per-step token mask) from its PyPI sdist
# and installs the static library and headers under PREFIX (default /usr/local, where CMake finds
# them). Not a Debian package; the sdist is fetched from PyPI and checked against its sha256.
# Called by install-deps.sh; does nothing when this version is already installed.
set -euo pipefail
VERSION=0.2.9
SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
PREFIX=${PREFIX:-/usr/local}
STAMP="$PREFIX/share/xgrammar/version"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$VERSION" ] && [ -f "$PREFIX/lib/libxgrammar.a" ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then mkdir -p "$PREFIX" 2>/dev/null || true; [ -w "$PREFIX" ] || SUDO="sudo"; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building xgrammar $VERSION (C++ core) into $PREFIX"
python3 - "$VERSION" "$SHA256" "$work/xgrammar.tar.gz" <<'PY'
import hashlib, re, sys, urllib.request
version, sha, out = sys.argv[1:]
# PyPI's simple index (what pip reads) links each file with its sha256.
index = urllib.request.urlopen("https://pypi.org/simple/xgrammar/", timeout=60).read().decode()
m = re.search(r'href="([^"]*/xgrammar-' + re.escape(version) + r'\.tar\.gz)[^"]*"', index)
if not m:
    sys.exit(f"xgrammar {version}: no sdist in PyPI's index")
data = urllib.request.urlopen(m.group(1), timeout=300).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"xgrammar {version} sdist: sha256 mismatch ({m.group(1)})")
open(out, "wb").write(data)
PY
tar -xzf "$work/xgrammar.tar.gz" -C "$work"
src="$work/xgrammar-$VERSION"
mkdir -p "$work/build"
# The sdist's config.cmake turns the Python bindings on; a config.cmake in the build directory
# is read first. Its own flags add -flto and -Werror: LTO objects in a static library would
# need the linker plugin in every consumer, so they are turned off again.
printf 'set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\nset(XGRAMMAR_BUILD_CXX_TESTS OFF)\n' > "$work/build/config.cmake"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$src" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" -DCMAKE_INSTALL_PREFIX="$PREFIX" >/dev/null
cmake --build "$work/build" -j"$(nproc)"
$SUDO cmake --install "$work/build" >/dev/null
$SUDO mkdir -p "$(dirname "$STAMP")"
echo "$VERSION" | $SUDO tee "$STAMP" >/dev/null
echo "xgrammar $VERSION installed in $PREFIX"
