#include "engine/factory.h"

#include <cassert>

#include "common/meminfo.h"
#include "engine/cpu_ops.h"
#ifdef EXPERTD_HAVE_CUDA_ENGINE
#include "engine/cuda_engine.h"
#endif

namespace engine {

using expertd::make_error;

expertd::Status check_spec(const EngineSpec& s) {
  if (s.device != "cpu" && s.device != "cuda")
    return make_error("unknown device '" + s.device + "' (cpu or cuda)");
#ifndef EXPERTD_HAVE_CUDA_ENGINE
  if (s.device == "cuda")
    return make_error(
        "--device cuda: this build has no CUDA tier (configure with -DEXPERTD_CUDA=ON)");
#endif
  if (s.device == "cuda" && s.kv != KvType::F32)
    return make_error(std::string("--device cuda keeps its KV cache in f32, not ") +
                      kv_type_name(s.kv) + " (--kv-type f16 is the CPU backend's)");
  return {};
}

expertd::Result<std::unique_ptr<Engine>> make_engine(const Model& m, const EngineSpec& s) {
  if (auto st = check_spec(s); !st) return st.error();
  if (s.socket.empty() && !m.has_local_experts)
    return make_error(
        "the model is a core GGUF without experts: pass --socket of the expertd "
        "serving its pack");
  std::unique_ptr<Engine> e;
  if (s.device == "cuda") {
#ifdef EXPERTD_HAVE_CUDA_ENGINE
    auto f = make_cuda_forward(m, s.socket, s.n_ctx, s.reconnect_ms, s.n_seq, s.kv);
    if (!f) return f.error();
    e = std::move(*f);
#endif
  } else {
    std::unique_ptr<ExpertSource> src;
    if (s.socket.empty()) {
      src = make_local_source(m);
    } else {
      auto d = make_daemon_source(m, s.socket, s.reconnect_ms);
      if (!d) return d.error();
      src = std::move(*d);
    }
    // The experts in the model file too where their copies fit in half the memory available
    // (the file's pages, read once to copy them, the kernel may then drop).
    const auto avail = expertd::host_available_bytes();
    const bool experts = s.socket.empty() && s.interleave && avail &&
                         interleaved_bytes(m, true) - interleaved_bytes(m, false) <= *avail / 2;
    e = std::make_unique<Engine>(m, make_cpu_ops(s.threads, s.interleave ? &m : nullptr, experts),
                                 std::move(src), s.n_ctx, s.n_seq, s.kv);
  }
  assert(e);  // check_spec refused a device this build cannot make
  if (auto st = e->ops().status(); !st) return st.error();
  e->set_prefetch(s.prefetch);
  return e;
}

}  // namespace engine
