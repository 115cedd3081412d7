// OpenAI gpt-oss: attention sinks, a sliding window on every other layer, YaRN RoPE, biases on
// every projection (experts too), top-k of the raw router logits then a softmax over those k,
// a clamped SwiGLU (alpha 1.702, limit 7), MXFP4 experts.
#include "engine/arch.h"

namespace engine {
extern const ArchTraits kArchGptOss{"gpt-oss", true, QkNorm::None, false, true, false, false, "post_attention_norm", true, true, 2};
}
