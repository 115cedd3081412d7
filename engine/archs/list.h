// The architectures: X(factory suffix, general.architecture). One line per architecture.
X(qwen3moe, "qwen3moe")
X(olmoe, "olmoe")
X(llama, "llama")
X(qwen2moe, "qwen2moe")
X(deepseek2, "deepseek2")
X(gpt_oss, "gpt-oss")
X(glm4moe, "glm4moe")
X(kimi_k3, "kimi-k3")
