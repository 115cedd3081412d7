#include "engine/state_file.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace engine {

using expertd::errno_error;
using expertd::make_error;

namespace {

constexpr char kMagic[8] = {'E', 'X', 'P', 'S', 'T', 'A', 'T', '2'};  // 2: n_bytes

struct Header {
  char magic[8];
  uint64_t model_id, n_tokens, n_past, n_bytes, payload_xxh3;
};

}  // namespace

expertd::Result<uint64_t> model_identity(const std::string& path, KvType kv, bool nextn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno_error("cannot read " + path);
  std::string head(size_t{16} << 20, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(in.gcount()));
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return make_error(path + ": " + ec.message());
  const uint64_t id = XXH3_64bits_withSeed(head.data(), head.size(), size);
  // F32 states keep the identity they always had; another type's differ from it, and so do the
  // states that carry the NextN block's cache.
  const uint64_t typed = kv == KvType::F32 ? id : XXH3_64bits_withSeed(kv_type_name(kv), 3, id);
  return nextn ? XXH3_64bits_withSeed("nextn", 5, typed) : typed;
}

expertd::Status save_state_file(const std::string& path, uint64_t model_id,
                                std::span<const int32_t> tokens, const SeqState& s) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.model_id = model_id, h.n_tokens = tokens.size(), h.n_past = uint64_t(s.n_past);
  h.n_bytes = s.data.size();
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, tokens.data(), tokens.size_bytes());
  XXH3_64bits_update(st, s.data.data(), s.bytes());
  h.payload_xxh3 = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return errno_error("cannot write the prompt cache " + tmp);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size_bytes()));
    out.write(reinterpret_cast<const char*>(s.data.data()), std::streamsize(s.bytes()));
    if (!out.flush()) return errno_error("cannot write the prompt cache " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return errno_error("cannot rename " + tmp + " to " + path);
  return {};
}

expertd::Result<StateFile> load_state_file(const std::string& path, uint64_t model_id) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno_error("cannot read the prompt cache " + path);
  Header h{};
  in.read(reinterpret_cast<char*>(&h), sizeof h);
  if (!in || std::memcmp(h.magic, kMagic, sizeof kMagic) != 0)
    return make_error(path + " is not a prompt cache (expert-run --prompt-cache writes them)");
  if (h.model_id != model_id)
    return make_error("the prompt cache " + path +
                      " is of another model (or another --kv-type); remove it or give "
                      "another file");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || h.n_tokens > size || h.n_bytes > size || size != sizeof h + h.n_tokens * 4 + h.n_bytes)
    return make_error("the prompt cache " + path + " is truncated or damaged (its size)");
  StateFile f;
  f.tokens.resize(h.n_tokens);
  f.state.n_past = int(h.n_past);
  f.state.data.resize(h.n_bytes);
  in.read(reinterpret_cast<char*>(f.tokens.data()), std::streamsize(h.n_tokens * 4));
  in.read(reinterpret_cast<char*>(f.state.data.data()), std::streamsize(h.n_bytes));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, f.tokens.data(), h.n_tokens * 4);
  XXH3_64bits_update(st, f.state.data.data(), h.n_bytes);
  const uint64_t sum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (!in || sum != h.payload_xxh3 || h.n_past != h.n_tokens)
    return make_error("the prompt cache " + path + " is damaged (its checksum)");
  return f;
}

}  // namespace engine
