#!/usr/bin/env bash
# clang-format over every C++/CUDA source of the tree (.clang-format at the root).
#   bash scripts/format.sh          rewrites the files in place
#   bash scripts/format.sh --check  lists unformatted files and fails (CI runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    "$CF" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    printf 'not clang-formatted (%s): %s\n' "$("$CF" --version)" "${bad[*]}"
    echo "run: bash scripts/format.sh"
    exit 1
  fi
  echo "clang-format: ${#files[@]} files formatted"
else
  "$CF" -i "${files[@]}"
fi
