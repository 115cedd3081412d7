#include "engine/arch.h"

namespace engine {

extern const ArchTraits kArchQwen3Moe, kArchOlmoe, kArchLlama, kArchQwen2Moe, kArchDeepseek2, kArchGptOss, kArchGlm4Moe;

namespace {
const ArchTraits* const kArchs[] = {&kArchQwen3Moe, &kArchOlmoe, &kArchLlama, &kArchQwen2Moe, &kArchDeepseek2, &kArchGptOss, &kArchGlm4Moe};
}

const ArchTraits* find_arch(std::string_view name) {
  for (const ArchTraits* a : kArchs)
    if (name == a->name) return a;
  return nullptr;
}

const char* supported_archs() { return "qwen3moe, olmoe, llama (with experts), qwen2moe, deepseek2, gpt-oss, glm4moe"; }

}  // namespace engine
