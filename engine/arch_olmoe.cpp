// OLMoE: q/k RMSNorm over the whole projection, NeoX RoPE, softmax top-k without renormalisation.
#include "engine/arch.h"

namespace engine {
extern const ArchTraits kArchOlmoe{"olmoe", true, QkNorm::Full, false, false, false};
}
