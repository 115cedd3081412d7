// expert-bench's CPU kernel benchmarks (kernels_bench.cpp): the weight types' dots against
// llama.cpp's, attention per head against grouped, decode's GEMV against a memory stream.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

struct KernelsArgs {
  std::string ggml_lib;
  std::vector<std::string> types;
  int64_t row = 2048;
  int rounds = 300;
};
CLI::App* add_kernels_command(CLI::App& app, KernelsArgs& a);
int bench_kernels(const KernelsArgs& a);

struct AttentionArgs {
  int64_t keys = 8192, dim = 128;
  int heads = 32, kv_heads = 4, tokens = 8, rounds = 7;
  std::string kv_type = "f16";
};
CLI::App* add_attention_command(CLI::App& app, AttentionArgs& a);
int bench_attention(const AttentionArgs& a);

struct GemvArgs {
  std::vector<std::string> types = {"Q4_K", "Q2_K", "Q3_K", "IQ2_XXS", "MXFP4", "IQ4_XS", "Q8_0"};
  int64_t mib = 512;
  int64_t cols = 2048;
  int threads = 0, rounds = 7;
};
CLI::App* add_gemv_command(CLI::App& app, GemvArgs& a);
int bench_gemv(const GemvArgs& a);
