#!/usr/bin/env python3
"""Writes kernels/iq_tables.inc: the grids and sign tables of ggml's IQ weight types, which are
data of the GGUF format (ggml-common.h of llama.cpp; llama-cpp-python's sdist vendors it).

    python3 scripts/gen-iq-tables.py path/to/ggml-common.h > kernels/iq_tables.inc
"""
import re
import sys

NAMES = ["kmask_iq2xs", "ksigns_iq2xs", "iq2xxs_grid", "iq2xs_grid", "iq2s_grid", "iq3xxs_grid",
         "iq3s_grid", "kvalues_iq4nl", "iq1s_grid"]

src = open(sys.argv[1]).read()
out = ["// The grids and sign tables of ggml's IQ weight types: data of the GGUF format, as",
       "// ggml-common.h defines them. Written by scripts/gen-iq-tables.py; do not edit.",
       "// clang-format off"]
for name in NAMES:
    m = re.search(r"GGML_TABLE_BEGIN\((\w+),\s*" + name + r",\s*(\w+)\)(.*?)GGML_TABLE_END\(\)",
                  src, re.S)
    if not m:
        sys.exit(f"{name} not found")
    ctype, size, body = m.group(1), m.group(2), m.group(3)
    body = re.sub(r"//[^\n]*", "", body)
    values = [v.strip() for v in body.replace("\n", " ").split(",") if v.strip()]
    if size == "NGRID_IQ1S":
        size = "2048"
    if len(values) != int(size):
        sys.exit(f"{name}: {len(values)} values, expected {size}")
    per = 4 if ctype == "uint64_t" else 8 if ctype == "uint32_t" else 16
    out.append(f"KERNELS_TABLE({ctype}, {name}, {size}) = {{")
    for i in range(0, len(values), per):
        out.append("    " + ", ".join(values[i:i + per]) + ",")
    out.append("};")
out.append("// clang-format on")
print("\n".join(out))
