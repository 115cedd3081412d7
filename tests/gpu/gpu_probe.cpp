// An engine process for the GPU arena tests: connects to a cuda-backend expertd, acquires experts,
// makes its stream wait on each slot's interprocess event, copies every slot back to the host and
// checks it against the pack manifest's xxh3. Prints "ok <experts checked>" or the first mismatch.
//   gpu_probe SOCKET MANIFEST LAYER ROUNDS CHUNK
// Each round walks every expert of LAYER in acquires of CHUNK experts.
#include <cuda_runtime.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "client/cuda_slots.h"
#include "proto/pack_format.h"

using namespace expertd;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: gpu_probe SOCKET MANIFEST LAYER ROUNDS CHUNK\n");
    return 2;
  }
  const std::string socket = argv[1], manifest_path = argv[2];
  const uint32_t layer = std::atoi(argv[3]), rounds = std::atoi(argv[4]),
                 chunk = std::atoi(argv[5]);
  auto m = pack::load_manifest(manifest_path);
  if (!m) return std::fprintf(stderr, "%s\n", m.error().message.c_str()), 1;
  auto c = client::Client::connect(socket, {"gpu_probe", 20000});
  if (!c) return std::fprintf(stderr, "%s\n", c.error().message.c_str()), 1;
  auto slots = client::CudaSlots::open((*c)->info());
  if (!slots) return std::fprintf(stderr, "%s\n", slots.error().message.c_str()), 1;
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return std::fprintf(stderr, "stream\n"), 1;
  const uint64_t stride = m->layers[layer].stride;
  std::vector<uint8_t> host(stride * chunk);
  uint64_t checked = 0;
  for (uint32_t r = 0; r < rounds; ++r) {
    for (uint32_t e0 = 0; e0 < m->n_experts; e0 += chunk) {
      std::vector<uint32_t> ids;
      // The same cyclic order every round: with fewer slots than experts, an LRU cache misses
      // every time (alternating directions would hit on the experts a round ended with).
      for (uint32_t e = e0; e < std::min(m->n_experts, e0 + chunk); ++e) ids.push_back(e);
      auto l = (*c)->acquire(layer, ids);
      if (!l) return std::fprintf(stderr, "acquire: %s\n", l.error().message.c_str()), 1;
      if (auto st = (*c)->wait_ready(*l); !st)
        return std::fprintf(stderr, "ready: %s\n", st.error().message.c_str()), 1;
      // No host wait on the copies: the stream waits on the slots' events, then reads them.
      if (auto st = (*slots)->wait(stream, *l); !st)
        return std::fprintf(stderr, "%s\n", st.error().message.c_str()), 1;
      for (size_t i = 0; i < ids.size(); ++i)
        if (cudaMemcpyAsync(host.data() + i * stride, (*slots)->slot_ptr(l->slots[i]), stride,
                            cudaMemcpyDeviceToHost, stream) != cudaSuccess)
          return std::fprintf(stderr, "copy back failed\n"), 1;
      if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
        return std::fprintf(stderr, "stream: %s\n", cudaGetErrorString(e)), 1;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (XXH3_64bits(host.data() + i * stride, stride) != m->layers[layer].checksums[ids[i]])
          return std::printf("mismatch layer %u expert %u slot %u\n", layer, ids[i], l->slots[i]),
                 1;
        ++checked;
      }
      if (auto st = (*c)->release(*l); !st)
        return std::fprintf(stderr, "release: %s\n", st.error().message.c_str()), 1;
    }
  }
  std::printf("ok %llu\n", static_cast<unsigned long long>(checked));
  return 0;
}
