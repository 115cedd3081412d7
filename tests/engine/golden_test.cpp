// The engine against llama.cpp's golden logits, routing and greedy tokens, with experts read in
// place (--local) and through a real expertd whose cache is smaller than the model; the two
// paths must give bit-identical logits.
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/cpu_ops.h"
#include "engine/engine.h"
#include "golden_util.h"
#include "pack/builder.h"
#include "test_util.h"

using namespace expertd::test;

TEST(Golden, LocalLogitsRoutingAndGreedyMatchLlamaCpp) {
  REQUIRE_GOLDEN();
  int quantized = 0, emulated_exactly = 0;
  for (const std::string& id : golden_case_ids()) {
    Case c = load_case(id);
    SCOPED_TRACE(c.id);
    auto file = gguf::Model::open(golden_model(c.id));
    ASSERT_TRUE(file);
    auto model = engine::Model::load(*file);
    ASSERT_TRUE(model) << model.error().message;
    auto src = engine::make_local_source(*model);
    engine::Engine eng(*model, *src, 2, 256);
    std::vector<std::vector<std::vector<uint32_t>>> routes;
    auto logits = teacher_forced(eng, c, &routes);
    double median = check_against_golden(c, logits);
    if (!c.id.ends_with("f32") && !c.id.ends_with("f16"))
      ++quantized, emulated_exactly += median <= 1e-3;
    // Routing: the selected sets agree with llama.cpp's everywhere for f32 (and ≥ 90% otherwise).
    auto rj = nlohmann::json::parse(read_file(golden_dir() + "/cases/" + c.id + "/routing.json"));
    size_t same = 0, total = 0;
    for (auto& [layer, v] : rj["layers"].items()) {
      auto sel = v["selected_experts"].get<std::vector<std::vector<uint32_t>>>();
      for (size_t p = 0; p < sel.size(); ++p) {
        std::sort(sel[p].begin(), sel[p].end());
        same += sel[p] == routes[std::stoi(layer)][p];
        ++total;
      }
    }
    if (c.id.ends_with("f32"))
      EXPECT_EQ(same, total);
    else
      EXPECT_GE(same * 10, total * 9);
    // Free-running greedy decoding reproduces llama.cpp's tokens (quantized: up to the first
    // step whose top1-top2 margin is below 0.3).
    auto margins = c.j["greedy_top1_top2_margins"].get<std::vector<double>>();
    size_t n = c.greedy.size();
    if (!c.id.ends_with("f32") && !c.id.ends_with("f16"))
      for (size_t i = 0; i < margins.size(); ++i)
        if (margins[i] < 0.3) {
          n = i;
          break;
        }
    auto g = greedy(eng, c, c.greedy.size());
    EXPECT_EQ(std::vector<int32_t>(g.begin(), g.begin() + n),
              std::vector<int32_t>(c.greedy.begin(), c.greedy.begin() + n));
  }
  // Emulating llama.cpp's activation quantization matches it to ~1e-6, except where one
  // activation sits on a rounding boundary and the flip cascades: ≥ 2/3 of the cases.
  EXPECT_GE(emulated_exactly * 3, quantized * 2) << emulated_exactly << " of " << quantized;
}

// Every llama.cpp weight type (golden/quant/: Q2_K ... IQ4_XS as llama-quantize mixes them):
// within the quantized limits of the golden README on every case, and as close as the other
// quantized cases (median row-max <= 1e-3, activation quantization emulated) on >= 2/3 of them.
TEST(Golden, EveryLlamaCppWeightTypeMatchesLlamaCpp) {
  REQUIRE_GOLDEN();
  int n = 0, emulated_exactly = 0;
  for (const std::string& id : golden_quant_case_ids()) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto file = gguf::Model::open(golden_model(id));
    ASSERT_TRUE(file) << file.error().message;
    auto model = engine::Model::load(*file);
    ASSERT_TRUE(model) << model.error().message;
    auto src = engine::make_local_source(*model);
    engine::Engine eng(*model, *src, 2, 256);
    auto logits = teacher_forced(eng, c, nullptr);
    const double median = check_against_golden(c, logits);
    ++n, emulated_exactly += median <= 1e-3;
    std::printf("%-28s median row-max |d| %.3g\n", id.c_str(), median);
  }
  EXPECT_GE(emulated_exactly * 3, n * 2) << emulated_exactly << " of " << n;
}

// Through a real expertd with a cache smaller than the model and acquires smaller than a
// layer's unique experts (so prefill's layers come in waves): bit-identical to the local path.
// The local engine runs as expert-run builds it, the matrices of the types with interleaved rows
// (kernels::rows8_supported; core and experts) read from interleaved copies (kernels/rows8.h); the
// daemon's experts come in the pack's layout: their rows, or (rows8) those types interleaved in the
// pack itself, which the engine reads in the slot with no copy.
static void expect_daemon_path_bit_identical(const char* id, expertd::pack::Layout layout) {
  SCOPED_TRACE(id);
  Case c = load_case(id);
  TempDir d;
  expertd::pack::BuildOptions bo;
  bo.model_path = golden_model(id);
  bo.out_dir = d.path();
  bo.progress = false;
  bo.layout = layout;
  auto rep = expertd::pack::build_pack(bo);
  ASSERT_TRUE(rep) << rep.error().message;
  auto manifest = expertd::pack::load_manifest(rep->manifest_path);
  ASSERT_TRUE(manifest) << manifest.error().message;
  EXPECT_EQ(manifest->has_rows8(), layout == expertd::pack::Layout::Rows8);
  Daemon daemon(rep->manifest_path, d / "s.sock",
                {"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4",
                 "--policy", "lru"});
  std::string log;
  ASSERT_TRUE(daemon.start(&log)) << log;

  auto full = gguf::Model::open(golden_model(id));
  auto core = gguf::Model::open(rep->core_path);
  ASSERT_TRUE(full && core);
  auto mfull = engine::Model::load(*full);
  auto mcore = engine::Model::load(*core);
  ASSERT_TRUE(mfull) << mfull.error().message;
  ASSERT_TRUE(mcore) << mcore.error().message;
  EXPECT_FALSE(mcore->has_local_experts);
  auto local = engine::make_local_source(*mfull);
  auto remote = engine::make_daemon_source(*mcore, d / "s.sock");
  ASSERT_TRUE(remote) << remote.error().message;
  if (std::string(id).find("q4_k") != std::string::npos ||
      std::string(id).find("q2_k") != std::string::npos) {  // it has matrices to interleave
    EXPECT_GT(engine::interleaved_bytes(*mfull, true), engine::interleaved_bytes(*mfull, false));
  }
  engine::Engine e_local(*mfull, engine::make_cpu_ops(2, &*mfull, true), *local, 256),
      e_remote(*mcore, **remote, 2, 256);
  auto a = teacher_forced(e_local, c, nullptr);
  auto b = teacher_forced(e_remote, c, nullptr);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "daemon and local logits differ";
  EXPECT_EQ(greedy(e_local, c, 16), greedy(e_remote, c, 16));
  // Prefill's layers needed more than the pin budget: granted in waves, used ones handed back.
  EXPECT_GT((*remote)->stats().dones, 0u);
  auto ctl = run(bin("client/expertctl") + " --socket " + d / "s.sock" + " stats --json");
  auto s = nlohmann::json::parse(ctl.second);
  EXPECT_GT(s["cache_misses"].get<int>(), 0);
  EXPECT_GT(s["cache_evictions"].get<int>(), 0);  // the cache is smaller than the model
  EXPECT_EQ(s["io_errors"].get<int>(), 0);
}

TEST(Golden, DaemonPathIsBitIdenticalToLocal) {
  REQUIRE_GOLDEN();
  for (const char* id : {"qwen3moe-B-s11-q4_k_m", "qwen2moe-A-s1-q8_0", "llama-A-s1-f16",
                         "olmoe-A-s1-f32", "deepseek2-B-s11-q4_k_m", "gpt-oss-B-s11-mxfp4_moe",
                         "quant/qwen3moe-q2_k", "quant/qwen3moe-q4_1", "quant/qwen3moe-iq1_m",
                         "quant/qwen3moe-iq2_xxs", "quant/qwen3moe-iq3_s", "quant/qwen3moe-iq4_xs"})
    expect_daemon_path_bit_identical(id, expertd::pack::Layout::Rows);
}

// A pack built with --layout rows8 (each model has experts of a type with interleaved rows: Q4_K
// and Q6_K in the Q4_K_M mixes, Q2_K with Q3_K, Q3_K, MXFP4 with F32 biases, Q8_0, Q4_0, Q4_1,
// Q5_1, IQ4_NL): the same logits, prefill's panels reading rows the kernels unpack from the slot.
TEST(Golden, InterleavedPackIsBitIdenticalToLocal) {
  REQUIRE_GOLDEN();
  for (const char* id :
       {"qwen3moe-B-s11-q4_k_m", "deepseek2-B-s11-q4_k_m", "gpt-oss-B-s11-mxfp4_moe",
        "quant/qwen3moe-q2_k", "quant/qwen3moe-q3_k_s", "qwen3moe-A-s1-q8_0", "quant/qwen3moe-q4_0",
        "quant/qwen3moe-q4_1", "quant/qwen3moe-q5_1", "quant/qwen3moe-iq4_nl"})
    expect_daemon_path_bit_identical(id, expertd::pack::Layout::Rows8);
}

TEST(Golden, CoreGgufRefusesADaemonServingAnotherModel) {
  REQUIRE_GOLDEN();
  TempDir d;
  expertd::pack::BuildOptions bo;
  bo.model_path = golden_model("olmoe-A-s1-f32");
  bo.out_dir = d.path();
  bo.progress = false;
  auto rep = expertd::pack::build_pack(bo);
  ASSERT_TRUE(rep);
  Daemon daemon(rep->manifest_path, d / "s.sock",
                {"--cache-slots", "8", "--clients-max", "1", "--max-experts-per-request", "4"});
  ASSERT_TRUE(daemon.start());
  auto other = gguf::Model::open(golden_model("olmoe-A-s1-f16"));  // same shapes, other model
  auto m = engine::Model::load(*other);
  ASSERT_TRUE(m);
  auto src = engine::make_daemon_source(*m, d / "s.sock");
  ASSERT_FALSE(src);
  EXPECT_NE(src.error().message.find("expertd serves model"), std::string::npos)
      << src.error().message;
}
