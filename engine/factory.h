// One place an engine is assembled, for expert-run, expert-serve and its workers: the backend
// (CPU or CUDA), the expert source (the model file, or expertd), the caches.
#pragma once

#include <memory>
#include <string>

#include "common/result.h"
#include "engine/engine.h"

namespace engine {

struct EngineSpec {
  std::string device = "cpu";  // cpu | cuda
  std::string socket;          // expertd's; empty: the experts from the model file
  int threads = 1;             // the CPU backend's
  int n_ctx = 4096, n_seq = 1;
  KvType kv = KvType::F32;
  int reconnect_ms = 0;  // a lost expertd: wait this long for it to come back (0: fail at once)
  bool prefetch = false;
  // The CPU backend's interleaved copies of the core matrices (kernels' rows8): decode faster,
  // the same bits, the copies' memory (about the core's bytes of those types) added.
  bool interleave = true;
};

// Errors name the cause: a core GGUF without --socket, a build without the CUDA tier, a device
// or daemon that cannot be had, a cache type the backend does not keep.
expertd::Result<std::unique_ptr<Engine>> make_engine(const Model& m, const EngineSpec& spec);

// What can be known wrong about a spec before any device or daemon is asked (a program checks it
// at start, where a server would otherwise retry a spec that can never work): the device's name,
// a build without the CUDA tier, a cache type the device's backend does not keep.
expertd::Status check_spec(const EngineSpec& spec);

}  // namespace engine
