// DeepSeek-V2/V3 (and Kimi-K2, same GGUF arch): multi-head latent attention (q_lora and kv_lora,
// split attn_k_b / attn_v_b, RoPE on the last qk_rope dims, adjacent pairs), leading dense layers,
// sigmoid or softmax gating with the exp_probs_b selection bias and expert groups, routed weights
// renormalised and scaled, an ungated shared expert.
#include "engine/arch.h"

namespace engine {
extern const ArchTraits kArchDeepseek2{"deepseek2", false, QkNorm::None, false, false, false, true};
}
