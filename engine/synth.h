// expert-pack synth: synthetic MoE GGUFs at real-model shapes, their tensors from each
// architecture's own plan (random valid quant blocks,
// routers skewed toward a Zipf-like expert popularity), so benchmarks run at gigabyte scale
// without downloads. The files carry the metadata and tokenizer llama.cpp needs to load them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "gguf/ggml_types.h"

namespace engine {

// How the synthetic routers choose: Zipf, a few experts popular in every layer (as DeepSeek-V4's
// and Qwen3's routing is skewed); Balanced, no expert favoured by the routers' weights (as a
// router trained for flat use, Kimi-K3's quantile balancing). model/README.md sets the two
// beside the bundled trained model's trace.
enum class SynthRouting { Zipf, Balanced };

struct SynthOptions {
  std::string preset;  // a preset of some architecture (engine/archs/): synth_preset_names()
  std::vector<uint64_t>
      dims;  // custom: n_embd,n_layer,n_expert,n_expert_used,n_ff_exp[,n_head,n_head_kv,n_vocab]
  gguf::GgmlType type = gguf::GgmlType::Q4_K;  // any weight type the kernels run
  // Per-role overrides for the routed experts, to reproduce
  // real mixes: Kimi-K3's Q2_K gate/up with Q3_K down.
  std::optional<gguf::GgmlType> gate_type, up_type, down_type;
  uint32_t layers = 0;  // 0 = the preset's depth
  uint64_t seed = 1;
  SynthRouting routing = SynthRouting::Zipf;
  std::string chat_template;  // written as tokenizer.chat_template when not empty
  std::string out_path;
  bool progress = true;
};

std::string synth_preset_names();
expertd::Result<uint64_t> write_synth(const SynthOptions& opts);  // returns the file's size

}  // namespace engine
