// expert-run's GPU forward pass against llama.cpp's golden logits and the CPU engine's greedy
// tokens, with experts uploaded (--local) and through a cuda expertd whose cache is smaller than
// the model; the two GPU paths must give bit-identical logits. Also built against the CPU
// emulation of the CUDA runtime (tests/cuda_emu, EXPERTD_CUDA_EMULATION), with expertd built
// against it too; there the golden test keeps to one case per architecture.
#include "engine/cuda_engine.h"

#include <cstring>

#include "engine/golden_util.h"
#include "engine/speculative_util.h"
#include "gpu_util.h"

using namespace expertd::test;

TEST(CudaEngine, GoldenLogitsAndTheCpuEnginesGreedyTokens) {
  EXPERTD_REQUIRE_GPU();
  REQUIRE_GOLDEN();
  // Every case present (a GPU machine may carry a subset: scripts/gpu-carry.sh), at least one.
  std::vector<std::string> ids = golden_case_ids();
#ifdef EXPERTD_CUDA_EMULATION
  // The emulation runs a kernel's threads one after another: each architecture's f32 case (the
  // tightest limit) and gpt-oss's MXFP4 one keep it to a minute.
  std::erase_if(ids, [](const std::string& id) {
    return !id.ends_with("-A-s1-f32") && id != "gpt-oss-A-s1-mxfp4py";
  });
#endif
  int ran = 0;
  for (const std::string& id : ids) {
    if (!std::filesystem::exists(golden_model(id))) continue;
    ++ran;
    Case c = load_case(id);
    SCOPED_TRACE(c.id);
    auto file = gguf::Model::open(golden_model(c.id));
    ASSERT_TRUE(file);
    auto model = engine::Model::load(*file);
    ASSERT_TRUE(model) << model.error().message;
    auto gpu = engine::make_cuda_forward(*model, "", 256);
    ASSERT_TRUE(gpu) << gpu.error().message;
    // The GPU keeps float activations: the golden README's limits for such implementations
    // (f32 weights: every row within 1e-3).
    auto logits = teacher_forced(**gpu, c, nullptr);
    check_against_golden(c, logits);
    // Greedy tokens as the CPU engine's, up to the first step whose margin is below 0.3.
    auto src = engine::make_local_source(*model);
    engine::Engine cpu(*model, *src, 2, 256);
    auto margins = c.j["greedy_top1_top2_margins"].get<std::vector<double>>();
    size_t n = c.greedy.size();
    for (size_t i = 0; i < margins.size(); ++i)
      if (margins[i] < 0.3) {
        n = i;
        break;
      }
    auto a = greedy(cpu, c, n), b = greedy(**gpu, c, n);
    EXPECT_EQ(a, b);
  }
  EXPECT_GT(ran, 0) << "no golden case found under " << golden_dir();
}

#ifdef EXPERTD_CUDA_EMULATION
// What the host waits for, counted by the emulation as the CUDA runtime makes it wait. With the
// experts uploaded, a decoded token's MoE layers never leave the device (softmax routing in
// qwen3moe; sigmoid gating with a selection bias in deepseek2): the host waits once, for the
// logits. A batch of more routed slots than the device path takes (9 tokens) goes the grouped way:
// each MoE layer's routes come down in one download and go back up from pinned memory, which
// blocks nothing — one wait per MoE layer. The tokens' embeddings go up to an idle stream: a
// blocking copy, not a wait for the GPU.
TEST(CudaEngine, HostWaitsWhenDecoding) {
  REQUIRE_GOLDEN();
  for (const char* id : {"qwen3moe-A-s1-f32", "deepseek2-A-s1-f32"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto file = gguf::Model::open(golden_model(c.id));
    ASSERT_TRUE(file);
    auto model = engine::Model::load(*file);
    ASSERT_TRUE(model) << model.error().message;
    auto gpu = engine::make_cuda_forward(*model, "", 64);
    ASSERT_TRUE(gpu) << gpu.error().message;
    int n_moe = 0;
    for (int il = 0; il < model->hp.n_layer; ++il) n_moe += model->moe(il) != nullptr;
    std::vector<float> logits;
    ASSERT_TRUE((*gpu)->eval(c.prompt, false, logits));
    auto count = [&](std::span<const int32_t> tokens, uint64_t per_layer) {
      const uint64_t w0 = cuda_emu::stream_waits(), c0 = cuda_emu::blocking_copies();
      ASSERT_TRUE((*gpu)->eval(tokens, false, logits));
      const uint64_t waits = cuda_emu::stream_waits() - w0,
                     copies = cuda_emu::blocking_copies() - c0;
      std::printf(
          "  %s, %d MoE layers, %zu tokens: the host waits %llu times, %llu blocking copies\n", id,
          n_moe, tokens.size(), static_cast<unsigned long long>(waits),
          static_cast<unsigned long long>(copies));
      EXPECT_EQ(waits, per_layer * n_moe + 1);
      EXPECT_EQ(copies, per_layer * n_moe + 2);
    };
    for (size_t i = 0; i < 3; ++i) count({&c.greedy[i], 1}, 0);
    ASSERT_GE(c.prompt.size(), 9u);
    count(std::span(c.prompt).first(9), 1);
  }
}
#endif

TEST(CudaEngine, DaemonSlotsAreBitIdenticalToUploadedExperts) {
  EXPERTD_REQUIRE_GPU();
  REQUIRE_GOLDEN();
  for (const char* id : {"qwen3moe-B-s11-q4_k_m", "qwen2moe-A-s1-q8_0", "llama-A-s1-f16",
                         "deepseek2-A-s1-q8_0", "gpt-oss-A-s1-mxfp4py"}) {
    SCOPED_TRACE(id);
    ASSERT_TRUE(std::filesystem::exists(golden_model(id)))
        << "scripts/gpu-carry.sh carries this case";
    Case c = load_case(id);
    Packed p(id);
    ASSERT_FALSE(p.core.empty());
    Daemon daemon(p.manifest, p.dir / "s.sock",
                  {"--backend", "cuda", "--cache-slots", "8", "--clients-max", "2",
                   "--max-experts-per-request", "4"});
    std::string log;
    ASSERT_TRUE(daemon.start(&log)) << log;
    auto full = gguf::Model::open(p.model);
    auto core = gguf::Model::open(p.core);
    ASSERT_TRUE(full && core);
    auto mfull = engine::Model::load(*full);
    auto mcore = engine::Model::load(*core);
    ASSERT_TRUE(mfull && mcore);
    auto local = engine::make_cuda_forward(*mfull, "", 256);
    auto remote = engine::make_cuda_forward(*mcore, p.dir / "s.sock", 256);
    ASSERT_TRUE(local) << local.error().message;
    ASSERT_TRUE(remote) << remote.error().message;
    auto a = teacher_forced(**local, c, nullptr);
    auto b = teacher_forced(**remote, c, nullptr);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
        << "daemon and uploaded experts differ";
    auto ctl = run(bin("client/expertctl") + " --socket " + p.dir / "s.sock" + " stats --json");
    auto s = nlohmann::json::parse(ctl.second);
    EXPECT_GT(s["cache_evictions"].get<int>(), 0);
    EXPECT_EQ(s["h2d_bytes"].get<double>(), s["pack_read_bytes"].get<double>());
    EXPECT_EQ(s["io_errors"].get<int>(), 0);
  }
}

TEST(CudaEngine, ACpuOnlyDaemonIsAClearError) {
  EXPERTD_REQUIRE_GPU();
  REQUIRE_GOLDEN();
  Packed p("olmoe-A-s1-q8_0");  // carried by scripts/gpu-carry.sh
  ASSERT_FALSE(p.core.empty());
  Daemon daemon(p.manifest, p.dir / "s.sock",
                {"--cache-slots", "8", "--clients-max", "1", "--max-experts-per-request", "4"});
  ASSERT_TRUE(daemon.start());
  auto core = gguf::Model::open(p.core);
  auto m = engine::Model::load(*core);
  ASSERT_TRUE(m);
  auto f = engine::make_cuda_forward(*m, p.dir / "s.sock", 64);
  ASSERT_FALSE(f);
  EXPECT_NE(f.error().message.find("expertd --backend cuda"), std::string::npos)
      << f.error().message;
}

// Architectures without golden data (glm4moe: sigmoid routing with selection bias, partial RoPE,
// q/k biases; deepseek2 at DeepSeek-V2-Lite's shape: MLA without q_lora; kimi-k3: KDA with its
// recurrent state, nope MLA, attention residuals, latent experts, situ), as `expert-pack synth`
// writes them at test size, F16 weights (both engines widen them exactly; the CPU rounds
// activations to F16 for its dots): the GPU's logits against the CPU engine's.
std::string synth_model(const TempDir& d, const std::string& preset) {
  const std::string model = d / "m.gguf";
  auto s = run(bin("pack/expert-pack") + " -q synth --preset " + preset +
               " --dims 256,3,16,4,256,4,2,512 --type F16 --out " + model);
  EXPECT_EQ(s.first, 0) << s.second;
  return model;
}

TEST(CudaEngine, SynthGlm45DeepseekV2LiteAndKimiK3MatchTheCpuEngine) {
  EXPERTD_REQUIRE_GPU();
  const std::vector<int32_t> tokens = {11, 250, 100, 77, 500, 42, 9, 300};
  for (const std::string preset :
       {"glm-4.5-air", "deepseek-v2-lite", "kimi-k3", "qwen3.5-397b-a17b", "qwen3-next-80b-a3b"}) {
    SCOPED_TRACE(preset);
    TempDir d;
    auto file = gguf::Model::open(synth_model(d, preset));
    ASSERT_TRUE(file);
    auto model = engine::Model::load(*file);
    ASSERT_TRUE(model) << model.error().message;
    auto src = engine::make_local_source(*model);
    engine::Engine cpu(*model, *src, 2, 64);
    auto gpu = engine::make_cuda_forward(*model, "", 64);
    ASSERT_TRUE(gpu) << gpu.error().message;
    // A prefill of 5, then 3 decode steps, on both.
    std::vector<float> fc, fg, step;
    for (auto* eng : {static_cast<engine::Forward*>(&cpu), gpu->get()}) {
      auto& out = eng == &cpu ? fc : fg;
      ASSERT_TRUE(eng->eval({tokens.data(), 5}, true, out));
      for (size_t i = 5; i < tokens.size(); ++i) {
        ASSERT_TRUE(eng->eval({tokens.data() + i, 1}, true, step));
        out.insert(out.end(), step.begin(), step.end());
      }
    }
    ASSERT_EQ(fc.size(), tokens.size() * 512);
    ASSERT_EQ(fg.size(), fc.size());
    double mx = 0, mag = 0;
    for (size_t i = 0; i < fc.size(); ++i)
      mx = std::max(mx, std::fabs(double(fc[i]) - fg[i])),
      mag = std::max(mag, std::fabs(double(fc[i])));
    EXPECT_GT(mag, 0.1) << "logits all near zero: the comparison would say nothing";
    EXPECT_LE(mx, 1.5e-2) << "GPU and CPU logits differ beyond F16 rounding";
  }
}

// The 40-token synth cases with layers the 8-token preset check above does not reach: Qwen3.5's
// and Qwen3-Next's gated full attention beside the delta-net (tiled and grouped value heads),
// Mistral Large 3's query temperature past its first step, DeepSeek-V3.2's and GLM-5's sparse
// attention past the indexer's top-k, MiniMax-M2's q/k norms over all heads, MiniMax-M3's
// sparse attention past its top blocks, Ling's fused QKV and grouped routing, ERNIE's shared
// experts beside softmax routing, K-EXAONE's windows and unrotated global layers, Llama 4's
// input-weighted expert and tempered queries. Teacher-forced,
// the GPU's logits against the CPU engine's. Ling 3.0's KDA with the decay rate stored as
// exp(A_log) beside latent attention with RoPE and per-head gates.
// A synthetic case's teacher-forced logits on the GPU against the CPU engine's (F32 weights).
static void check_gpu_matches_cpu(const char* id) {
  SCOPED_TRACE(id);
  Case c = load_case(id);
  auto l = load(c);
  ASSERT_TRUE(l);
  auto src = engine::make_local_source(l->model);
  engine::Engine cpu(l->model, *src, 2, 256);
  auto gpu = engine::make_cuda_forward(l->model, "", 256);
  ASSERT_TRUE(gpu) << gpu.error().message;
  const auto fc = teacher_forced(cpu, c, nullptr);
  const auto fg = teacher_forced(**gpu, c, nullptr);
  ASSERT_EQ(fc.size(), fg.size());
  double mx = 0;
  for (size_t i = 0; i < fc.size(); ++i) mx = std::max(mx, std::fabs(double(fc[i]) - fg[i]));
  EXPECT_LE(mx, 1e-3) << "GPU and CPU logits differ";
}

TEST(CudaEngine, NewerAttentionFamiliesMatchTheCpuEngine) {
  EXPERTD_REQUIRE_GPU();
  for (const char* id : {"qwen35/q35-f32", "qwen35/next-f32", "mistral3/ml3-f32", "dsa/ds32-f32",
                         "dsa/glm5-f32", "minimax/m3-f32", "ling3/ling3-f32"})
    check_gpu_matches_cpu(id);
}

// The grouped-query families of issue 45: MiniMax-M2, Ling 2.0, ERNIE 4.5, K-EXAONE (windows,
// NoPE layers), Llama 4 (chunks, temperature, the router's weight before the expert), Hy3,
// Trinity (muP embeddings, gated attention, sandwich norms), MiMo-V2 (value heads of their own
// size, per-layer KV heads, sinks), Laguna (per-layer query heads, softplus gates per head, YaRN
// and plain RoPE by layer), Step 3.5 (per-layer heads, per-head sigmoid gates, SwiGLU clamps).
TEST(CudaEngine, GroupedQueryFamiliesMatchTheCpuEngine) {
  EXPERTD_REQUIRE_GPU();
  for (const char* id : {"minimax/m2-f32", "ling/ling-f32", "ernie/ernie-f32", "exaone/exaone-f32",
                         "llama4/l4-f32", "hy3/hy3-f32", "trinity/trinity-f32", "mimo/mimo-f32",
                         "laguna/laguna-f32", "step/step-f32", "llama4/l4-k2-f32"})
    check_gpu_matches_cpu(id);
}

// DeepSeek-V4 (hyper-connections, the window ring, both compressors, the indexer's top-k, hash
// routing, limited SwiGLU), F32, long enough for every mechanism to act: a prefill of 100, one of
// 31 (past the first compressed-by-128 entry), then decode steps; the GPU's logits against the
// CPU engine's.
TEST(CudaEngine, Deepseek4MatchesTheCpuEngine) {
  EXPERTD_REQUIRE_GPU();
  TempDir d;
  const std::string path = d / "m.gguf";
  auto s = run(bin("pack/expert-pack") + " -q synth --preset deepseek-v4-flash --dims " +
               "128,4,8,2,64,4,1,512 --type F32 --out " + path);
  ASSERT_EQ(s.first, 0) << s.second;
  auto file = gguf::Model::open(path);
  ASSERT_TRUE(file);
  auto model = engine::Model::load(*file);
  ASSERT_TRUE(model) << model.error().message;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 136; ++i) tokens.push_back((i * 37 + 11) % 300);
  auto src = engine::make_local_source(*model);
  engine::Engine cpu(*model, *src, 2, 160);
  auto gpu = engine::make_cuda_forward(*model, "", 160);
  ASSERT_TRUE(gpu) << gpu.error().message;
  std::vector<float> fc, fg, step;
  for (auto* eng : {static_cast<engine::Forward*>(&cpu), gpu->get()}) {
    auto& out = eng == &cpu ? fc : fg;
    size_t at = 0;
    for (size_t n : {100, 31, 1, 1, 1, 1, 1}) {
      auto st = eng->eval({tokens.data() + at, n}, true, step);
      ASSERT_TRUE(st) << st.error().message;
      out.insert(out.end(), step.begin(), step.end());
      at += n;
    }
  }
  ASSERT_EQ(fc.size(), tokens.size() * 512);
  ASSERT_EQ(fg.size(), fc.size());
  double mx = 0, mag = 0;
  for (size_t i = 0; i < fc.size(); ++i)
    mx = std::max(mx, std::fabs(double(fc[i]) - fg[i])),
    mag = std::max(mag, std::fabs(double(fc[i])));
  EXPECT_GT(mag, 0.1);
  EXPECT_LE(mx, 1e-3) << "GPU and CPU logits differ";
}

// Batched evaluation on the GPU (several sequences in one pass, as expert-serve runs them):
// each sequence's logits are bit-identical to its run alone on the GPU, for a golden Q4_K_M
// model (MLA), Kimi-K3 (per-sequence delta-attention state) and DeepSeek-V4 (window ring,
// compressors, indexer).
TEST(CudaEngine, BatchedSequencesGetTheirLogitsAlone) {
  EXPERTD_REQUIRE_GPU();
  auto gpu_engines = [](const engine::Model& m) {
    return [&m](int n_seq) -> std::unique_ptr<engine::Engine> {
      auto f = engine::make_cuda_forward(m, "", 64, 0, n_seq);
      EXPECT_TRUE(f) << (f ? "" : f.error().message);
      return f ? std::move(*f) : nullptr;
    };
  };
  REQUIRE_GOLDEN();
  for (const char* id : {"deepseek2-B-s11-q4_k_m"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto file = gguf::Model::open(golden_model(id));
    ASSERT_TRUE(file);
    auto model = engine::Model::load(*file);
    ASSERT_TRUE(model) << model.error().message;
    check_batched_equals_alone(*model, c, gpu_engines(*model));
  }
  for (const char* id :
       {"kimi-k3/k3-q8_0", "deepseek4/v4-f32", "qwen35/q35-f32", "qwen35/next-q8_0",
        "mistral3/ml3-q4_k", "dsa/ds32-q4_k", "minimax/m3-q4_k", "ling3/ling3-q4_k"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load(c);
    ASSERT_TRUE(l);
    check_batched_equals_alone(l->model, c, gpu_engines(l->model));
  }
}

// The same models through a cuda expertd whose cache is smaller than the model (12 of 48 experts):
// bit-identical to uploaded experts, with and without prefetch hints (which expertd acts on).
TEST(CudaEngine, SynthModelsThroughACudaExpertdAreBitIdenticalToUploadedExperts) {
  EXPERTD_REQUIRE_GPU();
  const std::vector<int32_t> tokens = {11, 250, 100, 77, 500, 42, 9, 300};
  for (const std::string preset :
       {"glm-4.5-air", "deepseek-v2-lite", "kimi-k3", "deepseek-v4-flash", "qwen3.5-397b-a17b",
        "qwen3-next-80b-a3b"}) {
    SCOPED_TRACE(preset);
    TempDir d;
    const std::string model = synth_model(d, preset);
    auto b = run(bin("pack/expert-pack") + " -q build " + model);
    ASSERT_EQ(b.first, 0) << b.second;
    Daemon daemon(d / "m.manifest.json", d / "s.sock",
                  {"--backend", "cuda", "--cache-slots", "12", "--clients-max", "3",
                   "--max-experts-per-request", "4"});
    std::string log;
    ASSERT_TRUE(daemon.start(&log)) << log;
    auto full = gguf::Model::open(model);
    auto core = gguf::Model::open(d / "m.core.gguf");
    ASSERT_TRUE(full && core);
    auto mfull = engine::Model::load(*full);
    auto mcore = engine::Model::load(*core);
    ASSERT_TRUE(mfull && mcore);
    auto local = engine::make_cuda_forward(*mfull, "", 64);
    auto remote = engine::make_cuda_forward(*mcore, d / "s.sock", 64);
    auto hinted = engine::make_cuda_forward(*mcore, d / "s.sock", 64);
    ASSERT_TRUE(local) << local.error().message;
    ASSERT_TRUE(remote) << remote.error().message;
    ASSERT_TRUE(hinted) << hinted.error().message;
    (*hinted)->set_prefetch(true);
    std::vector<float> a, r, h, step;
    ASSERT_TRUE((*local)->eval(tokens, true, a));
    ASSERT_TRUE((*remote)->eval(tokens, true, r));
    ASSERT_TRUE((*hinted)->eval({tokens.data(), 5}, true, h));  // a prefill, then decode steps
    for (size_t i = 5; i < tokens.size(); ++i) {
      ASSERT_TRUE((*hinted)->eval({tokens.data() + i, 1}, true, step));
      h.insert(h.end(), step.begin(), step.end());
    }
    ASSERT_EQ(a.size(), tokens.size() * 512);
    ASSERT_EQ(a.size(), r.size());
    EXPECT_EQ(0, std::memcmp(a.data(), r.data(), a.size() * 4))
        << "the cuda expertd's slots and uploaded experts differ";
    // The hinted run is a prefill of 5 then single tokens: the reference with uploaded experts
    // evaluates the same way.
    std::vector<float> a2;
    (*local)->reset();
    ASSERT_TRUE((*local)->eval({tokens.data(), 5}, true, a2));
    for (size_t i = 5; i < tokens.size(); ++i) {
      ASSERT_TRUE((*local)->eval({tokens.data() + i, 1}, true, step));
      a2.insert(a2.end(), step.begin(), step.end());
    }
    ASSERT_EQ(a2.size(), h.size());
    EXPECT_EQ(0, std::memcmp(a2.data(), h.data(), h.size() * 4))
        << "prefetch hints changed the logits";
    auto metrics = (*hinted)->daemon_metrics();
    double hints = 0;  // hinted experts the daemon read, declined or dropped
    for (const auto& m : metrics)
      if (m.name == "prefetch_issued" || m.name == "prefetch_rejected" ||
          m.name == "prefetch_dropped")
        hints += m.value;
    EXPECT_GT(hints, 0) << "the GPU engine sent no prefetch hints";
  }
}

// A sequence's state copied out of the GPU's caches and into another slot (expert-serve's prefix
// reuse on --device cuda): the rest of the sequence gives bit for bit the logits of the slot that
// evaluated the prompt, for MLA, Kimi-K3's delta-attention states and DeepSeek-V4's ring,
// compressors and entries; a cut where no layer is recurrent too.
TEST(CudaEngine, StatesResumeBitForBitInAnotherSlot) {
  EXPERTD_REQUIRE_GPU();
  auto check = [](const engine::Model& m, const Case& c) {
    auto f = engine::make_cuda_forward(m, "", std::max(64, int(c.all.size()) + 8), 0, 2);
    ASSERT_TRUE(f) << f.error().message;
    engine::Engine& e = **f;
    auto eval_in = [&](int slot, std::span<const int32_t> t) {
      std::vector<float> lg;
      const engine::SeqTokens s{slot, t};
      auto st = e.eval({&s, 1}, true, lg);
      EXPECT_TRUE(st) << (st ? "" : st.error().message);
      return lg;
    };
    const std::span<const int32_t> all(c.all);
    const size_t half = all.size() / 2;
    eval_in(0, all.subspan(0, half));
    engine::SeqState st;
    ASSERT_TRUE(e.save_state(0, st));
    const auto want = eval_in(0, all.subspan(half));
    ASSERT_TRUE(e.load_state(1, st, int(half)));
    const auto got = eval_in(1, all.subspan(half));
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "resumed logits differ";
    if (!e.can_cut()) return;
    engine::SeqState whole;
    ASSERT_TRUE(e.save_state(0, whole));
    ASSERT_TRUE(e.load_state(1, whole, int(half)));
    const auto again = eval_in(1, all.subspan(half));
    EXPECT_EQ(std::memcmp(again.data(), want.data(), again.size() * sizeof(float)), 0)
        << "logits after a cut differ";
  };
  REQUIRE_GOLDEN();
  for (const char* id : {"deepseek2-B-s11-q4_k_m", "kimi-k3/k3-q8_0", "deepseek4/v4-f32",
                         "qwen35/q35-q4_k", "qwen35/next-f32", "mistral3/ml3-f32", "dsa/ds32-f32",
                         "dsa/glm5-q4_k", "minimax/m3-q4_k", "ling3/ling3-q4_k"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = std::string(id).find('/') == std::string::npos ? load_golden(id) : load(c);
    ASSERT_TRUE(l);
    check(l->model, c);
  }
}

// Speculative decoding on the GPU: greedy decoding with n-gram drafts gives plain decoding's
// tokens from bit-identical logits (the verify eval's rows are the one-token evals' rows), on
// golden models with grouped-query and latent attention, Llama 4's chunked attention, and models
// with a recurrent state.
TEST(CudaEngine, SpeculativeGreedyIsIdentical) {
  EXPERTD_REQUIRE_GPU();
  REQUIRE_GOLDEN();
  auto gpu = [](const engine::Model& m) {
    return [&m]() -> std::unique_ptr<engine::Engine> {
      auto f = engine::make_cuda_forward(m, "", 512);
      EXPECT_TRUE(f) << (f ? "" : f.error().message);
      return f ? std::move(*f) : nullptr;
    };
  };
  uint64_t kept = 0;
  for (const char* id : {"qwen3moe-B-s11-q4_k_m", "deepseek2-A-s1-f32"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto file = gguf::Model::open(golden_model(id));
    ASSERT_TRUE(file);
    auto model = engine::Model::load(*file);
    ASSERT_TRUE(model) << model.error().message;
    kept += check_greedy_identical(gpu(*model), *model, doubled(c.prompt), 24, 4);
  }
  for (const char* id : {"llama4/l4-q4_k"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load(c);
    ASSERT_TRUE(l);
    kept += check_greedy_identical(gpu(l->model), l->model, doubled(c.prompt), 24, 4);
  }
  EXPECT_GT(kept, 0u);
  // A recurrent state (Qwen3.5's delta rule): restored after a rejection and the kept tokens
  // evaluated again, the device's bits unchanged (DeepSeek-V4's compressors, on the CPU: the
  // emulation is slow).
  Case c = load_case("qwen35/q35-f16");
  auto l = load(c);
  ASSERT_TRUE(l);
  EXPECT_GT(check_greedy_identical(gpu(l->model), l->model, doubled(c.prompt), 64, 5), 0u);
}

// NextN drafting on the device (the catch-up's hidden rows uploaded, the block's own cache; the
// chained blocks' steps over several rows):
// greedy decoding with its drafts is plain decoding bit for bit, and its drafts' logits are the
// CPU engine's within the F32 limit (llama.cpp's, tests/engine/nextn_test.cpp).
TEST(CudaEngine, NextnDraftsMatchTheCpu) {
  EXPERTD_REQUIRE_GPU();
  // GLM-4.5's block, and MiMo-V2's three chained ones (sliding attention with sinks)
  for (const char* id : {"glm45air-f32", "mimo2-f32"}) {
    SCOPED_TRACE(id);
    Case c;
    c.j =
        nlohmann::json::parse(read_file(golden_case_dir(std::string("mtp/") + id) + "/case.json"));
    c.prompt = c.j["prompt_tokens"].get<std::vector<int32_t>>();
    const int32_t pending = c.j["pending_token"].get<int32_t>();
    auto l = std::make_unique<Loaded>();
    l->path = synth_case(c, l->d);
    auto f = gguf::Model::open(l->path);
    ASSERT_TRUE(f) << f.error().message;
    l->file.emplace(std::move(*f));
    auto m = engine::Model::load(*l->file, /*nextn=*/true);
    ASSERT_TRUE(m) << m.error().message;
    const engine::Model& model = *m;
    auto gpu = [&model]() -> std::unique_ptr<engine::Engine> {
      auto e = engine::make_cuda_forward(model, "", 512);
      EXPECT_TRUE(e) << (e ? "" : e.error().message);
      if (!e) return nullptr;
      EXPECT_TRUE((*e)->set_nextn(true));
      return std::move(*e);
    };
    auto src = engine::make_local_source(model);
    engine::Engine cpu(model, *src, 2, 512);
    ASSERT_TRUE(cpu.set_nextn(true));
    auto dev = gpu();
    ASSERT_TRUE(dev);
    std::vector<float> lg, a, b;
    std::vector<int32_t> da, db;
    ASSERT_TRUE(cpu.eval(c.prompt, false, lg));
    ASSERT_TRUE(dev->eval(c.prompt, false, lg));
    ASSERT_TRUE(cpu.draft_nextn(0, pending, 4, da, &a));
    ASSERT_TRUE(dev->draft_nextn(0, pending, 4, db, &b));
    EXPECT_EQ(da, db);
    EXPECT_EQ(da, c.j["draft_tokens"].get<std::vector<int32_t>>());
    ASSERT_EQ(a.size(), b.size());
    double mx = 0;
    for (size_t i = 0; i < a.size(); ++i) mx = std::max(mx, std::fabs(double(a[i]) - b[i]));
    EXPECT_LE(mx, 1e-4);
    check_greedy_identical(gpu, model, doubled(c.prompt), 24, 4,
                           engine::Drafter{engine::DraftKind::Mtp, {}});
  }
}
