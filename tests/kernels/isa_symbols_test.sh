#!/usr/bin/env bash
# The instruction-set files of kernels/ (avx2*.cpp, avx512*.cpp, gemm_avx*.cpp, rows8_avx*.cpp)
# are compiled with their own -m flags. A function one of them emits out of line as a weak symbol
# (an inline function or a template instance not inlined) is, to the linker, one definition with
# any other object's copy of it: it keeps one copy, so a caller of another instruction set, or
# generic code, could run the AVX-512 one and die by SIGILL on an AVX2-only CPU, or the other way
# round. Shared helpers must be always_inline or in an unnamed namespace. This test fails naming
# each weak function of an instruction-set object that another object of the build defines too.
# Tables (data symbols) are compiled the same under any flags and are not checked.
#
#   bash tests/kernels/isa_symbols_test.sh BUILD_DIR
set -euo pipefail
B=${1:?usage: isa_symbols_test.sh BUILD_DIR}
lib="$B/kernels/libexpertd_kernels.a"
[ -f "$lib" ] || { echo "isa_symbols_test: no $lib (build the kernels first)" >&2; exit 2; }
command -v nm >/dev/null || { echo "isa_symbols_test: needs nm (binutils)" >&2; exit 2; }

# "member symbol" for every global function defined (T, W) in the kernels library
nm -A --defined-only "$lib" | awk '$(NF-1) ~ /^[TW]$/ {
  n = split($1, p, ":"); print p[n - 1], $NF }' > "$B/isa_symbols.kernels"
isa='^(avx2|avx2_quants|avx2_gather|avx512|avx512_lowbit|avx512_vbmi|gemm_avx2|gemm_avx512|rows8_avx2|rows8_avx512)[.]cpp[.]o$'
members=$(awk '{print $1}' "$B/isa_symbols.kernels" | sort -u)
checked=$(grep -cE "$isa" <<<"$members" || true)
if [ "$checked" -lt 10 ]; then
  echo "isa_symbols_test: found $checked of the 10 instruction-set objects in $lib:" $members >&2
  exit 2
fi
# every function symbol of the build's other static libraries (not other copies of the kernels'
# own: the Python package's tests build one of their own under the build directory)
: > "$B/isa_symbols.others"
while IFS= read -r other; do
  nm -A --defined-only "$other" 2>/dev/null | awk '$(NF-1) ~ /^[TtWw]$/ {print "other", $NF}' \
    >> "$B/isa_symbols.others" || true
done < <(find "$B" -name '*.a' ! -name "$(basename "$lib")" | sort)

bad=$(awk -v isa="$isa" '
  FNR == NR { if ($1 != "other") { def[$2] = def[$2] " " $1; if ($1 ~ isa) weak_isa[$2] = 1 }
              next }
  { other[$2] = 1 }
  END {
    for (s in weak_isa) {
      n = split(def[s], m, " ")
      if (n > 1 || (s in other)) print s ":" def[s] ((s in other) ? " (and another library)" : "")
    }
  }' "$B/isa_symbols.kernels" "$B/isa_symbols.others" | sort)
n_syms=$(awk -v isa="$isa" '$1 ~ isa' "$B/isa_symbols.kernels" | wc -l)
if [ -n "$bad" ]; then
  echo "isa_symbols_test: functions defined by an instruction-set object and another object:"
  c++filt <<<"$bad"
  exit 1
fi
echo "isa_symbols_test: $n_syms functions of $checked instruction-set objects, each defined once"
