// Builds a GGUF v3 header (key/values and tensor infos) and lays out tensor data offsets.
// Tensor data is written by the caller at tensor_offset(i), so multi-gigabyte files stream
// without being held in memory.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "gguf/ggml_types.h"

namespace gguf {

class Writer {
 public:
  explicit Writer(uint32_t alignment = 32) : alignment_(alignment) {}

  // A serialized entry copied from a reader (KeyValue::raw): the value is kept byte for byte.
  void add_raw_kv(std::span<const uint8_t> raw) {
    kv_bytes_.insert(kv_bytes_.end(), raw.begin(), raw.end());
    ++n_kv_;
  }
  void add_u32(std::string_view key, uint32_t v);
  void add_i32(std::string_view key, int32_t v);
  void add_u64(std::string_view key, uint64_t v);
  void add_f32(std::string_view key, float v);
  void add_bool(std::string_view key, bool v);
  void add_string(std::string_view key, std::string_view v);
  void add_string_array(std::string_view key, const std::vector<std::string>& v);
  void add_f32_array(std::string_view key, const std::vector<float>& v);
  void add_i32_array(std::string_view key, const std::vector<int32_t>& v);

  // Returns the tensor's index. ne[0] is the row length.
  size_t add_tensor(std::string_view name, GgmlType type, std::vector<uint64_t> ne);

  uint64_t data_start() const;             // where tensor data begins (aligned)
  uint64_t tensor_offset(size_t i) const;  // absolute file offset of tensor i
  uint64_t tensor_bytes(size_t i) const { return tensors_[i].nbytes; }
  uint64_t file_bytes() const;          // total size once all data is written
  std::vector<uint8_t> header() const;  // magic .. tensor infos, padded to data_start

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    uint64_t nbytes;
    uint64_t rel_offset;
  };
  void put_key(std::string_view key, uint32_t type);
  template <class T>
  void put(T v);
  uint32_t alignment_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> kv_bytes_;
  std::vector<Tensor> tensors_;
  uint64_t data_bytes_ = 0;
};

}  // namespace gguf
