// Qwen3-MoE: GQA, per-head q/k RMSNorm, NeoX RoPE, softmax top-k with renormalised weights.
#include "engine/arch.h"

namespace engine {
extern const ArchTraits kArchQwen3Moe{"qwen3moe", true, QkNorm::PerHead, true, false, false};
}
