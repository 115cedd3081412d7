#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "common/fd.h"
#include "engine/model.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "kernels/kernels.h"
#include "pack/builder.h"
#include "pack/verify.h"
#include "test_util.h"

using namespace expertd;
using namespace expertd::test;

namespace {

pack::Manifest build_ok(const std::string& model, const std::string& out_dir) {
  pack::BuildOptions o;
  o.model_path = model;
  o.out_dir = out_dir;
  o.progress = false;
  o.batch_bytes = 1 << 20;  // several batches even for tiny models
  auto rep = pack::build_pack(o);
  EXPECT_TRUE(rep) << (rep ? "" : rep.error().message);
  auto m = pack::load_manifest(rep->manifest_path);
  EXPECT_TRUE(m) << (m ? "" : m.error().message);
  return *m;
}

// Writes `model`'s KVs and tensors into a GGUF, choosing which tensors by `keep`.
void copy_gguf(const gguf::Model& src, const std::string& out,
               const std::function<bool(const gguf::TensorInfo&)>& keep,
               const std::function<void(gguf::Writer&)>& extra_kv = {}, bool skip_kvs = false) {
  gguf::Writer w(src.alignment());
  if (!skip_kvs)
    for (const auto& kv : src.kvs()) w.add_raw_kv(kv.raw);
  if (extra_kv) extra_kv(w);
  std::vector<const gguf::TensorInfo*> kept;
  for (const auto& t : src.tensors())
    if (keep(t)) {
      w.add_tensor(t.name, t.type, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims));
      kept.push_back(&t);
    }
  std::string data(w.file_bytes(), '\0');
  auto h = w.header();
  std::memcpy(data.data(), h.data(), h.size());
  for (size_t i = 0; i < kept.size(); ++i)
    std::memcpy(data.data() + w.tensor_offset(i), kept[i]->data, kept[i]->nbytes);
  write_file(out, data);
}

bool is_expert(const std::string& name) {
  return name.find("_exps.") != std::string::npos;
}

}  // namespace

// Every golden architecture: the layout formula, alignment, checksums, and every expert's bytes
// equal the source GGUF's slice (read back here with plain reads, independently of verify).
TEST(ExpertPack, GoldenModelsRoundTrip) {
  REQUIRE_GOLDEN();
  for (const auto& c : golden_cases()) {
    SCOPED_TRACE(c);
    TempDir d;
    auto src = gguf::Model::open(golden_model(c));
    ASSERT_TRUE(src);
    pack::Manifest m = build_ok(golden_model(c), d.path());
    EXPECT_EQ(m.data_start % 4096, 0u);
    EXPECT_EQ(m.n_experts, *src->get_uint(src->arch() + ".expert_count"));
    std::string pack_bytes = read_file(d / m.pack_file);
    ASSERT_EQ(pack_bytes.size(), m.pack_bytes);
    uint64_t at = m.data_start;
    for (uint32_t l = 0; l < m.layers.size(); ++l) {
      const auto& L = m.layers[l];
      EXPECT_EQ(L.base, at);
      EXPECT_EQ(L.stride % 4096, 0u);
      at += L.stride * m.n_experts;
      for (uint32_t e = 0; e < m.n_experts; ++e) {
        uint64_t off = m.offset(l, e);
        EXPECT_EQ(off, L.base + e * L.stride);
        EXPECT_EQ(off % 4096, 0u);
        EXPECT_EQ(XXH3_64bits(pack_bytes.data() + off, L.stride), L.checksums[e]);
        for (const auto& r : L.roles) {
          EXPECT_EQ(r.offset % 4096, 0u);
          const auto* t = src->tensor(r.tensor);
          ASSERT_NE(t, nullptr) << r.tensor;
          EXPECT_EQ(t->nbytes, r.bytes * m.n_experts);
          EXPECT_EQ(0,
                    std::memcmp(pack_bytes.data() + off + r.offset, t->data + e * r.bytes, r.bytes))
              << r.tensor << " expert " << e;
        }
      }
    }
    // The binary header agrees with the manifest.
    EXPECT_TRUE(
        pack::check_header({reinterpret_cast<const uint8_t*>(pack_bytes.data()), m.data_start}, m));
    // verify (O_DIRECT, against the source) agrees.
    pack::VerifyOptions vo{d / (pack::model_stem(golden_model(c)) + ".manifest.json"), "", false};
    auto v = pack::verify_pack(vo);
    ASSERT_TRUE(v) << v.error().message;
    EXPECT_TRUE(v->source_compared);
    EXPECT_EQ(v->experts_checked, m.layers.size() * m.n_experts);
    // The core GGUF holds every other tensor and key, bytes unchanged, and no routed expert.
    auto core = gguf::Model::open(d / m.core_file);
    ASSERT_TRUE(core) << core.error().message;
    size_t non_expert = 0;
    for (const auto& t : src->tensors()) {
      if (is_expert(t.name)) {
        EXPECT_EQ(core->tensor(t.name), nullptr) << t.name;
        continue;
      }
      ++non_expert;
      const auto* ct = core->tensor(t.name);
      ASSERT_NE(ct, nullptr) << t.name;
      EXPECT_EQ(ct->type, t.type);
      EXPECT_EQ(0, std::memcmp(ct->data, t.data, t.nbytes)) << t.name;
    }
    EXPECT_EQ(core->tensors().size(), non_expert);
    for (const auto& kv : src->kvs()) {
      const auto* ckv = core->find(kv.key);
      ASSERT_NE(ckv, nullptr) << kv.key;
      EXPECT_TRUE(std::equal(kv.raw.begin(), kv.raw.end(), ckv->raw.begin(), ckv->raw.end()))
          << kv.key;
    }
    EXPECT_EQ(core->get_string("expertpack.model_id"), pack::hex64(m.model_id));
  }
}

// A model split in two shards (as llama.cpp's gguf-split writes them) packs as the whole file:
// a golden qwen3moe, a Kimi-K3 with its Q2_K/Q3_K latent experts, a DeepSeek-V4 with MXFP4
// experts (and its I32 hash-routing table in the core).
TEST(ExpertPack, SplitGgufGivesTheSamePack) {
  REQUIRE_GOLDEN();
  TempDir k3;
  auto s =
      run(bin("pack/expert-pack") + " -q synth --preset kimi-k3 --dims 512,3,8,2,256,8,1,512 " +
          "--type Q2_K --down-type Q3_K --out " + k3 / "k3.gguf");
  ASSERT_EQ(s.first, 0) << s.second;
  s = run(bin("pack/expert-pack") + " -q synth --preset deepseek-v4-flash --dims " +
          "256,3,8,2,128,4,1,512 --type Q8_0 --gate-type MXFP4 --up-type MXFP4 --down-type MXFP4 " +
          "--out " + k3 / "v4.gguf");
  ASSERT_EQ(s.first, 0) << s.second;
  for (const std::string& model :
       {golden_model("qwen3moe-A-s1-f32"), k3 / "k3.gguf", k3 / "v4.gguf"}) {
    SCOPED_TRACE(model);
    TempDir d;
    auto src = gguf::Model::open(model);
    ASSERT_TRUE(src);
    size_t n = src->tensors().size(), half = n / 2;
    std::vector<std::string> first;
    for (size_t i = 0; i < half; ++i) first.push_back(src->tensors()[i].name);
    auto in_first = [&](const gguf::TensorInfo& t) {
      return std::find(first.begin(), first.end(), t.name) != first.end();
    };
    auto split_kv = [&](uint16_t no) {
      return [&, no](gguf::Writer& w) {
        w.add_u32("split.no", no);  // llama.cpp writes u16; any integer is read
        w.add_u32("split.count", 2);
        w.add_u32("split.tensors.count", static_cast<uint32_t>(n));
      };
    };
    copy_gguf(*src, d / "m-00001-of-00002.gguf", in_first, split_kv(0));
    copy_gguf(
        *src, d / "m-00002-of-00002.gguf", [&](const auto& t) { return !in_first(t); }, split_kv(1),
        true);
    TempDir d2;
    pack::Manifest split = build_ok(d / "m-00001-of-00002.gguf", d.path());
    pack::Manifest whole = build_ok(model, d2.path());
    ASSERT_EQ(split.layers.size(), whole.layers.size());
    for (size_t l = 0; l < split.layers.size(); ++l)
      EXPECT_EQ(split.layers[l].checksums, whole.layers[l].checksums);
    EXPECT_EQ(split.source_files.size(), 2u);
    EXPECT_TRUE(fs::exists(d / "m.core.gguf"));
    auto core = gguf::Model::open(d / "m.core.gguf");
    ASSERT_TRUE(core) << core.error().message;
    EXPECT_FALSE(core->find("split.count"));
    auto loaded = engine::Model::load(*core);  // the core of the split model runs from the pack
    ASSERT_TRUE(loaded) << loaded.error().message;
    EXPECT_FALSE(loaded->has_local_experts);
    // Passing a later shard is refused with a clear message.
    auto r = run(bin("pack/expert-pack") + " -q build " + d / "m-00002-of-00002.gguf");
    EXPECT_NE(r.first, 0);
    EXPECT_NE(r.second.find("first shard"), std::string::npos) << r.second;
  }
}

// Trailing NextN (multi-token prediction) blocks, counted as llama.cpp counts them
// (<arch>.nextn_predict_layers when the first has nextn.eh_proj): the engine does not run them,
// and the pack neither packs their experts nor keeps them in the core.
TEST(ExpertPack, NextnBlocksArePacked) {
  TempDir d;
  // synth's DeepSeek-V4 writes one NextN block after its 3 trunk blocks, as the published model:
  // its experts are packed (NextN drafting reads them) and the trunk alone runs without them.
  auto s = run(bin("pack/expert-pack") + " -q synth --preset deepseek-v4-flash --dims " +
               "128,3,8,2,64,4,1,512 --type F32 --out " + d / "mtp.gguf");
  ASSERT_EQ(s.first, 0) << s.second;
  auto f = gguf::Model::open(d / "mtp.gguf");
  ASSERT_TRUE(f) << f.error().message;
  ASSERT_EQ(f->get_uint("deepseek4.block_count").value_or(0), 4u);
  ASSERT_TRUE(f->tensor("blk.3.nextn.eh_proj.weight"));
  ASSERT_TRUE(f->tensor("blk.3.ffn_gate_exps.weight"));
  auto m = engine::Model::load(*f);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->hp.n_layer, 3);
  pack::Manifest man = build_ok(d / "mtp.gguf", d.path());
  ASSERT_EQ(man.layers.size(), 4u);
  EXPECT_EQ(man.layers.back().model_layer, 3u);
  auto core = gguf::Model::open(d / "mtp.core.gguf");
  ASSERT_TRUE(core) << core.error().message;
  EXPECT_FALSE(core->tensor("blk.3.ffn_gate_exps.weight"));
  EXPECT_TRUE(core->tensor("blk.3.nextn.eh_proj.weight"));
  auto mc = engine::Model::load(*core);
  ASSERT_TRUE(mc) << mc.error().message;
  EXPECT_FALSE(mc->has_local_experts);
}

TEST(ExpertPack, BadInputsFailClearlyAndLeaveNothing) {
  REQUIRE_GOLDEN();
  TempDir d;
  std::string tool = bin("pack/expert-pack") + " -q build ";
  auto expect_fail = [&](const std::string& model, const std::string& needle) {
    auto [rc, out] = run(tool + model + " --out " + d.path());
    EXPECT_NE(rc, 0) << model;
    EXPECT_NE(out.find(needle), std::string::npos) << out;
    EXPECT_NE(out.find(fs::path(model).filename().string()), std::string::npos)
        << "error must name the file: " << out;
    for (const auto& e : fs::directory_iterator(d.path())) {
      std::string n = e.path().filename().string();
      EXPECT_EQ(n.find(".tmp"), std::string::npos) << "left behind: " << n;
      EXPECT_EQ(n.find(".manifest.json"), std::string::npos) << "left behind: " << n;
    }
  };
  write_file(d / "notgguf.gguf", "this is not a model\n");
  expect_fail(d / "notgguf.gguf", "not a GGUF");
  std::string full = read_file(golden_model("olmoe-A-s1-f32"));
  write_file(d / "trunc.gguf", full.substr(0, full.size() / 2));
  expect_fail(d / "trunc.gguf", "beyond the end of the file");
  write_file(d / "trunc2.gguf", full.substr(0, 777));
  expect_fail(d / "trunc2.gguf", "truncated");
  auto src = gguf::Model::open(golden_model("olmoe-A-s1-f32"));
  copy_gguf(*src, d / "dense.gguf", [](const auto& t) { return !is_expert(t.name); });
  expect_fail(d / "dense.gguf", "not a MoE model");
  // An unknown tensor type id.
  std::string bad = full;
  std::string name = "blk.0.ffn_up_exps.weight";
  size_t pos = bad.find(name) + name.size() + 4 + 3 * 8;
  uint32_t t = 250;
  std::memcpy(bad.data() + pos, &t, 4);
  write_file(d / "badtype.gguf", bad);
  expect_fail(d / "badtype.gguf", "unknown ggml type 250");
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path()), fs::directory_iterator()),
            5);  // only the inputs
}

// --out names a directory that need not exist (it is made, parents too; a path through a file
// is an error naming it); the source read and the files written do not stay in the page cache.
TEST(ExpertPack, OutDirectoryIsMadeAndThePageCacheIsLeftAlone) {
  TempDir d;
  const std::string src = d / "kjv.gguf";
  fs::copy_file(std::string(EXPERTD_SOURCE_DIR) + "/model/kjv-moe-q8_0.gguf", src);
  {  // on disk and out of the cache, as a downloaded model is
    UniqueFd fd(::open(src.c_str(), O_RDONLY));
    ASSERT_EQ(::fsync(fd.get()), 0);
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  }
  auto [rc, out] = run(bin("pack/expert-pack") + " -q build " + src + " --out " + d / "new/dir");
  ASSERT_EQ(rc, 0) << out;
  for (const char* f : {"kjv.expertpack", "kjv.core.gguf", "kjv.manifest.json"})
    EXPECT_TRUE(fs::exists(d / (std::string("new/dir/") + f))) << f;
  // Pages of each file in the page cache (mincore over a mapping).
  auto resident = [](const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY));
    const size_t size = fs::file_size(path), page = size_t(::sysconf(_SC_PAGESIZE));
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
    std::vector<unsigned char> v((size + page - 1) / page);
    ::mincore(map, size, v.data());
    ::munmap(map, size);
    return size_t(std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; }));
  };
  EXPECT_EQ(resident(src), 0u) << "the source's pages stayed cached";
  EXPECT_EQ(resident(d / "new/dir/kjv.core.gguf"), 0u) << "the core's pages stayed cached";
  write_file(d / "file", "x");
  auto [rc2, out2] = run(bin("pack/expert-pack") + " -q build " + src + " --out " + d / "file/x");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("--out " + (d / "file/x")), std::string::npos) << out2;
}

// A full disk (here: the file size limit, which fails writes the same way) leaves no pack.
TEST(ExpertPack, WriteFailureLeavesNoPack) {
  REQUIRE_GOLDEN();
  TempDir d;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // writes then fail with EFBIG instead of killing us
    rlimit lim{1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    std::string out = d / "out.txt";
    FILE* f = std::fopen(out.c_str(), "w");
    ::dup2(fileno(f), 2);
    std::string model = golden_model("qwen3moe-A-s1-f32");
    ::execl(bin("pack/expert-pack").c_str(), "expert-pack", "-q", "build", model.c_str(), "--out",
            d.path().c_str(), nullptr);
    ::_exit(127);
  }
  int st;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
  std::string out = read_file(d / "out.txt");
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  for (const auto& e : fs::directory_iterator(d.path())) EXPECT_EQ(e.path().filename(), "out.txt");
}

// --layout rows8: every expert matrix of a type with interleaved rows is stored interleaved (its
// bytes rows8_pack's of the source's, which unpack back to them), the others as rows; the manifest
// says so per role and is format version 2, which a version-1 reader refuses; verify compares
// with the source interleaved the same way; inspect shows it.
TEST(ExpertPack, Rows8LayoutInterleavesTheTypesThatHaveIt) {
  REQUIRE_GOLDEN();
  for (const char* id :
       {"qwen3moe-B-s11-q4_k_m", "quant/qwen3moe-q3_k_s", "gpt-oss-B-s11-mxfp4_moe"}) {
    SCOPED_TRACE(id);
    TempDir d;
    auto r = run(bin("pack/expert-pack") + " -q build --layout rows8 --verify --out " + d.path() +
                 " " + golden_model(id));
    ASSERT_EQ(r.first, 0) << r.second;
    EXPECT_NE(r.second.find("verified"), std::string::npos) << r.second;
    const std::string mf = d / (pack::model_stem(golden_model(id)) + ".manifest.json");
    auto m = pack::load_manifest(mf);
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ(m->version, pack::kFormatVersion);
    auto src = gguf::Model::open(golden_model(id));
    ASSERT_TRUE(src);
    const std::string pack_bytes = read_file(d / m->pack_file);
    int interleaved = 0;
    for (uint32_t l = 0; l < m->layers.size(); ++l)
      for (const auto& role : m->layers[l].roles) {
        SCOPED_TRACE(role.tensor);
        const bool want = role.role < pack::Role::GateBias &&
                          kernels::rows8_supported(role.ggml_type) && role.ne[1] % 8 == 0 &&
                          role.ne[0] % 256 == 0;
        EXPECT_EQ(role.layout == pack::Layout::Rows8, want);
        const auto* t = src->tensor(role.tensor);
        ASSERT_NE(t, nullptr);
        const uint64_t rows_bytes = pack::source_role_bytes(role);
        EXPECT_EQ(t->nbytes, rows_bytes * m->n_experts);
        for (uint32_t e : {0u, m->n_experts - 1}) {
          const uint8_t* got =
              reinterpret_cast<const uint8_t*>(pack_bytes.data()) + m->offset(l, e) + role.offset;
          const uint8_t* rows = t->data + e * rows_bytes;
          if (role.layout == pack::Layout::Rows) {
            EXPECT_EQ(role.bytes, rows_bytes);
            EXPECT_EQ(0, std::memcmp(got, rows, rows_bytes));
            continue;
          }
          ++interleaved;
          const auto R = int64_t(role.ne[1]), C = int64_t(role.ne[0]);
          EXPECT_EQ(role.bytes, kernels::rows8_bytes(role.ggml_type, R, C));
          std::vector<uint8_t> w8(role.bytes), back(rows_bytes);
          kernels::rows8_pack(role.ggml_type, rows, R, C, w8.data());
          EXPECT_EQ(0, std::memcmp(got, w8.data(), role.bytes));
          kernels::rows8_unpack(role.ggml_type, got, R, C, back.data());
          EXPECT_EQ(0, std::memcmp(back.data(), rows, rows_bytes));
        }
      }
    EXPECT_GT(interleaved, 0);
    r = run(bin("pack/expert-pack") + " inspect " + mf);
    EXPECT_EQ(r.first, 0);
    EXPECT_NE(r.second.find(" rows8 @"), std::string::npos) << r.second;
    EXPECT_NE(r.second.find("version 2"), std::string::npos) << r.second;
    // A manifest that claims version 1 with an interleaved role is refused: a reader of version 1
    // would take the bytes for rows.
    std::string json = read_file(mf);
    const auto at = json.find("\"version\": 2");
    ASSERT_NE(at, std::string::npos);
    json.replace(at, 12, "\"version\": 1");
    write_file(mf, json);
    auto bad = pack::load_manifest(mf);
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("format version 1 does not have"), std::string::npos)
        << bad.error().message;
  }
  auto r = run(bin("pack/expert-pack") + " -q build --layout rows4 " +
               golden_model("qwen2moe-A-s1-q8_0"));
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find("--layout"), std::string::npos) << r.second;
}

TEST(ExpertPack, VerifyDetectsCorruptionAndTruncation) {
  REQUIRE_GOLDEN();
  TempDir d;
  pack::Manifest m = build_ok(golden_model("llama-A-s1-f32"), d.path());
  std::string mf = d / "model.manifest.json";
  auto r = run(bin("pack/expert-pack") + " -q verify " + mf);
  EXPECT_EQ(r.first, 0) << r.second;
  EXPECT_NE(r.second.find("equal to the source"), std::string::npos) << r.second;
  std::string p = read_file(d / m.pack_file);
  std::string orig = p;
  p[m.offset(1, 3) + 100] ^= 0x40;
  write_file(d / m.pack_file, p);
  r = run(bin("pack/expert-pack") + " -q verify " + mf);
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find("layer 1 (model layer 1) expert 3: checksum mismatch"), std::string::npos)
      << r.second;
  write_file(d / m.pack_file, orig.substr(0, orig.size() - 4096));
  r = run(bin("pack/expert-pack") + " -q verify " + mf);
  EXPECT_NE(r.first, 0);
  EXPECT_NE(r.second.find("differs from the manifest"), std::string::npos) << r.second;
  r = run(bin("pack/expert-pack") + " inspect " + mf);
  EXPECT_EQ(r.first, 0);
  EXPECT_NE(r.second.find("pack_layer"), std::string::npos);
}
