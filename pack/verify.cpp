#include "pack/verify.h"

#include <xxhash.h>

#include <cstring>
#include <sstream>

#include "common/fd.h"
#include "gguf/gguf_reader.h"
#include "kernels/kernels.h"
#include "pack/builder.h"
#include "pack/progress.h"

namespace expertd::pack {

Result<UniqueFd> open_pack_direct(const Manifest& m, const std::string& manifest_path) {
  std::string path = manifest_dir(manifest_path) + "/" + m.pack_file;
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0 && errno == EINVAL)
    return make_error(path +
                      ": the file system does not support O_DIRECT reads; "
                      "put the pack on a local disk file system (ext4, xfs, btrfs)");
  if (fd < 0) return errno_error("open " + path);
  UniqueFd f(fd);
  auto size = file_size(fd, path);
  if (!size) return size.error();
  if (*size != m.pack_bytes)
    return make_error(path + ": size " + std::to_string(*size) + " differs from the manifest's " +
                      std::to_string(m.pack_bytes) + " (truncated or replaced pack)");
  AlignedBuffer h(m.data_start);
  if (auto st = pread_full(fd, h.data(), m.data_start, 0, path); !st) {
    if (st.error().errno_value == EINVAL)
      return make_error(path +
                        ": O_DIRECT read refused (EINVAL): the file system does not honour "
                        "4096-byte direct I/O");
    return st.error();
  }
  if (auto st = check_header({h.data(), m.data_start}, m); !st)
    return make_error(path + ": " + st.error().message);
  return f;
}

Result<VerifyReport> verify_pack(const VerifyOptions& opts) {
  auto m = load_manifest(opts.manifest_path);
  if (!m) return m.error();
  auto fd = open_pack_direct(*m, opts.manifest_path);
  if (!fd) return fd.error();
  std::string pack_path = manifest_dir(opts.manifest_path) + "/" + m->pack_file;

  VerifyReport rep;
  std::optional<gguf::Model> src;
  std::string src_path =
      opts.source_path.empty() && !m->source_files.empty() ? m->source_files[0] : opts.source_path;
  if (!src_path.empty() && ::access(src_path.c_str(), R_OK) == 0) {
    auto opened = gguf::Model::open(src_path);
    if (!opened) return opened.error();
    src.emplace(std::move(*opened));
    rep.source_compared = true;
  } else {
    rep.source_note =
        src_path.empty() ? "no source recorded" : "source " + src_path + " not present";
  }

  Progress progress("verifying", m->pack_bytes - m->data_start, opts.progress);
  AlignedBuffer buf(m->slot_bytes());
  std::vector<uint8_t> rows8;
  for (uint32_t l = 0; l < m->layers.size(); ++l) {
    const LayerLayout& layer = m->layers[l];
    for (uint32_t e = 0; e < m->n_experts; ++e) {
      std::string where = pack_path + ": layer " + std::to_string(l) + " (model layer " +
                          std::to_string(layer.model_layer) + ") expert " + std::to_string(e);
      EXPERTD_TRY(pread_full(fd->get(), buf.data(), layer.stride, m->offset(l, e), pack_path));
      rep.bytes_read += layer.stride;
      if (XXH3_64bits(buf.data(), layer.stride) != layer.checksums[e])
        return make_error(where + ": checksum mismatch (corrupt pack)");
      if (src) {
        for (const auto& r : layer.roles) {
          const gguf::TensorInfo* t = src->tensor(r.tensor);
          const uint64_t src_bytes = source_role_bytes(r);
          if (!t || t->nbytes != src_bytes * m->n_experts)
            return make_error(where + ": source tensor " + r.tensor + " is missing or resized");
          const uint8_t* want = t->data + uint64_t{e} * src_bytes;
          if (r.layout == Layout::Rows8) {  // the source's rows, interleaved as the builder does
            rows8.resize(r.bytes);
            kernels::rows8_pack(r.ggml_type, want, static_cast<int64_t>(r.ne[1]),
                                static_cast<int64_t>(r.ne[0]), rows8.data());
            want = rows8.data();
          }
          if (std::memcmp(buf.data() + r.offset, want, r.bytes) != 0)
            return make_error(where + ": role " + std::string(role_name(r.role)) +
                              " differs from the source GGUF");
        }
      }
      ++rep.experts_checked;
      progress.update(rep.bytes_read);
    }
  }
  return rep;
}

std::string inspect(const Manifest& m) {
  std::ostringstream o;
  o << "arch            " << m.arch << "\n"
    << "model           " << m.model_name << "\n"
    << "model_id        " << hex64(m.model_id) << "\n"
    << "pack            " << m.pack_file << " (" << m.pack_bytes << " bytes)\n"
    << "core            " << m.core_file << "\n"
    << "data_start      " << m.data_start << "\n"
    << "experts         " << m.n_experts << " per layer, " << m.n_experts_used
    << " used per token\n"
    << "moe layers      " << m.layers.size() << "\n"
    << "slot_bytes      " << m.slot_bytes() << "\n"
    << "format          version " << m.version
    << (m.has_rows8() ? " (rows8: interleaved rows, for engines on the CPU)" : " (rows)") << "\n";
  for (size_t i = 0; i < m.source_files.size(); ++i)
    o << "source          " << m.source_files[i] << " (" << m.source_bytes[i] << " bytes)\n";
  o << "\npack_layer model_layer          base     stride  roles (type ne0xne1 [rows8] @offset "
       "+bytes)\n";
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const auto& L = m.layers[l];
    char line[128];
    std::snprintf(line, sizeof line, "%10zu %11u %13llu %10llu ", l, L.model_layer,
                  static_cast<unsigned long long>(L.base),
                  static_cast<unsigned long long>(L.stride));
    o << line;
    for (const auto& r : L.roles) {
      const auto* tr = gguf::type_traits(r.ggml_type);
      o << " " << role_name(r.role) << ":" << (tr ? tr->name : "?") << " " << r.ne[0] << "x"
        << r.ne[1] << (r.layout == Layout::Rows8 ? " rows8" : "") << " @" << r.offset << " +"
        << r.bytes;
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace expertd::pack
