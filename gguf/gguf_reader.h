// A bounds-checked GGUF reader (v2 and v3, little endian). The file is memory-mapped read-only;
// every count, length, dimension and offset is checked against the file before it is used, so a
// truncated or hostile file yields an error naming the file and the cause, never a crash.
// Split models (NAME-00001-of-00003.gguf) are opened from the first shard.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "gguf/ggml_types.h"

namespace gguf {

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

inline constexpr uint32_t kMaxDims = 4;
inline constexpr uint32_t kDefaultAlignment = 32;

struct KeyValue {
  std::string key;
  ValueType type;
  ValueType array_type = ValueType::U8;  // element type when type == ARRAY
  uint64_t array_count = 0;
  const uint8_t* value = nullptr;  // value bytes (arrays: the first element)
  std::span<const uint8_t> raw;    // the whole serialized entry, to copy it unchanged
};

struct TensorInfo {
  std::string name;
  GgmlType type;
  uint32_t n_dims = 0;
  std::array<uint64_t, kMaxDims> ne{1, 1, 1, 1};  // ne[0] is the row length (innermost)
  uint64_t n_elements = 0;
  uint64_t nbytes = 0;
  uint32_t shard = 0;        // which file of a split model holds the data
  uint64_t file_offset = 0;  // absolute offset of the data in that file
  const uint8_t* data = nullptr;
};

struct Shard {
  std::string path;
  int fd = -1;
  uint64_t size = 0;
  const uint8_t* map = nullptr;
  uint64_t data_start = 0;
  uint32_t alignment = kDefaultAlignment;
  uint64_t kv_end = 0;  // end of the key/value section (start of tensor infos)
};

class Model {
 public:
  static expertd::Result<Model> open(const std::string& path);

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  uint32_t version() const { return version_; }
  const std::vector<KeyValue>& kvs() const { return kvs_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<Shard>& shards() const { return shards_; }
  const std::string& path() const { return shards_.front().path; }
  uint32_t alignment() const { return shards_.front().alignment; }

  const KeyValue* find(std::string_view key) const;
  const TensorInfo* tensor(std::string_view name) const;
  std::optional<uint64_t> get_uint(std::string_view key) const;  // any non-negative integer
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // any numeric type
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string_view> get_string(std::string_view key) const;
  // Array accessors check the element type; nullopt when the key is absent or of another type.
  std::optional<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  std::optional<std::vector<double>> get_number_array(std::string_view key) const;
  std::string arch() const;  // general.architecture, "" when absent

 private:
  Model() = default;
  uint32_t version_ = 0;
  std::vector<Shard> shards_;
  std::vector<KeyValue> kvs_;
  std::vector<TensorInfo> tensors_;
};

// The shard file names of a split model given its first shard; {path} when not split-named.
std::vector<std::string> split_paths(const std::string& first, uint32_t count);

}  // namespace gguf
