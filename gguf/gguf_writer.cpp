#include "gguf/gguf_writer.h"

#include <cassert>
#include <cstring>

#include "common/fd.h"
#include "gguf/gguf_reader.h"

namespace gguf {

template <class T>
void Writer::put(T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  kv_bytes_.insert(kv_bytes_.end(), b, b + sizeof(T));
}

void Writer::put_key(std::string_view key, uint32_t type) {
  put<uint64_t>(key.size());
  kv_bytes_.insert(kv_bytes_.end(), key.begin(), key.end());
  put<uint32_t>(type);
  ++n_kv_;
}

void Writer::add_u32(std::string_view key, uint32_t v) {
  put_key(key, static_cast<uint32_t>(ValueType::U32));
  put(v);
}
void Writer::add_i32(std::string_view key, int32_t v) {
  put_key(key, static_cast<uint32_t>(ValueType::I32));
  put(v);
}
void Writer::add_u64(std::string_view key, uint64_t v) {
  put_key(key, static_cast<uint32_t>(ValueType::U64));
  put(v);
}
void Writer::add_f32(std::string_view key, float v) {
  put_key(key, static_cast<uint32_t>(ValueType::F32));
  put(v);
}
void Writer::add_bool(std::string_view key, bool v) {
  put_key(key, static_cast<uint32_t>(ValueType::BOOL));
  put<uint8_t>(v ? 1 : 0);
}
void Writer::add_string(std::string_view key, std::string_view v) {
  put_key(key, static_cast<uint32_t>(ValueType::STRING));
  put<uint64_t>(v.size());
  kv_bytes_.insert(kv_bytes_.end(), v.begin(), v.end());
}
void Writer::add_string_array(std::string_view key, const std::vector<std::string>& v) {
  put_key(key, static_cast<uint32_t>(ValueType::ARRAY));
  put<uint32_t>(static_cast<uint32_t>(ValueType::STRING));
  put<uint64_t>(v.size());
  for (const auto& s : v) {
    put<uint64_t>(s.size());
    kv_bytes_.insert(kv_bytes_.end(), s.begin(), s.end());
  }
}
void Writer::add_f32_array(std::string_view key, const std::vector<float>& v) {
  put_key(key, static_cast<uint32_t>(ValueType::ARRAY));
  put<uint32_t>(static_cast<uint32_t>(ValueType::F32));
  put<uint64_t>(v.size());
  for (float f : v) put(f);
}
void Writer::add_i32_array(std::string_view key, const std::vector<int32_t>& v) {
  put_key(key, static_cast<uint32_t>(ValueType::ARRAY));
  put<uint32_t>(static_cast<uint32_t>(ValueType::I32));
  put<uint64_t>(v.size());
  for (int32_t x : v) put(x);
}

size_t Writer::add_tensor(std::string_view name, GgmlType type, std::vector<uint64_t> ne) {
  assert(!ne.empty() && ne.size() <= kMaxDims);
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
  auto rb = row_bytes(type, ne[0]);
  assert(rb.has_value());
  Tensor t{std::string(name), type, std::move(ne), *rb * rows, data_bytes_};
  data_bytes_ = expertd::round_up(data_bytes_ + t.nbytes, alignment_);
  tensors_.push_back(std::move(t));
  return tensors_.size() - 1;
}

uint64_t Writer::data_start() const {
  uint64_t n = 4 + 4 + 8 + 8 + kv_bytes_.size();
  for (const auto& t : tensors_) n += 8 + t.name.size() + 4 + 8 * t.ne.size() + 4 + 8;
  return expertd::round_up(n, alignment_);
}

uint64_t Writer::tensor_offset(size_t i) const {
  return data_start() + tensors_[i].rel_offset;
}

uint64_t Writer::file_bytes() const {
  return data_start() + data_bytes_;
}

// Written into a buffer of its final size (data_start() counts every byte appended here): no
// growth inside the loop, which also keeps GCC 12's -Wstringop-overflow false positive on an
// inlined vector::insert away from Release builds.
std::vector<uint8_t> Writer::header() const {
  std::vector<uint8_t> out(data_start(), 0);
  size_t at = 0;
  auto app = [&](const void* p, size_t n) {
    assert(at + n <= out.size());
    std::memcpy(out.data() + at, p, n);
    at += n;
  };
  auto app64 = [&](uint64_t v) { app(&v, 8); };
  auto app32 = [&](uint32_t v) { app(&v, 4); };
  app("GGUF", 4);
  app32(3);
  app64(tensors_.size());
  app64(n_kv_);
  app(kv_bytes_.data(), kv_bytes_.size());
  for (const auto& t : tensors_) {
    app64(t.name.size());
    app(t.name.data(), t.name.size());
    app32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) app64(d);
    app32(static_cast<uint32_t>(t.type));
    app64(t.rel_offset);
  }
  return out;
}

}  // namespace gguf
