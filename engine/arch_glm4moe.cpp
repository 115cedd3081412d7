// GLM-4.5 / GLM-4.5-Air / GLM-4.6 (glm4moe): q/k/v biases, partial NeoX RoPE, optional per-head
// q/k norms, leading dense layers, sigmoid gating with the exp_probs_b selection bias, an ungated
// shared expert, the post-attention norm before the FFN, and trailing NextN (MTP) blocks skipped.
#include "engine/arch.h"

namespace engine {
extern const ArchTraits kArchGlm4Moe{"glm4moe", true, QkNorm::None, false, true, false, false, "post_attention_norm",
                                     false, false, 0, true, true};
}
