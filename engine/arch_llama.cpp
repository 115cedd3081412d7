// Mixtral-style llama with experts: adjacent-pair RoPE, softmax top-k with renormalisation.
#include "engine/arch.h"

namespace engine {
extern const ArchTraits kArchLlama{"llama", false, QkNorm::None, true, false, false};
}
