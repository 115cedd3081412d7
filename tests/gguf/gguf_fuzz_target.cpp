// Fuzz entry for the GGUF reader and everything that reads a model from it (engine model
// loader, tokenizer). Built as a libFuzzer target with -DEXPERTD_FUZZ=ON (clang), and driven
// by seeded mutations in the normal test suite (gguf_fuzz_test.cpp).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/model.h"
#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = ::memfd_create("gguf-fuzz", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (auto m = gguf::Model::open(path)) {
    (void)m->arch();
    for (const auto& kv : m->kvs()) {
      (void)m->get_string_array(kv.key);
      (void)m->get_number_array(kv.key);
      (void)m->get_float(kv.key);
    }
    if (auto model = engine::Model::load(*m)) (void)model->hp.n_layer;
    if (auto tok = engine::Tokenizer::load(*m)) {
      auto ids = tok->encode("Hello, fuzz <|im_start|> 123", true, true);
      for (int32_t id : ids) (void)tok->piece(id);
    }
  }
  ::close(fd);
  return 0;
}
