// The forward pass on the GPU (expert-run --device cuda): non-expert weights and the KV cache in
// VRAM, the MoE kernels of kernels/cuda/ reading experts where they live — a cuda expertd's slots
// (shared over CUDA IPC, each ordered by its slot's event) or, with --local, the model's own
// experts uploaded once (the reference path on the GPU). Activations stay float32 (the weights are
// dequantized inside the matmuls), so logits differ from the CPU engine by rounding; routing and
// greedy tokens agree where the golden data's margins allow.
#pragma once

#include <memory>
#include <string>

#include "common/result.h"
#include "engine/engine.h"

namespace engine {

// socket empty: experts from the model file, uploaded to VRAM; else from the cuda expertd there.
expertd::Result<std::unique_ptr<Forward>> make_cuda_forward(const Model& m, const std::string& socket, int n_ctx);

}  // namespace engine
