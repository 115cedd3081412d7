// The kernels' instruction sets this CPU runs, for the CPU kernel tests.
#pragma once

#include <vector>

#include "kernels/kernels.h"

namespace kernels {

// Every backend this CPU can run, the scalar reference included.
inline std::vector<Isa> runnable_backends() {
  std::vector<Isa> v = {Isa::Scalar};
  if (best_isa() != Isa::Scalar) v.push_back(Isa::Avx2);
  if (best_isa() == Isa::Avx512) v.push_back(Isa::Avx512);
  return v;
}

}  // namespace kernels
