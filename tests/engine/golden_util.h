// Golden-data helpers shared by the CPU engine's tests and the GPU's (tests/gpu/).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <type_traits>

#include "engine/engine.h"
#include "pack/builder.h"
#include "test_util.h"

namespace expertd::test {

// The architectures the engine implements and the golden variants of each.
inline constexpr const char* kGoldenArchs[] = {"qwen3moe", "olmoe",     "llama",
                                               "qwen2moe", "deepseek2", "gpt-oss"};
inline constexpr const char* kGoldenVariants[] = {"A-s1-f32", "A-s1-f16", "A-s1-q8_0",
                                                  "B-s11-q4_k_m"};

// Every golden case: each architecture in each variant, and gpt-oss's two MXFP4 ones.
inline std::vector<std::string> golden_case_ids() {
  std::vector<std::string> ids;
  for (const char* arch : kGoldenArchs)
    for (const char* variant : kGoldenVariants) ids.push_back(std::string(arch) + "-" + variant);
  ids.push_back("gpt-oss-A-s1-mxfp4py");     // MXFP4 experts, the rest F32
  ids.push_back("gpt-oss-B-s11-mxfp4_moe");  // llama.cpp's MXFP4_MOE: MXFP4 experts, the rest Q8_0
  return ids;
}

// The weight-type cases (golden/quant/): a qwen3moe quantized by llama-quantize to each type.
inline constexpr const char* kGoldenQuantTypes[] = {
    "q2_k",  "q2_k_s",  "q3_k_s", "q3_k_m", "q4_0",    "q4_1",  "q5_1",   "iq1_s",
    "iq1_m", "iq2_xxs", "iq2_xs", "iq2_m",  "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs"};
inline std::vector<std::string> golden_quant_case_ids() {
  std::vector<std::string> ids;
  for (const char* t : kGoldenQuantTypes) ids.push_back(std::string("quant/qwen3moe-") + t);
  return ids;
}

struct Case {
  std::string id;
  nlohmann::json j;
  std::vector<int32_t> prompt, all, greedy;
  std::vector<float> logits;  // [n_tokens, n_vocab]
  int n_vocab = 0;
};

inline Case load_case(const std::string& id) {
  Case c;
  c.id = id;
  c.j = nlohmann::json::parse(read_file(golden_case_dir(id) + "/case.json"));
  c.prompt = c.j["prompt_tokens"].get<std::vector<int32_t>>();
  c.all = c.j["all_tokens"].get<std::vector<int32_t>>();
  c.greedy = c.j["greedy_tokens"].get<std::vector<int32_t>>();
  c.n_vocab = c.j["logits"]["shape"][1].get<int>();
  std::string raw = read_file(golden_case_dir(id) + "/logits.bin");
  c.logits.resize(raw.size() / 4);
  std::memcpy(c.logits.data(), raw.data(), raw.size());
  return c;
}

// Teacher-forced as llama.cpp ran it: the prompt in one batch, then one token at a time.
template <typename Eng>
std::vector<float> teacher_forced(Eng& eng, const Case& c,
                                  std::vector<std::vector<std::vector<uint32_t>>>* routes) {
  std::vector<float> all, step;
  eng.reset();
  auto st = eng.eval({c.prompt.data(), c.prompt.size()}, true, all);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  auto keep_routes = [&] {
    if constexpr (std::is_same_v<Eng, engine::Engine>) {  // only the CPU engine keeps routes
      if (!routes) return;
      for (size_t il = 0; il < eng.routes().size(); ++il) {
        if (routes->size() <= il) routes->resize(eng.routes().size());
        for (const auto& r : eng.routes()[il]) {
          auto s = r.experts;
          std::sort(s.begin(), s.end());
          (*routes)[il].push_back(s);
        }
      }
    }
  };
  keep_routes();
  for (size_t i = c.prompt.size(); i < c.all.size(); ++i) {
    st = eng.eval({c.all.data() + i, 1}, true, step);
    EXPECT_TRUE(st) << (st ? "" : st.error().message);
    all.insert(all.end(), step.begin(), step.end());
    keep_routes();
  }
  return all;
}

template <typename Eng>
std::vector<int32_t> greedy(Eng& eng, const Case& c, size_t n) {
  std::vector<float> logits;
  eng.reset();
  std::vector<int32_t> out;
  auto st = eng.eval({c.prompt.data(), c.prompt.size()}, false, logits);
  EXPECT_TRUE(st);
  for (size_t i = 0; i < n; ++i) {
    int32_t best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    if (!eng.eval({&best, 1}, false, logits)) break;
  }
  return out;
}

// Returns the median row-max |Δ| (quantized cases are judged together, see the test). f32_max:
// the F32 cases' bound on every row.
inline double check_against_golden(const Case& c, const std::vector<float>& mine,
                                   double f32_max = 1e-4) {
  EXPECT_EQ(mine.size(), c.logits.size());
  if (mine.size() != c.logits.size()) return 1e9;
  const size_t rows = c.all.size(), V = c.n_vocab;
  std::vector<double> rowmax(rows);
  for (size_t r = 0; r < rows; ++r)
    for (size_t v = 0; v < V; ++v)
      rowmax[r] = std::max(rowmax[r], std::fabs(double(mine[r * V + v]) - c.logits[r * V + v]));
  double mx = *std::max_element(rowmax.begin(), rowmax.end());
  if (getenv("ROWS"))
    for (double r : rowmax) std::printf("%.2e ", r);
  std::string variant = c.id.substr(c.id.rfind('-') + 1);
  if (variant == "f32") {
    EXPECT_LE(mx, f32_max) << c.id;
  } else if (variant == "f16") {
    EXPECT_LE(mx, 1.5e-2) << c.id;
  }
  auto sorted = rowmax;
  std::sort(sorted.begin(), sorted.end());
  if (variant != "f32" && variant != "f16") {  // the golden README's limits for quantized models
    EXPECT_LE(sorted[rows / 2], 0.25) << c.id << " median row-max";
    size_t over = std::count_if(rowmax.begin(), rowmax.end(), [](double d) { return d > 0.5; });
    EXPECT_LE(over, rows / 5) << c.id;
  }
  return sorted[rows / 2];
}

// A golden model packed into a temporary directory: manifest, core GGUF and pack beside a copy
// of the model (so the full GGUF and its core sit together, as `expert-pack build` leaves them).
struct Packed {
  TempDir dir;
  std::string model, core, manifest;
  explicit Packed(const std::string& case_id) {
    model = dir / "m.gguf";
    std::filesystem::copy_file(golden_model(case_id), model);
    expertd::pack::BuildOptions o;
    o.model_path = model;
    o.progress = false;
    auto rep = expertd::pack::build_pack(o);
    EXPECT_TRUE(rep) << (rep ? "" : rep.error().message);
    if (rep) core = rep->core_path, manifest = rep->manifest_path;
  }
};

// Synthetic cases (tests/data/<arch>/<case>: an expert-pack synth recipe and llama.cpp's logits).
// The case's model, written by expert-pack synth from the recipe in its case.json.
inline std::string synth_case(const Case& c, const TempDir& d) {
  std::string cmd = bin("pack/expert-pack") + " -q";
  for (const auto& a : c.j["synth"]) cmd += " " + a.get<std::string>();
  const std::string model = d / "m.gguf";
  auto s = run(cmd + " --out " + model);
  EXPECT_EQ(s.first, 0) << s.second;
  return model;
}

struct Loaded {
  TempDir d;
  std::string path;
  std::optional<gguf::Model> file;
  engine::Model model;
};

// The model file at l->path opened and loaded (null, the failure reported, where it cannot be).
inline std::unique_ptr<Loaded> open_loaded(std::unique_ptr<Loaded> l) {
  auto f = gguf::Model::open(l->path);
  EXPECT_TRUE(f) << (f ? "" : f.error().message);
  if (!f) return nullptr;
  l->file.emplace(std::move(*f));
  auto m = engine::Model::load(*l->file);
  EXPECT_TRUE(m) << (m ? "" : m.error().message);
  if (!m) return nullptr;
  l->model = std::move(*m);
  return l;
}

inline std::unique_ptr<Loaded> load(const Case& c) {
  auto l = std::make_unique<Loaded>();
  l->path = synth_case(c, l->d);
  return open_loaded(std::move(l));
}

// A golden case's model (../shared/golden).
inline std::unique_ptr<Loaded> load_golden(const std::string& id) {
  auto l = std::make_unique<Loaded>();
  l->path = golden_model(id);
  return open_loaded(std::move(l));
}

// A synthetic case (tests/data/<family>/<id>, its suffix the variant) on the CPU engine against
// llama.cpp: the golden README's limits on every row, the median row-max under 1e-5 (f32) or
// 0.1, and free-running greedy tokens llama.cpp's at every step (f32),
// else up to the first step llama.cpp decided by less than 0.3 (the README's rule). Prints the
// figures.
// The F32 cases' bounds on every row and on the median row (llama.cpp's F32 path: 1e-4, 1e-5).
inline void check_synth_case(const std::string& id, const std::string& arch, double f32_max = 1e-4,
                             double f32_median = 1e-5) {
  SCOPED_TRACE(id);
  Case c = load_case(id);
  auto l = load(c);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->model.hp.arch, arch);
  auto src = engine::make_local_source(l->model);
  engine::Engine e(l->model, *src, 2, 256);
  const auto mine = teacher_forced(e, c, nullptr);
  const double median = check_against_golden(c, mine, f32_max);
  double mx = 0;
  for (size_t i = 0; i < mine.size() && i < c.logits.size(); ++i)
    mx = std::max(mx, std::fabs(double(mine[i]) - c.logits[i]));
  std::printf("%s: |logit - llama.cpp| max %.2e, median row %.2e\n", id.c_str(), mx, median);
  const bool f32 = id.ends_with("f32");
  EXPECT_LE(median, f32 ? f32_median : 0.1);
  auto tokens = greedy(e, c, c.greedy.size());
  const auto& margins = c.j["greedy_top1_top2_margins"];
  for (size_t i = 0; i < c.greedy.size(); ++i) {
    if (!f32 && margins[i].get<double>() < 0.3) break;
    ASSERT_LT(i, tokens.size());
    EXPECT_EQ(tokens[i], c.greedy[i]) << "greedy step " << i;
  }
}

// A synthetic case through a real expertd whose cache holds 4 experts, fewer than one layer's
// prefill touches: teacher-forced logits bit-identical to --local, the prompt's unique experts
// in some layer more than the cache, evictions and no I/O errors.
inline void check_daemon_path_is_local(const Case& c) {
  auto l = load(c);
  ASSERT_TRUE(l);
  expertd::pack::BuildOptions bo;
  bo.model_path = l->path;
  bo.out_dir = l->d.path();
  bo.progress = false;
  auto rep = expertd::pack::build_pack(bo);
  ASSERT_TRUE(rep) << rep.error().message;
  Daemon daemon(rep->manifest_path, l->d / "s.sock",
                {"--cache-slots", "4", "--clients-max", "2", "--max-experts-per-request", "2",
                 "--policy", "lru"});
  std::string log;
  ASSERT_TRUE(daemon.start(&log)) << log;
  auto core = gguf::Model::open(rep->core_path);
  ASSERT_TRUE(core);
  auto mcore = engine::Model::load(*core);
  ASSERT_TRUE(mcore) << mcore.error().message;
  EXPECT_FALSE(mcore->has_local_experts);
  auto local = engine::make_local_source(l->model);
  auto remote = engine::make_daemon_source(*mcore, l->d / "s.sock");
  ASSERT_TRUE(remote) << remote.error().message;
  engine::Engine e_local(l->model, *local, 2, 256), e_remote(*mcore, **remote, 2, 256);
  auto a = teacher_forced(e_local, c, nullptr);
  auto b = teacher_forced(e_remote, c, nullptr);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "daemon and local logits differ";
  e_local.reset();
  std::vector<float> lg;
  ASSERT_TRUE(e_local.eval({c.prompt.data(), c.prompt.size()}, false, lg));
  size_t most = 0;
  for (const auto& layer : e_local.routes()) {
    std::set<uint32_t> u;
    for (const auto& r : layer) u.insert(r.experts.begin(), r.experts.end());
    most = std::max(most, u.size());
  }
  EXPECT_GT(most, 4u);
  auto ctl = run(bin("client/expertctl") + " --socket " + l->d / "s.sock" + " stats --json");
  auto st = nlohmann::json::parse(ctl.second);
  EXPECT_GT(st["cache_evictions"].get<int>(), 0);
  EXPECT_EQ(st["io_errors"].get<int>(), 0);
}

// A model's state (caches, recurrent state) carries from one eval to the next: the case's tokens
// in chunks of each size give the logits of one batch (within tol); a reset starts from a zero
// state (the same rows again, exactly).
inline void check_chunked_prefill(const engine::Model& model, const Case& c,
                                  std::initializer_list<size_t> chunks, double tol) {
  auto src = engine::make_local_source(model);
  engine::Engine e(model, *src, 2, 256);
  const auto& toks = c.all;
  const size_t V = c.n_vocab;
  auto in_chunks = [&](size_t n) {
    std::vector<float> all, step;
    e.reset();
    for (size_t i = 0; i < toks.size(); i += n) {
      const size_t m = std::min(n, toks.size() - i);
      auto st = e.eval({toks.data() + i, m}, true, step);
      EXPECT_TRUE(st) << (st ? "" : st.error().message);
      all.insert(all.end(), step.begin(), step.end());
    }
    return all;
  };
  const auto one = in_chunks(toks.size());
  ASSERT_EQ(one.size(), toks.size() * V);
  for (size_t n : chunks) {
    SCOPED_TRACE(n);
    const auto chunked = in_chunks(n);
    ASSERT_EQ(chunked.size(), one.size());
    double mx = 0;
    for (size_t i = 0; i < one.size(); ++i)
      mx = std::max(mx, std::fabs(double(one[i]) - chunked[i]));
    EXPECT_LE(mx, tol);
  }
  EXPECT_EQ(in_chunks(toks.size()), one);
}

// And the state matters: without the case's first 6 tokens, the logits of the rest differ.
inline void check_state_matters(const engine::Model& model, const Case& c) {
  auto src = engine::make_local_source(model);
  engine::Engine e(model, *src, 2, 256);
  const auto& toks = c.all;
  const size_t V = c.n_vocab;
  std::vector<float> one, tail;
  ASSERT_TRUE(e.eval({toks.data(), toks.size()}, true, one));
  e.reset();
  ASSERT_TRUE(e.eval({toks.data() + 6, toks.size() - 6}, true, tail));
  double diff = 0;
  for (size_t i = 0; i < tail.size(); ++i)
    diff = std::max(diff, std::fabs(double(tail[i]) - one[6 * V + i]));
  EXPECT_GT(diff, 1e-2);
}

// A copy of a GGUF whose metadata key `key` is renamed (same length, so the file stays valid):
// to the reader, the key is missing.
inline bool write_without_key(const std::string& in, const std::string& key,
                              const std::string& out) {
  std::string bytes = read_file(in);
  std::string pattern(8, '\0');
  uint64_t n = key.size();
  std::memcpy(pattern.data(), &n, 8);
  pattern += key;
  const size_t at = bytes.find(pattern);
  if (at == std::string::npos) return false;
  bytes[at + pattern.size() - 1] = '~';
  std::ofstream(out, std::ios::binary) << bytes;
  return true;
}

// The model file `in` with the u32 key `key` (whose value must be `expect`) set to `value`, as
// `out`.
inline void write_with_u32(const std::string& in, const std::string& key, uint32_t expect,
                           uint32_t value, const std::string& out) {
  std::string bytes = read_file(in);
  std::string pattern(8, '\0');
  const uint64_t n = key.size();
  std::memcpy(pattern.data(), &n, 8);
  pattern += key;
  const size_t at = bytes.find(pattern);  // the key's value follows its name and its type
  ASSERT_NE(at, std::string::npos) << key;
  uint32_t type = 0, was = 0;
  std::memcpy(&type, &bytes[at + pattern.size()], 4);
  std::memcpy(&was, &bytes[at + pattern.size() + 4], 4);
  ASSERT_EQ(type, 4u) << key;  // GGUF's u32
  ASSERT_EQ(was, expect) << key;
  std::memcpy(&bytes[at + pattern.size() + 4], &value, 4);
  std::ofstream(out, std::ios::binary) << bytes;
}

// The case's teacher-forced logits on the model file at `path` (a variant of its synth model).
inline std::vector<float> case_logits_of(const Case& c, const std::string& path) {
  auto g = gguf::Model::open(path);
  EXPECT_TRUE(g);
  if (!g) return {};
  auto m = engine::Model::load(*g);
  EXPECT_TRUE(m) << (m ? "" : m.error().message);
  if (!m) return {};
  auto src = engine::make_local_source(*m);
  engine::Engine e(*m, *src, 2, 256);
  return teacher_forced(e, c, nullptr);
}

// The case's model with the u32 key `key` changed from `was` to `value` is refused at load, the
// error naming the key (a value llama.cpp would not run, or would run another way).
inline void check_refused_with_u32(const Case& c, const std::string& key, uint32_t was,
                                   uint32_t value) {
  TempDir d;
  const std::string bad = d / "refused.gguf";
  write_with_u32(synth_case(c, d), key, was, value, bad);
  if (::testing::Test::HasFatalFailure()) return;
  auto g = gguf::Model::open(bad);
  ASSERT_TRUE(g);
  auto m = engine::Model::load(*g);
  ASSERT_FALSE(m) << key << " = " << value << " was accepted";
  const std::string bare = key.substr(key.find('.') + 1);  // without the architecture prefix
  EXPECT_NE(m.error().message.find(bare), std::string::npos) << m.error().message;
}

// A variant of a case's model that changes the math from row `row` of the teacher-forced rows on
// only (a sparse attention's selection made dense): the rows before it bit for bit the same, the
// later ones not.
inline void check_rows_change_from(const Case& c, const std::string& model,
                                   const std::string& variant, size_t row) {
  const auto a = case_logits_of(c, model), b = case_logits_of(c, variant);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), (row + 1) * c.n_vocab);
  const size_t V = c.n_vocab;
  double early = 0, late = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double& d = i / V < row ? early : late;
    d = std::max(d, std::fabs(double(a[i]) - b[i]));
  }
  EXPECT_EQ(early, 0.0);
  EXPECT_GT(late, 1e-3);
}

// The rope frequency factors act (rope_freqs.weight: Llama 4 Scout's, at the test size):
// hidden from the loader, the first row (position 0: no rotation) stays bit for bit the same and
// the later ones change.
inline void check_rope_freqs_act(const Case& c) {
  TempDir d;
  const std::string model = synth_case(c, d), without = d / "without.gguf";
  ASSERT_TRUE(write_without_key(model, "rope_freqs.weight", without));
  check_rows_change_from(c, model, without, 1);
}

// The keys a model cannot run without: its file with each key hidden is refused, the error
// naming the key.
inline void check_missing_keys_are_named(const Case& c, std::initializer_list<const char*> keys) {
  TempDir d;
  const std::string model = synth_case(c, d);
  for (const char* key : keys) {
    SCOPED_TRACE(key);
    const std::string out = d / "broken.gguf";
    ASSERT_TRUE(write_without_key(model, key, out));
    auto g = gguf::Model::open(out);
    ASSERT_TRUE(g) << g.error().message;
    auto m = engine::Model::load(*g);
    ASSERT_FALSE(m);
    EXPECT_NE(m.error().message.find(key), std::string::npos) << m.error().message;
  }
}

// Batched evaluation (Engine::eval of several sequences).

// A schedule of steps: in each, some sequences feed some tokens (a prefill, a decode token).
struct BatchFeed {
  int seq;  // which of the test's sequences
  size_t n;
};
using BatchStep = std::vector<BatchFeed>;

// Sequence s's tokens: a window of the case's tokens (so every sequence is different).
inline std::vector<int32_t> seq_tokens(const Case& c, int s, size_t len) {
  std::vector<int32_t> t;
  for (size_t i = 0; i < len; ++i) t.push_back(c.all[(i * (s + 1) + s * 3) % c.all.size()]);
  return t;
}

// The schedule: A and B prefill together (different lengths), decode together; C joins with its
// prefill beside their decode steps; A ends and D takes its slot; all decode to the end.
inline const std::vector<BatchStep> kBatchSchedule = {
    {{0, 7}, {1, 3}},         {{0, 1}, {1, 1}},         {{0, 1}, {1, 1}, {2, 5}},
    {{0, 1}, {1, 1}, {2, 1}}, {{1, 1}, {2, 1}, {3, 4}}, {{3, 1}, {1, 1}, {2, 1}},
    {{2, 1}, {3, 1}}};
inline constexpr int kBatchSeqs = 4;
inline int batch_slot(int seq) {
  return seq == 3 ? 0 : seq;  // D reuses A's slot
}

// Sequences fed by a schedule through engines from `make(n_seq)` (64 positions each): batched,
// each gets the logits it gets alone, bit for bit.
inline void check_batched_equals_alone(
    const engine::Model& m, const Case& c,
    const std::function<std::unique_ptr<engine::Engine>(int n_seq)>& make) {
  std::map<int, std::vector<int32_t>> toks;
  std::map<int, size_t> total;
  for (const BatchStep& st : kBatchSchedule)
    for (const BatchFeed& f : st) total[f.seq] += f.n;
  for (auto& [s, n] : total) toks[s] = seq_tokens(c, s, n);

  // Alone: each sequence by itself, in the same chunks, on a one-sequence engine.
  std::map<int, std::vector<std::vector<float>>> alone;
  {
    auto eng = make(1);
    ASSERT_TRUE(eng);
    engine::Engine& e = *eng;
    for (int s = 0; s < kBatchSeqs; ++s) {
      e.reset();
      size_t at = 0;
      for (const BatchStep& st : kBatchSchedule)
        for (const BatchFeed& f : st)
          if (f.seq == s) {
            std::vector<float> lg;
            auto r = e.eval({toks[s].data() + at, f.n}, false, lg);
            ASSERT_TRUE(r) << r.error().message;
            alone[s].push_back(lg);
            at += f.n;
          }
    }
  }
  // Batched: the schedule's steps, each one eval of several sequences.
  auto eng = make(3);
  ASSERT_TRUE(eng);
  engine::Engine& e = *eng;
  std::map<int, size_t> at, step_of;
  for (size_t i = 0; i < kBatchSchedule.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    std::vector<engine::SeqTokens> batch;
    for (const BatchFeed& f : kBatchSchedule[i]) {
      if (at[f.seq] == 0) e.reset(batch_slot(f.seq));
      batch.push_back({batch_slot(f.seq), {toks[f.seq].data() + at[f.seq], f.n}});
      at[f.seq] += f.n;
    }
    std::vector<float> lg;
    auto r = e.eval(batch, lg);
    ASSERT_TRUE(r) << r.error().message;
    ASSERT_EQ(lg.size(), batch.size() * size_t(m.hp.n_vocab));
    for (size_t b = 0; b < batch.size(); ++b) {
      const int s = kBatchSchedule[i][b].seq;
      const auto& want = alone[s][step_of[s]++];
      EXPECT_EQ(std::memcmp(want.data(), lg.data() + b * m.hp.n_vocab, want.size() * sizeof(float)),
                0)
          << "sequence " << s << " differs from its run alone";
    }
  }
}

}  // namespace expertd::test
