// The forward pass on the GPU (expert-run --device cuda): the one forward (engine/engine.h)
// over the CUDA backend (engine/cuda_ops.cpp).
#pragma once

#include <memory>
#include <string>

#include "common/result.h"
#include "engine/engine.h"

namespace engine {

// socket empty: experts from the model file, uploaded to VRAM; else from the cuda expertd there.
// n_seq sequences of n_ctx positions each (Engine's batched eval), their caches in kv (an error
// for a type the backend does not keep).
expertd::Result<std::unique_ptr<Forward>> make_cuda_forward(const Model& m,
                                                            const std::string& socket, int n_ctx,
                                                            int reconnect_ms = 0, int n_seq = 1,
                                                            KvType kv = KvType::F32);

// The CUDA backend alone, with every tensor of m.weights uploaded (the per-op sweep's: its weights
// in a Model of no layers).
expertd::Result<std::unique_ptr<Ops>> make_cuda_ops(const Model& m);

}  // namespace engine
