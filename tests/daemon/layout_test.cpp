// A pack built with --layout rows8 (experts stored interleaved eight rows at a time) on a real
// expertd: only engines that read the layout are served, the slots hold the interleaved bytes,
// and a cuda arena refuses such a pack at start.
#include <nlohmann/json.hpp>

#include "client/expert_client.h"
#include "client/expert_client_c.h"
#include "gguf/gguf_reader.h"
#include "kernels/kernels.h"
#include "pack/builder.h"
#include "test_util.h"

using namespace expertd;
using namespace expertd::test;

namespace {

std::string build_rows8(const TempDir& d, const std::string& model) {
  pack::BuildOptions o;
  o.model_path = model;
  o.out_dir = d.path();
  o.progress = false;
  o.layout = pack::Layout::Rows8;
  auto rep = pack::build_pack(o);
  EXPECT_TRUE(rep) << (rep ? "" : rep.error().message);
  return rep ? rep->manifest_path : "";
}

}  // namespace

TEST(Layout, InterleavedPackServesOnlyEnginesThatReadIt) {
  REQUIRE_GOLDEN();
  TempDir d;
  const std::string model = golden_model("qwen3moe-B-s11-q4_k_m");  // Q4_K experts, Q6_K downs
  const std::string manifest = build_rows8(d, model);
  ASSERT_FALSE(manifest.empty());
  Daemon daemon(manifest, d / "s.sock", {"--cache-slots", "16", "--clients-max", "2"});
  std::string log;
  ASSERT_TRUE(daemon.start(&log)) << log;

  // A client that does not say it reads interleaved rows (the C API, the Python package, an
  // older engine) is refused with the cause and the fix.
  auto plain = client::Client::connect(d / "s.sock", {"plain-engine", 5000});
  ASSERT_FALSE(plain);
  EXPECT_NE(plain.error().message.find("interleaved rows"), std::string::npos)
      << plain.error().message;
  EXPECT_NE(plain.error().message.find("--layout rows"), std::string::npos);
  char err[512] = "";
  expertd_client* capi = expertd_connect((d / "s.sock").c_str(), err, sizeof err);
  EXPECT_EQ(capi, nullptr);
  if (capi) expertd_close(capi);
  EXPECT_NE(std::string(err).find("interleaved rows"), std::string::npos) << err;

  // One that does is served, and sees each role's layout: the interleaved bytes in its slot.
  client::Client::Options o{"rows8-engine", 5000};
  o.reads_rows8 = true;
  auto c = client::Client::connect(d / "s.sock", o);
  ASSERT_TRUE(c) << c.error().message;
  auto src = gguf::Model::open(model);
  ASSERT_TRUE(src);
  const auto& layer = (*c)->info().layers[0];
  int rows8_roles = 0;
  auto lease = (*c)->acquire(0, std::vector<uint32_t>{0, 5});
  ASSERT_TRUE(lease) << lease.error().message;
  ASSERT_TRUE((*c)->wait_ready(*lease));
  for (const auto& r : layer.roles) {
    SCOPED_TRACE(r.role);
    const auto* t =
        src->tensor("blk." + std::to_string(layer.model_layer) + ".ffn_" + r.role + "_exps.weight");
    ASSERT_NE(t, nullptr);
    const size_t rows_bytes = kernels::row_size(r.ggml_type, int64_t(r.ne0)) * r.ne1;
    for (size_t i = 0; i < 2; ++i) {
      const uint8_t* want = t->data + (i == 0 ? 0 : 5) * rows_bytes;
      std::vector<uint8_t> w8;
      if (r.layout == "rows8") {
        w8.resize(r.bytes);
        kernels::rows8_pack(r.ggml_type, want, int64_t(r.ne1), int64_t(r.ne0), w8.data());
        want = w8.data();
      }
      EXPECT_EQ(0, std::memcmp(lease->slot_data(i) + r.offset, want, r.bytes)) << "expert " << i;
    }
    rows8_roles += r.layout == "rows8";
    EXPECT_EQ(r.layout == "rows8", kernels::rows8_supported(r.ggml_type));
  }
  EXPECT_GE(rows8_roles, 2);  // gate and up (Q4_K)
  ASSERT_TRUE((*c)->release(*lease));

  // The refusal cost the daemon nothing: a monitor and the engine still work.
  auto r = run(bin("client/expertctl") + " --socket " + d / "s.sock" + " stats --json");
  ASSERT_EQ(r.first, 0) << r.second;
  auto s = nlohmann::json::parse(r.second);
  EXPECT_EQ(s["clients_refused"].get<int>(), 2);
  EXPECT_EQ(s["io_errors"].get<int>(), 0);
  EXPECT_TRUE(daemon.alive());
}

// A cuda arena holds experts for the GPU's kernels, which read rows: it refuses the pack before
// touching a device, naming the fix (checked with or without a GPU, before the arena is made).
TEST(Layout, CudaBackendRefusesAnInterleavedPack) {
  REQUIRE_GOLDEN();
  TempDir d;
  const std::string manifest = build_rows8(d, golden_model("qwen2moe-A-s1-q8_0"));
  ASSERT_FALSE(manifest.empty());
  Daemon daemon(manifest, d / "s.sock", {"--backend", "cuda", "--cache-slots", "16"});
  std::string log;
  ASSERT_FALSE(daemon.start(&log));
  EXPECT_NE(log.find("interleaved rows"), std::string::npos) << log;
  EXPECT_NE(log.find("--layout rows"), std::string::npos) << log;
}
