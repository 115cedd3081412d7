#include "pack/builder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <regex>
#include <thread>

#include "common/fd.h"
#include "gguf/gguf_writer.h"
#include "kernels/kernels.h"
#include "pack/progress.h"

namespace expertd::pack {
namespace {

// Expert tensors follow llama.cpp's naming: blk.N.ffn_{gate,up,down,gate_up}_exps.{weight,bias}
const std::regex kExpertTensor(R"(blk\.(\d+)\.ffn_(gate_up|gate|up|down)_exps\.(weight|bias))");

std::optional<Role> expert_role(const std::string& name, uint32_t* layer) {
  std::smatch m;
  if (!std::regex_match(name, m, kExpertTensor)) return std::nullopt;
  *layer = static_cast<uint32_t>(std::stoul(m[1].str()));
  std::string r = m[2].str() + (m[3].str() == "bias" ? "_bias" : "");
  return role_from_name(r);
}

std::string dir_of(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

std::string abs_path(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

// Removes temporary outputs unless disarmed: no half-written pack is ever left looking valid.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const auto& p : paths) ::unlink(p.c_str());
  }
};

struct Batch {
  AlignedBuffer buf;
  uint32_t layer = 0, first = 0, count = 0;
  uint64_t bytes = 0;
  Status status;
};

}  // namespace

std::string model_stem(const std::string& path) {
  std::string base = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  static const std::regex split(R"((.*)-\d{5}-of-\d{5}\.gguf$)");
  std::smatch m;
  if (std::regex_match(base, m, split)) return m[1].str();
  if (base.size() > 5 && base.ends_with(".gguf")) return base.substr(0, base.size() - 5);
  return base;
}

uint64_t source_identity(const gguf::Model& model) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const auto& s : model.shards()) {
    XXH3_64bits_update(st, s.map, s.data_start);
    XXH3_64bits_update(st, &s.size, sizeof s.size);
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

uint64_t source_role_bytes(const RoleLayout& r) {
  return kernels::row_size(r.ggml_type, static_cast<int64_t>(r.ne[0])) * r.ne[1];
}

Result<Manifest> plan_layout(const gguf::Model& model, Layout layout) {
  const std::string& path = model.path();
  std::map<uint32_t, std::vector<RoleLayout>> by_layer;
  uint64_t n_experts = 0;
  for (const auto& t : model.tensors()) {
    uint32_t layer = 0;
    auto role = expert_role(t.name, &layer);
    if (!role) continue;  // NextN blocks' experts too: NextN drafting reads them
    bool bias = role >= Role::GateBias;
    uint32_t expert_dim = bias ? 1 : 2;
    if (t.n_dims != expert_dim + 1)
      return make_error(path + ": expert tensor " + t.name + " has " + std::to_string(t.n_dims) +
                        " dimensions, expected " + std::to_string(expert_dim + 1));
    uint64_t e = t.ne[expert_dim];
    if (n_experts && e != n_experts)
      return make_error(path + ": expert tensor " + t.name + " has " + std::to_string(e) +
                        " experts, other layers have " + std::to_string(n_experts));
    n_experts = e;
    RoleLayout r;
    r.role = *role;
    r.ggml_type = static_cast<uint32_t>(t.type);
    r.ne = {t.ne[0], bias ? 1 : t.ne[1]};
    r.bytes = t.nbytes / e;
    r.tensor = t.name;
    if (layout == Layout::Rows8 && !bias && kernels::rows8_supported(r.ggml_type) &&
        r.ne[1] % 8 == 0 && r.ne[0] % 256 == 0 && r.bytes == source_role_bytes(r)) {
      r.layout = Layout::Rows8;
      r.bytes = kernels::rows8_bytes(r.ggml_type, static_cast<int64_t>(r.ne[1]),
                                     static_cast<int64_t>(r.ne[0]));
    }
    by_layer[layer].push_back(std::move(r));
  }
  if (by_layer.empty())
    return make_error(path + ": not a MoE model: no blk.N.ffn_{gate,up,down,gate_up}_exps tensors");
  std::string arch = model.arch();
  if (auto declared = model.get_uint(arch + ".expert_count"); declared && *declared != n_experts)
    return make_error(path + ": " + arch + ".expert_count is " + std::to_string(*declared) +
                      " but the expert tensors hold " + std::to_string(n_experts));
  if (n_experts > (1u << 16))
    return make_error(path + ": implausible expert count " + std::to_string(n_experts));
  Manifest m;
  m.arch = arch;
  m.model_name = std::string(model.get_string("general.name").value_or(""));
  m.n_experts = static_cast<uint32_t>(n_experts);
  m.n_experts_used = static_cast<uint32_t>(model.get_uint(arch + ".expert_used_count").value_or(0));
  m.model_id = source_identity(model);
  for (auto& [layer, roles] : by_layer) {
    std::sort(roles.begin(), roles.end(),
              [](const auto& a, const auto& b) { return a.role < b.role; });
    bool has_gate_up = false, has_down = false;
    for (const auto& r : roles) {
      has_gate_up |= r.role == Role::GateUp || r.role == Role::Up;
      has_down |= r.role == Role::Down;
    }
    if (!has_gate_up || !has_down)
      return make_error(path + ": layer " + std::to_string(layer) +
                        " has expert tensors but lacks ffn_up/gate_up_exps or ffn_down_exps");
    LayerLayout l;
    l.model_layer = layer;
    l.roles = std::move(roles);
    l.checksums.assign(m.n_experts, 0);
    m.layers.push_back(std::move(l));
  }
  lay_out(m);
  return m;
}

namespace {

// Fills `b` with consecutive blocks of one layer, read from the source GGUF.
Status fill_batch(const gguf::Model& model, const Manifest& m, Batch& b) {
  const LayerLayout& l = m.layers[b.layer];
  std::memset(b.buf.data(), 0, b.bytes);
  std::vector<uint8_t> rows;  // a Rows8 role's source rows
  for (const auto& r : l.roles) {
    const gguf::TensorInfo* t = model.tensor(r.tensor);
    const gguf::Shard& s = model.shards()[t->shard];
    const uint64_t src_bytes = source_role_bytes(r);
    for (uint32_t i = 0; i < b.count; ++i) {
      uint64_t src = t->file_offset + uint64_t{b.first + i} * src_bytes;
      uint8_t* dst = b.buf.data() + uint64_t{i} * l.stride + r.offset;
      if (r.layout == Layout::Rows) {
        EXPERTD_TRY(pread_full(s.fd, dst, r.bytes, src, s.path));
        continue;
      }
      rows.resize(src_bytes);
      EXPERTD_TRY(pread_full(s.fd, rows.data(), src_bytes, src, s.path));
      kernels::rows8_pack(r.ggml_type, rows.data(), static_cast<int64_t>(r.ne[1]),
                          static_cast<int64_t>(r.ne[0]), dst);
    }
    // The source is read once: keep it out of the page cache.
    ::posix_fadvise(s.fd, static_cast<off_t>(t->file_offset + uint64_t{b.first} * src_bytes),
                    static_cast<off_t>(uint64_t{b.count} * src_bytes), POSIX_FADV_DONTNEED);
  }
  return {};
}

Status write_core(const gguf::Model& model, const Manifest& m, const std::string& path,
                  uint64_t* bytes_out) {
  gguf::Writer w(model.alignment());
  for (const auto& kv : model.kvs())
    if (!kv.key.starts_with("split.")) w.add_raw_kv(kv.raw);
  w.add_string("expertpack.model_id", hex64(m.model_id));
  w.add_u32("expertpack.n_moe_layers", static_cast<uint32_t>(m.layers.size()));
  std::vector<const gguf::TensorInfo*> kept;
  for (const auto& t : model.tensors()) {
    uint32_t layer;
    if (expert_role(t.name, &layer)) continue;
    std::vector<uint64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    w.add_tensor(t.name, t.type, ne);
    kept.push_back(&t);
  }
  auto fd = open_file(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd) return fd.error();
  auto header = w.header();
  EXPERTD_TRY(pwrite_full(fd->get(), header.data(), header.size(), 0, path));
  std::vector<uint8_t> buf(8u << 20);
  for (size_t i = 0; i < kept.size(); ++i) {
    const gguf::TensorInfo* t = kept[i];
    const gguf::Shard& s = model.shards()[t->shard];
    for (uint64_t done = 0; done < t->nbytes;) {
      uint64_t n = std::min<uint64_t>(buf.size(), t->nbytes - done);
      EXPERTD_TRY(pread_full(s.fd, buf.data(), n, t->file_offset + done, s.path));
      EXPERTD_TRY(pwrite_full(fd->get(), buf.data(), n, w.tensor_offset(i) + done, path));
      done += n;
    }
    // Read once, written once: neither stays in the page cache (written pages once on disk).
    ::posix_fadvise(s.fd, static_cast<off_t>(t->file_offset), static_cast<off_t>(t->nbytes),
                    POSIX_FADV_DONTNEED);
    const auto out = static_cast<off64_t>(w.tensor_offset(i));
    ::sync_file_range(
        fd->get(), out, static_cast<off64_t>(t->nbytes),
        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::posix_fadvise(fd->get(), out, static_cast<off_t>(t->nbytes), POSIX_FADV_DONTNEED);
  }
  if (::ftruncate(fd->get(), static_cast<off_t>(w.file_bytes())) != 0)
    return errno_error("truncate " + path);
  if (::fdatasync(fd->get()) != 0) return errno_error("sync " + path);
  ::posix_fadvise(fd->get(), 0, 0, POSIX_FADV_DONTNEED);
  *bytes_out = w.file_bytes();
  return {};
}

Status write_text_file(const std::string& path, const std::string& text) {
  auto fd = open_file(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd) return fd.error();
  EXPERTD_TRY(pwrite_full(fd->get(), text.data(), text.size(), 0, path));
  if (::fsync(fd->get()) != 0) return errno_error("sync " + path);
  return {};
}

// Streams every expert block into the pack: a reader thread fills one batch while the
// calling thread writes the other, so the source read and the pack write overlap.
Status write_pack(const gguf::Model& model, Manifest& m, int fd, const std::string& path,
                  uint64_t batch_bytes, Progress& progress) {
  auto header = encode_header(m);  // model_id and layout are known before the data
  AlignedBuffer hb(header.size());
  std::memcpy(hb.data(), header.data(), header.size());
  EXPERTD_TRY(pwrite_full(fd, hb.data(), hb.size(), 0, path));

  std::vector<Batch> plan;
  for (uint32_t l = 0; l < m.layers.size(); ++l) {
    uint64_t stride = m.layers[l].stride;
    uint32_t per = static_cast<uint32_t>(std::max<uint64_t>(1, batch_bytes / stride));
    for (uint32_t e = 0; e < m.n_experts; e += per) {
      Batch b;
      b.layer = l;
      b.first = e;
      b.count = std::min(per, m.n_experts - e);
      b.bytes = uint64_t{b.count} * stride;
      plan.push_back(std::move(b));
    }
  }
  uint64_t buf_bytes = 0;
  for (const auto& b : plan) buf_bytes = std::max(buf_bytes, b.bytes);
  AlignedBuffer bufs[2] = {AlignedBuffer(buf_bytes), AlignedBuffer(buf_bytes)};
  if (!bufs[0].valid() || !bufs[1].valid())
    return make_error("out of memory for the write buffers");

  std::mutex mu;
  std::condition_variable cv;
  size_t filled = 0, written = 0;  // batches filled by the reader / written by us
  bool abort = false;
  std::thread reader([&] {
    for (size_t i = 0; i < plan.size(); ++i) {
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return abort || i < written + 2; });
        if (abort) return;
      }
      Batch& b = plan[i];
      b.buf = std::move(bufs[i % 2]);
      b.status = fill_batch(model, m, b);
      if (b.status) {
        LayerLayout& l = m.layers[b.layer];
        for (uint32_t k = 0; k < b.count; ++k)
          l.checksums[b.first + k] = XXH3_64bits(b.buf.data() + uint64_t{k} * l.stride, l.stride);
      }
      std::lock_guard lk(mu);
      ++filled;
      cv.notify_all();
    }
  });
  Status result;
  uint64_t done = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return i < filled; });
    }
    Batch& b = plan[i];
    if (b.status)
      b.status = pwrite_full(fd, b.buf.data(), b.bytes, m.offset(b.layer, b.first), path);
    bufs[i % 2] = std::move(b.buf);
    if (!b.status) {
      result = b.status;
      std::lock_guard lk(mu);
      abort = true;
      cv.notify_all();
      break;
    }
    done += b.bytes;
    progress.update(done);
    std::lock_guard lk(mu);
    ++written;
    cv.notify_all();
  }
  reader.join();
  return result;
}

}  // namespace

namespace {
Result<BuildReport> build(const BuildOptions& opts, std::vector<std::string>& sources) {
  auto model = gguf::Model::open(opts.model_path);
  if (!model) return model.error();
  auto planned = plan_layout(*model, opts.layout);
  if (!planned) return planned.error();
  Manifest& m = *planned;

  BuildReport rep;
  std::string dir = opts.out_dir.empty() ? dir_of(opts.model_path) : opts.out_dir;
  if (std::error_code ec;
      !opts.out_dir.empty() && !std::filesystem::create_directories(dir, ec) && ec)
    return make_error("--out " + dir + ": cannot create it: " + ec.message());
  for (const auto& s : model->shards()) sources.push_back(s.path);
  std::string stem = model_stem(opts.model_path);
  rep.pack_path = dir + "/" + stem + ".expertpack";
  rep.core_path = dir + "/" + stem + ".core.gguf";
  rep.manifest_path = dir + "/" + stem + ".manifest.json";
  m.pack_file = stem + ".expertpack";
  m.core_file = stem + ".core.gguf";
  for (const auto& s : model->shards()) {
    m.source_files.push_back(abs_path(s.path));
    m.source_bytes.push_back(s.size);
    rep.source_bytes += s.size;
  }
  TempFiles temps;
  std::string pack_tmp = dir + "/." + stem + ".expertpack.tmp";
  std::string core_tmp = dir + "/." + stem + ".core.gguf.tmp";
  std::string manifest_tmp = dir + "/." + stem + ".manifest.json.tmp";
  temps.paths = {pack_tmp, core_tmp, manifest_tmp};

  int fd = ::open(pack_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0 &&
      errno == EINVAL) {  // a file system without O_DIRECT (tmpfs): say so, go on buffered
    rep.direct_io = false;
    fd = ::open(pack_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd < 0) return errno_error("create " + pack_tmp);
  UniqueFd pack_fd(fd);
  Progress progress("packing " + stem, m.pack_bytes - m.data_start, opts.progress);
  EXPERTD_TRY(write_pack(*model, m, pack_fd.get(), pack_tmp, opts.batch_bytes, progress));
  if (::fdatasync(pack_fd.get()) != 0) return errno_error("sync " + pack_tmp);
  ::posix_fadvise(pack_fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  pack_fd.reset();
  rep.pack_bytes = m.pack_bytes;

  EXPERTD_TRY(write_core(*model, m, core_tmp, &rep.core_bytes));
  EXPERTD_TRY(write_text_file(manifest_tmp, to_json(m)));
  // The old manifest goes first and the new one is renamed last: a pack without its manifest
  // is never taken for a valid one.
  ::unlink(rep.manifest_path.c_str());
  for (auto [from, to] : {std::pair{pack_tmp, rep.pack_path},
                          {core_tmp, rep.core_path},
                          {manifest_tmp, rep.manifest_path}})
    if (::rename(from.c_str(), to.c_str()) != 0) return errno_error("rename " + from + " to " + to);
  temps.paths.clear();
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  rep.seconds = progress.seconds();
  return rep;
}
}  // namespace

Result<BuildReport> build_pack(const BuildOptions& opts) {
  std::vector<std::string> sources;
  auto rep = build(opts, sources);
  // The model is closed (its mapping gone): what reading it left in the page cache is dropped,
  // so packing a model larger than memory does not push everything else out.
  for (const auto& p : sources)
    if (int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  return rep;
}

}  // namespace expertd::pack
