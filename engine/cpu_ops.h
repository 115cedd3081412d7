// The CPU backend: the kernels of kernels/ (the best instruction set this CPU runs) on a thread
// pool; tensors stay where they are (the mapped GGUF, the daemon's host arena).
#pragma once

#include <memory>

#include "engine/ops.h"

namespace engine {

std::unique_ptr<Ops> make_cpu_ops(int n_threads);

}  // namespace engine
