// expert-bench's CPU kernel benchmarks (kernels_bench.cpp): the weight types' dots against
// llama.cpp's, and attention per head against grouped.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

int bench_kernels(const std::string& lib, std::vector<std::string> types, int64_t n, int rounds);

struct AttentionArgs {
  int64_t keys = 8192, dim = 128;
  int heads = 32, kv_heads = 4, tokens = 8, rounds = 7;
  std::string kv_type = "f16";
};
CLI::App* add_attention_command(CLI::App& app, AttentionArgs& a);
int bench_attention(const AttentionArgs& a);
