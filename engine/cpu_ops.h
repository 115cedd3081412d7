// The CPU backend: the kernels of kernels/ (the best instruction set this CPU runs) on a thread
// pool; tensors stay where they are (the mapped GGUF, the daemon's host arena). Given the model,
// it also keeps an interleaved copy (kernels' rows8) of each matrix whose type has one, which the
// matrix-vector products of decode read instead: the same bits, fewer instructions a weight.
#pragma once

#include <memory>

#include "engine/interleaved.h"  // interleaved_bytes
#include "engine/model.h"
#include "engine/ops.h"

namespace engine {

// interleave: the model whose core matrices (and, with `experts`, routed experts in the model
// file) get interleaved copies; null for none.
std::unique_ptr<Ops> make_cpu_ops(int n_threads, const Model* interleave = nullptr,
                                  bool experts = false);

}  // namespace engine
