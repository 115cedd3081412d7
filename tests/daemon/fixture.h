// A synthetic MoE model packed once per test binary, and helpers to run expertd against it.
#pragma once

#include <cstring>
#include <memory>

#include "client/expert_client.h"
#include "engine/synth.h"
#include "gguf/gguf_reader.h"
#include "pack/builder.h"
#include "test_util.h"

namespace expertd::test {

inline constexpr uint32_t kExperts = 32;
inline constexpr uint32_t kLayers = 2;

// The tests' synthetic model (kLayers x kExperts Q8_0 experts of n_ff rows) as DIR/m.gguf, and
// packed beside it: the manifest's path, "" on failure (reported).
inline std::string write_packed_synth(const TempDir& dir, uint64_t n_ff) {
  engine::SynthOptions o;
  o.dims = {256, kLayers, kExperts, 4, n_ff, 4, 2, 512};
  o.type = gguf::GgmlType::Q8_0;
  o.out_path = dir / "m.gguf";
  o.progress = false;
  if (auto st = engine::write_synth(o); !st) {
    ADD_FAILURE() << st.error().message;
    return "";
  }
  pack::BuildOptions b;
  b.model_path = o.out_path;
  b.progress = false;
  auto rep = pack::build_pack(b);
  EXPECT_TRUE(rep) << (rep ? "" : rep.error().message);
  return rep ? rep->manifest_path : "";
}

// An expertd metric's value as the client's Stats request reports it.
inline double metric(client::Client& c, const std::string& name) {
  auto m = c.stats();
  EXPECT_TRUE(m);
  if (m)
    for (const auto& x : *m)
      if (x.name == name) return x.value;
  ADD_FAILURE() << "no metric " << name;
  return -1;
}

class DaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string manifest = write_packed_synth(*dir_, 256);
    ASSERT_FALSE(manifest.empty());
    manifest_ = new pack::Manifest(*pack::load_manifest(manifest));
    auto m = gguf::Model::open(*dir_ / "m.gguf");
    ASSERT_TRUE(m);
    source_ = new gguf::Model(std::move(*m));
  }
  static void TearDownTestSuite() {
    delete source_;
    delete manifest_;
    delete dir_;
  }

  std::string manifest_path() const { return *dir_ / "m.manifest.json"; }
  std::string socket() const { return local_ / "s.sock"; }
  uint64_t stride() const { return manifest_->layers[0].stride; }

  std::unique_ptr<Daemon> start(std::vector<std::string> flags, const std::string& manifest = "") {
    auto d =
        std::make_unique<Daemon>(manifest.empty() ? manifest_path() : manifest, socket(), flags);
    std::string log;
    EXPECT_TRUE(d->start(&log)) << log;
    return d;
  }

  std::unique_ptr<client::Client> connect() {
    auto c = client::Client::connect(socket(), {"test", 20000});
    EXPECT_TRUE(c) << (c ? "" : c.error().message);
    return c ? std::move(*c) : nullptr;
  }

  static double stat(client::Client& c, const std::string& name) { return metric(c, name); }

  // Every role of expert i of the lease equals the source GGUF's bytes.
  static bool slot_matches_source(const client::Client& c, const client::Lease& l, size_t i) {
    const auto& layer = c.info().layers[l.layer];
    for (const auto& r : layer.roles) {
      const auto& L = manifest_->layers[l.layer];
      std::string tensor;
      for (const auto& mr : L.roles)
        if (pack::role_name(mr.role) == r.role) tensor = mr.tensor;
      const auto* t = source_->tensor(tensor);
      if (!t || std::memcmp(l.slot_data(i) + r.offset, t->data + uint64_t{l.experts[i]} * r.bytes,
                            r.bytes) != 0)
        return false;
    }
    return true;
  }

  // acquire + wait + check bytes + release
  static void use(client::Client& c, uint32_t layer, std::vector<uint32_t> ids) {
    auto l = c.acquire(layer, ids);
    ASSERT_TRUE(l) << l.error().message;
    auto st = c.wait_ready(*l);
    ASSERT_TRUE(st) << st.error().message;
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_TRUE(slot_matches_source(c, *l, i)) << "layer " << layer << " expert " << ids[i];
    ASSERT_TRUE(c.release(*l));
  }

  TempDir local_;
  static inline TempDir* dir_ = nullptr;
  static inline pack::Manifest* manifest_ = nullptr;
  static inline gguf::Model* source_ = nullptr;
};

}  // namespace expertd::test
