#include "gguf/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <regex>
#include <unordered_set>

#include "common/fd.h"

namespace gguf {
namespace {

using expertd::Error;
using expertd::make_error;

constexpr uint64_t kMaxTensors = 1u << 20;
constexpr uint64_t kMaxKvs = 1u << 20;
constexpr uint64_t kMaxNameBytes = 1u << 16;

// Parse failures inside this file throw ParseError; Model::open turns it into an Error value.
struct ParseError {
  std::string message;
};

class Cursor {
 public:
  Cursor(const uint8_t* begin, const uint8_t* end) : begin_(begin), p_(begin), end_(end) {}
  uint64_t offset() const { return static_cast<uint64_t>(p_ - begin_); }
  const uint8_t* pos() const { return p_; }
  uint64_t remaining() const { return static_cast<uint64_t>(end_ - p_); }
  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      throw ParseError{std::string("truncated: ") + what + " at offset " +
                       std::to_string(offset()) + " needs " + std::to_string(n) +
                       " bytes, file has " + std::to_string(remaining()) + " left"};
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string_view read_string(const char* what, uint64_t max_bytes) {
    uint64_t n = read<uint64_t>(what);
    if (n > max_bytes)
      throw ParseError{std::string(what) + " length " + std::to_string(n) + " is implausible"};
    need(n, what);
    std::string_view s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  void skip(uint64_t n, const char* what) {
    need(n, what);
    p_ += n;
  }

 private:
  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
};

uint64_t scalar_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    default:
      return 0;
  }
}

void skip_value(Cursor& c, ValueType t, int depth) {
  if (uint64_t n = scalar_bytes(t)) return c.skip(n, "value");
  if (t == ValueType::STRING) {
    c.read_string("string value", c.remaining());
    return;
  }
  if (t != ValueType::ARRAY || depth > 1)
    throw ParseError{"unknown value type " + std::to_string(static_cast<uint32_t>(t))};
  auto et = static_cast<ValueType>(c.read<uint32_t>("array type"));
  uint64_t count = c.read<uint64_t>("array count");
  if (uint64_t eb = scalar_bytes(et)) {
    if (count > c.remaining() / eb)
      throw ParseError{"array of " + std::to_string(count) + " elements overruns the file"};
    return c.skip(count * eb, "array");
  }
  if (count > c.remaining() / 8)
    throw ParseError{"array count " + std::to_string(count) + " overruns the file"};
  for (uint64_t i = 0; i < count; ++i) skip_value(c, et, depth + 1);
}

struct Mapping {
  int fd = -1;
  uint64_t size = 0;
  const uint8_t* map = nullptr;
};

expertd::Result<Mapping> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return expertd::errno_error("open " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return expertd::errno_error("stat " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(path + ": not a regular file");
  }
  Mapping m{fd, static_cast<uint64_t>(st.st_size), nullptr};
  if (m.size > 0) {
    void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return expertd::errno_error("mmap " + path);
    }
    m.map = static_cast<const uint8_t*>(p);
  }
  return m;
}

// Parses one shard's header, key/values and tensor infos; appends to kvs/tensors.
void parse_shard(Shard& s, uint32_t shard_index, uint32_t& version, std::vector<KeyValue>* kvs,
                 std::vector<TensorInfo>& tensors) {
  Cursor c(s.map, s.map + s.size);
  if (s.size < 4 || std::memcmp(s.map, "GGUF", 4) != 0)
    throw ParseError{"not a GGUF file (bad magic)"};
  c.skip(4, "magic");
  version = c.read<uint32_t>("version");
  if (version < 2 || version > 3)
    throw ParseError{"unsupported GGUF version " + std::to_string(version) + " (need 2 or 3)"};
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("key/value count");
  if (n_tensors > kMaxTensors)
    throw ParseError{"tensor count " + std::to_string(n_tensors) + " is implausible"};
  if (n_kv > kMaxKvs)
    throw ParseError{"key/value count " + std::to_string(n_kv) + " is implausible"};
  std::vector<KeyValue> local;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint8_t* start = c.pos();
    KeyValue kv;
    kv.key = std::string(c.read_string("key", kMaxNameBytes));
    kv.type = static_cast<ValueType>(c.read<uint32_t>("value type"));
    if (kv.type == ValueType::ARRAY) {
      Cursor peek = c;
      kv.array_type = static_cast<ValueType>(peek.read<uint32_t>("array type"));
      kv.array_count = peek.read<uint64_t>("array count");
      kv.value = peek.pos();
    } else {
      kv.value = c.pos();
    }
    skip_value(c, kv.type, 0);
    kv.raw = std::span<const uint8_t>(start, c.pos());
    if (kv.key == "general.alignment") {
      if (kv.type != ValueType::U32) throw ParseError{"general.alignment is not a uint32"};
      uint32_t a;
      std::memcpy(&a, kv.value, 4);
      if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 20))
        throw ParseError{"general.alignment " + std::to_string(a) + " is not a power of two"};
      s.alignment = a;
    }
    local.push_back(std::move(kv));
  }
  s.kv_end = c.offset();
  std::vector<TensorInfo> infos;
  std::unordered_set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = std::string(c.read_string("tensor name", kMaxNameBytes));
    if (!names.insert(t.name).second) throw ParseError{"duplicate tensor name " + t.name};
    t.n_dims = c.read<uint32_t>("tensor n_dims");
    if (t.n_dims == 0 || t.n_dims > kMaxDims)
      throw ParseError{"tensor " + t.name + ": " + std::to_string(t.n_dims) + " dimensions"};
    t.n_elements = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      t.ne[d] = c.read<uint64_t>("tensor dimension");
      if (t.ne[d] == 0 || __builtin_mul_overflow(t.n_elements, t.ne[d], &t.n_elements) ||
          t.n_elements > (uint64_t{1} << 50))
        throw ParseError{"tensor " + t.name + ": implausible dimensions"};
    }
    uint32_t type_id = c.read<uint32_t>("tensor type");
    const TypeTraits* tr = type_traits(type_id);
    if (!tr)
      throw ParseError{"tensor " + t.name + ": unknown ggml type " + std::to_string(type_id)};
    t.type = static_cast<GgmlType>(tr->id);
    auto rb = row_bytes(t.type, t.ne[0]);
    if (!rb)
      throw ParseError{"tensor " + t.name + ": row length " + std::to_string(t.ne[0]) +
                       " is not a multiple of the " + std::string(tr->name) + " block size " +
                       std::to_string(tr->block_elems)};
    t.nbytes = *rb * (t.n_elements / t.ne[0]);
    t.file_offset = c.read<uint64_t>("tensor offset");  // relative until data_start is known
    t.shard = shard_index;
    infos.push_back(std::move(t));
  }
  s.data_start = expertd::round_up(c.offset(), s.alignment);
  for (auto& t : infos) {
    if (t.file_offset % s.alignment != 0)
      throw ParseError{"tensor " + t.name + ": offset " + std::to_string(t.file_offset) +
                       " is not aligned to " + std::to_string(s.alignment)};
    uint64_t abs = s.data_start + t.file_offset, end = 0;
    if (t.file_offset > s.size || __builtin_add_overflow(abs, t.nbytes, &end) || end > s.size)
      throw ParseError{"tensor " + t.name + ": data [" + std::to_string(abs) + ", +" +
                       std::to_string(t.nbytes) + ") lies beyond the end of the file (" +
                       std::to_string(s.size) + " bytes): truncated or corrupt"};
    t.file_offset = abs;
    t.data = s.map + abs;
  }
  if (kvs) *kvs = std::move(local);
  for (auto& t : infos) tensors.push_back(std::move(t));
}

}  // namespace

std::vector<std::string> split_paths(const std::string& first, uint32_t count) {
  static const std::regex re(R"((.*)-(\d{5})-of-(\d{5})\.gguf$)");
  std::smatch m;
  if (count <= 1 || !std::regex_match(first, m, re)) return {first};
  std::vector<std::string> out;
  for (uint32_t i = 1; i <= count; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "-%05u-of-%05u.gguf", i, count);
    out.push_back(m[1].str() + buf);
  }
  return out;
}

expertd::Result<Model> Model::open(const std::string& path) {
  Model model;
  auto add_shard = [&](const std::string& p, uint32_t index) -> expertd::Status {
    auto m = map_file(p);
    if (!m) return m.error();
    Shard s;
    s.path = p;
    s.fd = m->fd;
    s.size = m->size;
    s.map = m->map;
    model.shards_.push_back(s);
    try {
      uint32_t version = 0;
      parse_shard(model.shards_.back(), index, version, index == 0 ? &model.kvs_ : nullptr,
                  model.tensors_);
      if (index == 0) model.version_ = version;
    } catch (const ParseError& e) {
      return make_error(p + ": " + e.message);
    }
    return {};
  };
  if (auto st = add_shard(path, 0); !st) return st.error();
  uint64_t count = model.get_uint("split.count").value_or(1);
  if (count > 1) {
    if (count > 10000)
      return make_error(path + ": split.count " + std::to_string(count) + " is implausible");
    auto paths = split_paths(path, static_cast<uint32_t>(count));
    if (paths.size() != count)
      return make_error(path + ": split.count is " + std::to_string(count) +
                        " but the name is not NAME-00001-of-NNNNN.gguf");
    if (paths.front() != path)
      return make_error(path + ": pass the first shard (" + paths.front() + ")");
    for (uint32_t i = 1; i < count; ++i)
      if (auto st = add_shard(paths[i], i); !st) return st.error();
  }
  std::unordered_set<std::string_view> names;
  for (const auto& t : model.tensors_)
    if (!names.insert(t.name).second)
      return make_error(path + ": tensor " + t.name + " appears in two shards");
  if (auto n = model.get_uint("split.tensors.count"); n && *n != model.tensors_.size())
    return make_error(path + ": split.tensors.count says " + std::to_string(*n) + " tensors, " +
                      std::to_string(model.tensors_.size()) + " found in the shards");
  return model;
}

Model::Model(Model&& o) noexcept
    : version_(o.version_),
      shards_(std::move(o.shards_)),
      kvs_(std::move(o.kvs_)),
      tensors_(std::move(o.tensors_)) {
  o.shards_.clear();
}

Model& Model::operator=(Model&& o) noexcept {
  if (this != &o) {
    this->~Model();
    new (this) Model(std::move(o));
  }
  return *this;
}

Model::~Model() {
  for (auto& s : shards_) {
    if (s.map) ::munmap(const_cast<uint8_t*>(s.map), s.size);
    if (s.fd >= 0) ::close(s.fd);
  }
}

const KeyValue* Model::find(std::string_view key) const {
  for (const auto& kv : kvs_)
    if (kv.key == key) return &kv;
  return nullptr;
}

const TensorInfo* Model::tensor(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {
template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::optional<double> number_at(ValueType t, const uint8_t* p) {
  switch (t) {
    case ValueType::U8:
      return load<uint8_t>(p);
    case ValueType::I8:
      return load<int8_t>(p);
    case ValueType::U16:
      return load<uint16_t>(p);
    case ValueType::I16:
      return load<int16_t>(p);
    case ValueType::U32:
      return load<uint32_t>(p);
    case ValueType::I32:
      return load<int32_t>(p);
    case ValueType::F32:
      return load<float>(p);
    case ValueType::U64:
      return static_cast<double>(load<uint64_t>(p));
    case ValueType::I64:
      return static_cast<double>(load<int64_t>(p));
    case ValueType::F64:
      return load<double>(p);
    case ValueType::BOOL:
      return load<uint8_t>(p) ? 1.0 : 0.0;
    default:
      return std::nullopt;
  }
}
}  // namespace

std::optional<int64_t> Model::get_int(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (!kv) return std::nullopt;
  switch (kv->type) {
    case ValueType::U8:
      return load<uint8_t>(kv->value);
    case ValueType::I8:
      return load<int8_t>(kv->value);
    case ValueType::U16:
      return load<uint16_t>(kv->value);
    case ValueType::I16:
      return load<int16_t>(kv->value);
    case ValueType::U32:
      return load<uint32_t>(kv->value);
    case ValueType::I32:
      return load<int32_t>(kv->value);
    case ValueType::U64:
      return static_cast<int64_t>(load<uint64_t>(kv->value));
    case ValueType::I64:
      return load<int64_t>(kv->value);
    default:
      return std::nullopt;
  }
}

std::optional<uint64_t> Model::get_uint(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (kv && kv->type == ValueType::U64) return load<uint64_t>(kv->value);
  auto v = get_int(key);
  if (!v || *v < 0) return std::nullopt;
  return static_cast<uint64_t>(*v);
}

std::optional<double> Model::get_float(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (!kv) return std::nullopt;
  return number_at(kv->type, kv->value);
}

std::optional<bool> Model::get_bool(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (!kv || kv->type != ValueType::BOOL) return std::nullopt;
  return load<uint8_t>(kv->value) != 0;
}

std::optional<std::string_view> Model::get_string(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (!kv || kv->type != ValueType::STRING) return std::nullopt;
  uint64_t n = load<uint64_t>(kv->value);
  return std::string_view(reinterpret_cast<const char*>(kv->value + 8), n);
}

std::optional<std::vector<std::string_view>> Model::get_string_array(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (!kv || kv->type != ValueType::ARRAY || kv->array_type != ValueType::STRING)
    return std::nullopt;
  std::vector<std::string_view> out;
  out.reserve(kv->array_count);
  const uint8_t* p = kv->value;  // bounds were checked while parsing
  for (uint64_t i = 0; i < kv->array_count; ++i) {
    uint64_t n = load<uint64_t>(p);
    out.emplace_back(reinterpret_cast<const char*>(p + 8), n);
    p += 8 + n;
  }
  return out;
}

std::optional<std::vector<double>> Model::get_number_array(std::string_view key) const {
  const KeyValue* kv = find(key);
  if (!kv || kv->type != ValueType::ARRAY) return std::nullopt;
  uint64_t eb = scalar_bytes(kv->array_type);
  if (eb == 0) return std::nullopt;
  std::vector<double> out(kv->array_count);
  for (uint64_t i = 0; i < kv->array_count; ++i)
    out[i] = *number_at(kv->array_type, kv->value + i * eb);
  return out;
}

std::string Model::arch() const {
  return std::string(get_string("general.architecture").value_or(""));
}

}  // namespace gguf
