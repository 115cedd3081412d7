// MiniMax-M2 (minimax-m2) and MiniMax-M3 (minimax-m3, MiniMax Sparse Attention) against
// llama.cpp: test-size synthetic models (tests/data/minimax: the expert-pack synth recipe and
// llama.cpp's teacher-forced logits, M3's with flash attention on, made by
// scripts/gen-minimax-cases.py with llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix; M3's
// 40-token prompts over blocks of 4 positions picking 4 per KV head, so every token past the 16th
// attends sparsely. The selection across eval calls; the daemon path; the keys.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

namespace {

const char* const kCases[] = {"minimax/m3-f32", "minimax/m3-f16", "minimax/m3-q4_k"};

}  // namespace

// MiniMax-M2 at llama.cpp's F32 rule: its q/k norms over all heads at once.
TEST(MiniMaxM2, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"minimax/m2-f32", "minimax/m2-f16", "minimax/m2-q4_k"})
    check_synth_case(id, "minimax-m2");
}

TEST(MiniMaxM2, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("minimax/m2-q4_k"));
}

// llama.cpp always renormalises MiniMax-M2's expert weights and aborts without a gating function:
// a file without one, or that asks for no renormalisation, is refused naming the key.
TEST(MiniMaxM2, AMissingOrUnsupportedKeyIsAnErrorNamingIt) {
  Case c = load_case("minimax/m2-f32");
  check_missing_keys_are_named(c, {"minimax-m2.expert_gating_func"});
}

// llama.cpp runs MSA only with flash attention, and its flash attention rounds the dense lead
// layer's F32 keys and values to F16 (llama-graph.cpp, build_attn_mha) where this engine keeps
// them: llama.cpp's own rows with flash attention on and off differ by 2-6e-4 in F32 (0.06-0.1
// in the Q4_K_M mix, where the activations' Q8_K rounding amplifies it) from the first row, the
// band every row here stays in. A wrong block anywhere would cost 0.1-0.6 in F32 (the sparse
// rows against dense ones), so the F32 bound of 2e-3 still sees the selection.
TEST(MiniMaxM3, SynthModelsMatchLlamaCpp) {
  for (const char* id : kCases) check_synth_case(id, "minimax-m3", 2e-3, 1e-3);
}

// The indexer's keys of earlier evals are read back from the key rows: a prompt fed in pieces
// selects what one batch selects.
TEST(MiniMaxM3, ChunkedPrefillEqualsOneBatch) {
  Case c = load_case("minimax/m3-f32");
  auto l = load(c);
  ASSERT_TRUE(l);
  check_chunked_prefill(l->model, c, {1, 3, 7}, 1e-4);
}

TEST(MiniMaxM3, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("minimax/m3-q4_k"));
}

// Every MSA key is needed, and the indexer must have one head per KV head (llama.cpp's assert).
TEST(MiniMaxM3, AMissingOrUnsupportedKeyIsAnErrorNamingIt) {
  Case c = load_case("minimax/m3-f32");
  check_missing_keys_are_named(
      c, {"minimax-m3.attention.indexer.head_count", "minimax-m3.attention.indexer.key_length",
          "minimax-m3.attention.indexer.top_k", "minimax-m3.attention.indexer.block_size",
          "minimax-m3.attention.indexer.local_blocks"});
  check_refused_with_u32(c, "minimax-m3.attention.indexer.head_count", 2, 1);
}

// The selection acts: with top_k raised past the prompt's blocks (every block selected) the rows
// of the first 16 positions, where the top 4 blocks are all of them, stay bit for bit the same and
// the later ones change.
TEST(MiniMaxM3, TheBlockSelectionChangesTheLaterRows) {
  Case c = load_case("minimax/m3-f32");
  TempDir d;
  const std::string model = synth_case(c, d), all = d / "dense.gguf";
  write_with_u32(model, "minimax-m3.attention.indexer.top_k", 4, 64, all);
  if (HasFatalFailure()) return;
  check_rows_change_from(c, model, all, 16);
}
