// expert-run: the bundled engine. Generates text, writes logits, benchmarks, tokenizes.
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "chat/model_chat.h"
#include "engine/draft_hints.h"
#include "engine/engine.h"
#include "engine/factory.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/state_file.h"
#include "engine/tokenizer.h"
#include "kernels/kernels.h"

using namespace engine;

namespace {

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "expert-run: error: %s\n", m.c_str());
  std::exit(1);
}

struct Common {
  std::string model, socket;
  bool local = false;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int ctx = 4096;
  bool prefetch = false;
  bool interleave = true;
  std::string device = "cpu";
  std::string kv_type_name = "f32";
  KvType kv_type() const { return kv_type_name == "f16" ? KvType::F16 : KvType::F32; }
  bool reconnect = false;  // the subcommand's default (generate: on) unless given
  int reconnect_s = 30;
  std::vector<CLI::Option*> reconnect_opts;
  int reconnect_ms() const { return reconnect ? reconnect_s * 1000 : 0; }
  bool nextn = false;  // load the NextN block (generate --speculative mtp)
};

void add_common(CLI::App* c, Common& o) {
  c->add_option("--model", o.model,
                "model GGUF, or the core GGUF of an expert pack (default: the bundled model)");
  c->add_option("--socket", o.socket, "expertd socket: experts come from the daemon");
  c->add_flag("--local", o.local, "read experts in place from the GGUF (the reference path)");
  c->add_option("--threads", o.threads, "CPU threads")->capture_default_str();
  c->add_option("--ctx", o.ctx, "context length (KV cache)")->capture_default_str();
  c->add_flag("--prefetch", o.prefetch,
              "hint the next layer's likely experts to expertd before they are needed (bench also "
              "reports how well the routers one and two layers ahead predicted each layer's)");
  c->add_flag("--interleave,!--no-interleave", o.interleave,
              "CPU: decode reads interleaved copies (eight rows side by side) of the " +
                  kernels::rows8_type_names() +
                  " matrices of the core and, with --local where they fit "
                  "in half the "
                  "available memory, of the "
                  "experts; the same logits, the copies' memory added (default: on)");
  c->add_option("--device", o.device,
                "cpu, or cuda: weights, KV cache and MoE kernels on the GPU, experts from a cuda "
                "expertd's VRAM slots (or uploaded whole with --local)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  c->add_option("--kv-type", o.kv_type_name,
                "the KV cache's type: f32, or f16 (half the bytes per position, as llama.cpp's "
                "default; logits within the F16 rounding)")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
  o.reconnect_opts.push_back(c->add_flag(
      "--reconnect,!--no-reconnect", o.reconnect,
      "when expertd goes away mid-run (a restart, a crash), wait for it to come back serving the "
      "same model and go on with the same numbers (default: on for generate, off otherwise)"));
  c->add_option("--reconnect-s", o.reconnect_s, "how long --reconnect waits for expertd")
      ->capture_default_str();
}

struct Loaded {
  std::string path;  // the model file (the bundled model's when no --model was given)
  std::unique_ptr<gguf::Model> file;
  std::unique_ptr<Model> model;
};

// The bundled model (model/kjv-moe-q8_0.gguf): installed copy first, then the source tree's.
std::string default_model() {
  for (const char* p : {EXPERTD_INSTALLED_MODEL, EXPERTD_SOURCE_MODEL})
    if (FILE* f = std::fopen(p, "rb")) {
      std::fclose(f);
      return p;
    }
  die(std::string("no --model given and the bundled model is not at ") + EXPERTD_INSTALLED_MODEL +
      " or " + EXPERTD_SOURCE_MODEL);
}

// Maps the model's pages in up front (as llama.cpp's mmap with MAP_POPULATE does), so the first
// prompt is not charged with a page fault per 4 KiB of weights; skipped for files larger than half
// the RAM (a core GGUF is small; a whole giant model read --local would only thrash).
void prefault(const gguf::Model& f) {
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
  uint64_t total = 0;
  for (const auto& s : f.shards()) total += s.size;
  const uint64_t ram = uint64_t(::sysconf(_SC_PHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGESIZE));
  if (total > ram / 2) return;
  for (const auto& s : f.shards())
    if (s.map && s.size)
      (void)::madvise(const_cast<uint8_t*>(s.map), s.size, MADV_POPULATE_READ);  // best effort
}

Loaded load(Common o) {
  if (o.model.empty()) o.model = default_model();
  Loaded l;
  l.path = o.model;
  auto f = gguf::Model::open(o.model);
  if (!f) die(f.error().message);
  l.file = std::make_unique<gguf::Model>(std::move(*f));
  prefault(*l.file);
  auto m = Model::load(*l.file, o.nextn);
  if (!m) die(m.error().message);
  l.model = std::make_unique<Model>(std::move(*m));
  if (o.local && !o.socket.empty()) die("--local and --socket exclude each other");
  if (o.socket.empty() && !l.model->has_local_experts)
    die(o.model + " is a core GGUF without experts: pass --socket of the expertd serving its pack");
  return l;
}

std::unique_ptr<Forward> forward(Loaded& l, const Common& o, int n_ctx) {
  EngineSpec spec;
  spec.device = o.device, spec.socket = o.socket, spec.threads = o.threads, spec.n_ctx = n_ctx;
  spec.kv = o.kv_type(), spec.reconnect_ms = o.reconnect_ms(), spec.interleave = o.interleave;
  auto e = make_engine(*l.model, spec);
  if (!e) die(e.error().message);
  return std::move(*e);
}

double cache_mib(const Forward& f) {
  return double(f.cache_bytes()) / (1 << 20);
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    try {
      out.push_back(std::stoi(x));
    } catch (...) {
      die("bad token id '" + x + "'");
    }
  }
  return out;
}

int cmd_logits(const Common& o, const std::string& tokens_csv, const std::string& out,
               int decode_from) {
  Loaded l = load(o);
  auto ids = parse_ids(tokens_csv);
  if (ids.empty()) die("--tokens is empty");
  auto eng = forward(l, o, std::max<int>(o.ctx, static_cast<int>(ids.size())));
  eng->set_prefetch(o.prefetch);
  std::vector<float> all, step;
  size_t first = decode_from > 0 ? std::min<size_t>(decode_from, ids.size()) : ids.size();
  if (auto st = eng->eval({ids.data(), first}, true, all); !st) die(st.error().message);
  for (size_t i = first; i < ids.size(); ++i) {
    if (auto st = eng->eval({ids.data() + i, 1}, true, step); !st) die(st.error().message);
    all.insert(all.end(), step.begin(), step.end());
  }
  std::ofstream f(out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
  if (!f) die("cannot write " + out);
  std::fprintf(stderr, "wrote %zu x %d logits to %s\n", ids.size(), l.model->hp.n_vocab,
               out.c_str());
  return 0;
}

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

double metric(const std::vector<expertd::proto::Metric>& ms, const std::string& name) {
  for (const auto& m : ms)
    if (m.name == name) return m.value;
  return 0;
}

engine::Tokenizer load_tokenizer(const gguf::Model& f) {
  auto t = engine::Tokenizer::load(f);
  if (!t) die(t.error().message);
  return std::move(*t);
}

std::string read_text(const std::string& text, const std::string& file) {
  if (file.empty()) return text;
  std::ifstream f(file, std::ios::binary);
  if (!f) die("cannot read " + file);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Prints the daemon's counters that changed during the run.
void print_daemon_delta(const std::vector<expertd::proto::Metric>& before,
                        const std::vector<expertd::proto::Metric>& after, int tokens,
                        bool label = true) {
  if (after.empty()) return;
  double h = metric(after, "cache_hits") - metric(before, "cache_hits");
  double m = metric(after, "cache_misses") - metric(before, "cache_misses");
  double b = metric(after, "pack_read_bytes") - metric(before, "pack_read_bytes");
  std::fprintf(stderr,
               "%s%.0f hits, %.0f misses (hit rate %.3f), %.1f MiB read, %.2f misses/token, "
               "%.2f MiB/token, "
               "%.0f evictions, io_errors %.0f\n",
               label ? "expertd: " : "", h, m, h + m > 0 ? h / (h + m) : 0.0, b / 1048576.0,
               tokens ? m / tokens : 0.0, tokens ? b / 1048576.0 / tokens : 0.0,
               metric(after, "cache_evictions") - metric(before, "cache_evictions"),
               metric(after, "io_errors"));
}

struct GenOptions {
  std::string prompt, prompt_file;
  int n = 128;
  bool chat = false, verbose = false;
  std::string chat_template;  // a file, instead of the model's
  std::string prompt_cache;   // resume the prompt's longest cached prefix; save its state
  engine::SamplerParams sp;
  engine::DraftKind draft = engine::DraftKind::None;  // --speculative
  int draft_max = 8;
  bool draft_hints = true;  // --draft-hints: the drafts' routing hinted to expertd
};

// --prompt-cache: the prefix of `ids` the file holds, loaded into sequence 0 (its length).
size_t resume_prompt(engine::Forward& eng, const std::string& path, uint64_t model_id,
                     const std::vector<int32_t>& ids) {
  if (!std::filesystem::exists(path)) return 0;
  auto f = engine::load_state_file(path, model_id);
  if (!f) die(f.error().message);
  size_t n = 0;
  const size_t upto = std::min(f->tokens.size(), ids.size() - 1);  // the last is evaluated
  while (n < upto && f->tokens[n] == ids[n]) ++n;
  if (!eng.can_cut() && n != f->tokens.size()) return 0;  // a recurrent state resumes only whole
  if (n == 0) return 0;
  if (auto st = eng.load_state(0, f->state, int(n)); !st)
    die("--prompt-cache: " + st.error().message);
  return n;
}

// One user turn as the model's chat template (its tokenizer.chat_template, or the file given)
// renders it: the generation prompt added, thinking off (enable_thinking and thinking false).
// bos: whether encoding it adds BOS (not when the template wrote the BOS text itself).
struct ChatPrompt {
  std::string text;
  bool bos;
};
ChatPrompt chat_prompt(const gguf::Model& f, const engine::Tokenizer& tok, const std::string& user,
                       const std::string& template_file) {
  auto c = expertd::chat::ModelChat::load(f, tok, template_file);
  if (!c) die(c.error().message);
  if (!c->tmpl)
    die("--chat: this model has no chat template (tokenizer.chat_template); give one with "
        "--chat-template FILE");
  expertd::chat::ChatOptions co;
  co.extra = {{"enable_thinking", false}, {"thinking", false}};
  auto r = c->render(nlohmann::ordered_json::array({{{"role", "user"}, {"content", user}}}), co);
  if (!r) die(r.error().message);
  return {*r, c->needs_bos(tok, *r)};
}

int cmd_generate(const Common& o, GenOptions g) {
  Loaded l = load(o);
  engine::Tokenizer tok = load_tokenizer(*l.file);
  std::string prompt = read_text(g.prompt, g.prompt_file);
  bool bos = tok.add_bos();
  if (g.chat) {
    auto c = chat_prompt(*l.file, tok, prompt, g.chat_template);
    prompt = std::move(c.text), bos = c.bos;
  }
  auto ids = tok.encode(prompt, bos, true);
  if (ids.empty()) die("the prompt is empty");
  auto eng = forward(l, o, std::min<int>(o.ctx, static_cast<int>(ids.size()) + g.n));
  if (::isatty(2))  // on a terminal (scripts read the text alone)
    std::fprintf(stderr,
                 "%s: attention cache %.1f MiB for %d positions, %.1f MiB of interleaved weights\n",
                 l.model->hp.arch.c_str(), cache_mib(*eng), eng->n_ctx(),
                 double(eng->weight_copy_bytes()) / (1 << 20));
  eng->set_prefetch(o.prefetch);
  engine::Sampler sampler(g.sp);
  auto before = eng->daemon_metrics();
  std::vector<float> logits;
  uint64_t model_id = 0;
  size_t resumed = 0;
  if (!g.prompt_cache.empty()) {
    auto id = engine::model_identity(l.path, o.kv_type(), o.nextn);
    if (!id) die(id.error().message);
    model_id = *id;
    resumed = resume_prompt(*eng, g.prompt_cache, model_id, ids);
  }
  auto t0 = Clock::now();
  if (auto st = eng->eval(std::span<const int32_t>(ids).subspan(resumed), false, logits); !st)
    die(st.error().message);
  double prefill_s = secs(t0);
  // --draft-hints: each position's routing, hinted when drafts copy it.
  const bool hints = g.draft != engine::DraftKind::None && g.draft_hints && eng->wants_hints();
  engine::RouteHistory routing(l.model->hp.n_blocks(), eng->n_ctx());
  engine::DraftHintStats hinted;
  if (hints) routing.record(*eng, int(resumed), 0, int(ids.size() - resumed));
  if (!g.prompt_cache.empty()) {
    engine::SeqState state;
    if (auto st = eng->save_state(0, state); !st) die("--prompt-cache: " + st.error().message);
    if (auto st = engine::save_state_file(g.prompt_cache, model_id, ids, state); !st)
      die(st.error().message);
    std::fprintf(stderr, "expert-run: prompt cache %s: %zu of %zu prompt tokens resumed\n",
                 g.prompt_cache.c_str(), resumed, ids.size());
  }
  engine::Utf8Stream out;
  const auto after_prompt = g.verbose ? eng->daemon_metrics() : decltype(before){};
  auto t1 = Clock::now();
  int generated = 0;
  // Each step draws one or more tokens (speculative: the kept drafts and one more); the last is
  // the pending one, evaluated by the next step.
  std::vector<int32_t> history = ids, fresh{sampler.sample(logits)};
  engine::Drafter drafter{g.draft};
  if (g.draft == engine::DraftKind::Mtp)
    if (auto st = eng->set_nextn(true); !st) die(st.error().message);
  engine::DraftStats drafts;
  engine::DraftStep step;
  const int draft_max = g.draft == engine::DraftKind::None ? 0 : g.draft_max;
  engine::DraftLength draft_len(draft_max);
  for (bool done = false; !done;) {
    for (int32_t next : fresh) {
      if (tok.is_end_of_generation(next) || generated == g.n) {
        done = true;
        break;
      }
      std::fputs(out.push(tok.piece(next)).c_str(), stdout);
      ++generated;
    }
    std::fflush(stdout);
    if (done || generated == g.n) break;
    history.insert(history.end(), fresh.begin(), fresh.end());
    if (eng->n_past() >= eng->n_ctx()) {
      std::fputs(out.flush().c_str(), stdout);
      std::fprintf(stderr,
                   "\nexpert-run: the context of %d tokens is full; stopping (raise --ctx)\n",
                   eng->n_ctx());
      break;
    }
    // The pending token's twin (the matched occurrence's last token) and the copied drafts.
    // Without drafts, the twin of the pending token alone.
    auto before_verify = [&](const engine::DraftStep& d) {
      const int64_t twin =
          d.from >= 1 && !d.drafts.empty() ? d.from - 1 : engine::pending_twin(history);
      if (twin < 0) return;
      ++hinted.steps;
      hinted.experts += routing.hint(*eng, twin, int(d.drafts.size()) + 1);
    };
    auto st = engine::speculative_step(*eng, 0, history, drafter, draft_len, sampler, drafts, step,
                                       hints ? engine::BeforeVerify(before_verify) : nullptr);
    if (st && !step.drafts.empty())  // expertctl stats: the daemon sums them
      eng->report_drafts(1, step.drafts.size(), uint64_t(step.accepted));
    if (st && hints) {
      const int kept = step.accepted + 1;  // the pending token and the kept drafts
      routing.record(*eng, eng->n_past() - kept, 0, kept);
    }
    if (!st) {
      std::fputs(out.flush().c_str(), stdout);
      std::fputc('\n', stdout);
      die(st.error().message);
    }
    fresh = step.emitted;
  }
  std::fputs(out.flush().c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (uint64_t n = eng->source_stats().reconnects)
    std::fprintf(stderr, "expertd went away and came back %llu time(s); the generation went on\n",
                 static_cast<unsigned long long>(n));
  if (g.verbose) {
    double decode_s = secs(t1);
    std::fprintf(
        stderr,
        "prompt %zu tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.1f tok/s); "
        "experts from %s, kernels %s, %d threads\n",
        ids.size(), prefill_s, ids.size() / prefill_s, generated, decode_s,
        generated / std::max(decode_s, 1e-9), eng->experts_name().c_str(),
        eng->device_name().c_str(), o.threads);
    if (draft_max > 0)
      std::fprintf(stderr,
                   "speculative %s: %llu evals for %d tokens (%.2f per eval); %llu drafted, %llu "
                   "accepted (%.1f%%)\n",
                   engine::draft_kind_name(g.draft), static_cast<unsigned long long>(drafts.steps),
                   generated, drafts.tokens_per_step(),
                   static_cast<unsigned long long>(drafts.drafted),
                   static_cast<unsigned long long>(drafts.accepted), 100.0 * drafts.acceptance());
    if (hints)
      std::fprintf(stderr, "draft hints: %llu experts hinted before %llu verify evals\n",
                   static_cast<unsigned long long>(hinted.experts),
                   static_cast<unsigned long long>(hinted.steps));
    const auto now = eng->daemon_metrics();
    print_daemon_delta(before, now, static_cast<int>(ids.size()) + generated);
    if (!now.empty()) {
      std::fprintf(stderr, "expertd, generated tokens only: ");
      print_daemon_delta(after_prompt, now, generated, /*label=*/false);
    }
  }
  return 0;
}

int cmd_bench(const Common& o, int n_prompt, int n_gen, bool json) {
  Loaded l = load(o);
  auto eng = forward(l, o, std::min<int>(o.ctx, n_prompt + n_gen + 1));
  eng->set_prefetch(o.prefetch, /*two_ahead=*/true);  // scored in the report
  std::mt19937 rng(1234);
  std::vector<int32_t> prompt(n_prompt);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % l.model->hp.n_vocab);
  std::vector<float> logits;
  if (o.socket.empty()) {
    // Untimed: one pass of the prompt sizes the work buffers, as llama.cpp reserves its compute
    // buffers when its context is created. Not through a daemon: it would warm the cache.
    if (auto st = eng->eval(prompt, false, logits); !st) die(st.error().message);
    eng->reset();
  }
  auto m0 = eng->daemon_metrics();
  auto t0 = Clock::now();
  if (auto st = eng->eval(prompt, false, logits); !st) die(st.error().message);
  double pp = secs(t0);
  auto m1 = eng->daemon_metrics();
  eng->reset_prediction_stats();  // decode's
  auto t1 = Clock::now();
  // Decode feeds fresh random tokens, one per step: a fixed workload any engine can replay, with
  // the routing diversity of real text (greedy decoding of a synthetic model may repeat one
  // token and always hit the cache).
  std::vector<int32_t> stream(n_gen);
  for (auto& t : stream) t = static_cast<int32_t>(rng() % l.model->hp.n_vocab);
  for (int i = 0; i < n_gen; ++i) {
    int32_t next = stream[i];
    if (auto st = eng->eval({&next, 1}, false, logits); !st) die(st.error().message);
  }
  double tg = secs(t1);
  auto m2 = eng->daemon_metrics();
  nlohmann::ordered_json j = {{"model", o.model},
                              {"experts", eng->experts_name()},
                              {"threads", o.threads},
                              {"kernels", eng->device_name()},
                              {"prefill_tokens", n_prompt},
                              {"prefill_tok_s", n_prompt / pp},
                              {"decode_tokens", n_gen},
                              {"decode_tok_s", n_gen / tg},
                              {"prompt", prompt},
                              {"decode_stream", stream},
                              {"attention_cache_mib", cache_mib(*eng)},
                              {"interleaved_mib", double(eng->weight_copy_bytes()) / (1 << 20)}};
  if (!m2.empty()) {
    double h = metric(m2, "cache_hits") - metric(m1, "cache_hits"),
           m = metric(m2, "cache_misses") - metric(m1, "cache_misses");
    double b = metric(m2, "pack_read_bytes") - metric(m1, "pack_read_bytes");
    j["decode_hit_rate"] = h + m > 0 ? h / (h + m) : 0.0;
    j["decode_misses_per_token"] = m / n_gen;
    j["decode_read_bytes_per_token"] = b / n_gen;
    j["prefill_read_bytes"] = metric(m1, "pack_read_bytes") - metric(m0, "pack_read_bytes");
  }
  if (o.prefetch) {  // the next layers' routers applied early: recall and waste per layer
    nlohmann::ordered_json layers = nlohmann::json::array();
    double r1 = 0, r2 = 0;
    int n1 = 0, n2 = 0;
    for (int il = 0; il < l.model->hp.n_layer; ++il) {
      const auto &a = eng->prediction_stats(1)[il], &b = eng->prediction_stats(2)[il];
      if (!a.used && !b.used) continue;
      layers.push_back({{"layer", il},
                        {"recall_1", a.recall()},
                        {"waste_1", a.waste()},
                        {"recall_2", b.recall()},
                        {"waste_2", b.waste()}});
      if (a.used) r1 += a.recall(), ++n1;
      if (b.used) r2 += b.recall(), ++n2;
    }
    j["decode_prediction"] = layers;
    j["decode_recall_1"] = n1 ? r1 / n1 : 0.0;
    j["decode_recall_2"] = n2 ? r2 / n2 : 0.0;
    // Hash-routed layers, apart: their experts are read off the token before the first layer.
    nlohmann::ordered_json hashed = nlohmann::json::array();
    for (int il = 0; il < l.model->hp.n_layer; ++il)
      if (const auto& h = eng->hashed_stats()[il]; h.used)
        hashed.push_back({{"layer", il}, {"recall", h.recall()}, {"waste", h.waste()}});
    if (!hashed.empty()) j["decode_hashed"] = hashed;
  }
  if (json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("prefill %d tokens: %.2f tok/s\ndecode  %d tokens: %.2f tok/s\n", n_prompt,
                n_prompt / pp, n_gen, n_gen / tg);
    std::printf("attention cache: %.1f MiB for %d positions\n", cache_mib(*eng), eng->n_ctx());
    if (eng->weight_copy_bytes() > 0)
      std::printf("interleaved copies of weights: %.1f MiB\n",
                  double(eng->weight_copy_bytes()) / (1 << 20));
    if (j.contains("decode_hit_rate"))
      std::printf("decode through expertd: hit rate %.3f, %.2f misses/token, %.2f MiB read/token\n",
                  j["decode_hit_rate"].get<double>(), j["decode_misses_per_token"].get<double>(),
                  j["decode_read_bytes_per_token"].get<double>() / 1048576.0);
    if (j.contains("decode_prediction")) {
      std::printf("next-layer prediction (decode): mean recall %.3f one layer ahead, %.3f two\n",
                  j["decode_recall_1"].get<double>(), j["decode_recall_2"].get<double>());
      for (const auto& x : j["decode_prediction"])
        std::printf("  layer %2d: recall %.3f waste %.2f | two ahead: recall %.3f waste %.2f\n",
                    x["layer"].get<int>(), x["recall_1"].get<double>(), x["waste_1"].get<double>(),
                    x["recall_2"].get<double>(), x["waste_2"].get<double>());
      if (j.contains("decode_hashed"))
        for (const auto& x : j["decode_hashed"])
          std::printf(
              "  layer %2d: hash-routed, hinted from the token before the first layer: "
              "recall %.3f waste %.2f\n",
              x["layer"].get<int>(), x["recall"].get<double>(), x["waste"].get<double>());
    }
  }
  return 0;
}

// Perplexity over a text: windows of ctx+1 tokens, each evaluated from an empty cache, every
// token after the first of a window scored (the same windows as model/train.py's evaluation).
int cmd_perplexity(const Common& o, const std::string& file, int window, bool json) {
  Loaded l = load(o);
  engine::Tokenizer tok = load_tokenizer(*l.file);
  auto ids = tok.encode(read_text("", file), false, false);
  if (static_cast<int>(ids.size()) < window + 1)
    die(file + " is shorter than one window of " + std::to_string(window + 1) + " tokens");
  auto eng = forward(l, o, window);
  const int V = l.model->hp.n_vocab;
  double nll = 0;
  long scored = 0;
  std::vector<float> logits;
  auto t0 = Clock::now();
  for (size_t s = 0; s + window + 1 <= ids.size(); s += window) {
    eng->reset();
    if (auto st = eng->eval({ids.data() + s, static_cast<size_t>(window)}, true, logits); !st)
      die(st.error().message);
    for (int t = 0; t < window; ++t) {
      const float* row = &logits[size_t(t) * V];
      double mx = *std::max_element(row, row + V), sum = 0;
      for (int v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      nll += std::log(sum) + mx - row[ids[s + t + 1]];
      ++scored;
    }
  }
  double ppl = std::exp(nll / scored);
  if (json)
    std::printf("{\"tokens_scored\":%ld,\"mean_nll\":%.6f,\"perplexity\":%.4f,\"seconds\":%.2f}\n",
                scored, nll / scored, ppl, secs(t0));
  else
    std::printf("%ld tokens scored in windows of %d: mean NLL %.4f, perplexity %.3f (%.1f s)\n",
                scored, window, nll / scored, ppl, secs(t0));
  return 0;
}

int cmd_tokenize(std::string model, const std::string& text, const std::string& file,
                 bool no_parse_special, bool add_bos, bool chat, const std::string& chat_template) {
  if (model.empty()) model = default_model();
  auto f = gguf::Model::open(model);
  if (!f) die(f.error().message);
  engine::Tokenizer tok = load_tokenizer(*f);
  std::string t = read_text(text, file);
  if (chat) t = chat_prompt(*f, tok, t, chat_template).text;
  auto ids = tok.encode(t, add_bos, !no_parse_special);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"expert-run: MoE inference on the CPU with experts from expertd (or the GGUF)"};
  app.require_subcommand(1);
  Common co;
  auto* logits = app.add_subcommand(
      "logits", "write float32 logits of every position, shape [n_tokens, n_vocab]");
  add_common(logits, co);
  std::string tokens, out;
  int decode_from = 0;
  logits->add_option("--tokens", tokens, "comma-separated token ids")->required();
  logits->add_option("--out", out, "output file")->required();
  logits->add_option(
      "--decode-from", decode_from,
      "evaluate the first N tokens as one batch, the rest one at a time (0: all in one batch)");

  auto* gen = app.add_subcommand("generate", "stream generated text to stdout");
  add_common(gen, co);
  GenOptions g;
  gen->add_option("--prompt", g.prompt, "prompt text (special tokens in it are recognised)");
  gen->add_option("--prompt-file", g.prompt_file, "read the prompt from a file");
  gen->add_option("--prompt-cache", g.prompt_cache,
                  "a file holding a prompt's attention state: its longest prefix of this prompt "
                  "is resumed, and this prompt's state saved to it (another model's file is an "
                  "error)");
  gen->add_option("-n,--n-predict", g.n, "tokens to generate")->capture_default_str();
  gen->add_option("--temp", g.sp.temperature, "temperature (0: greedy)")->capture_default_str();
  gen->add_option("--top-k", g.sp.top_k, "keep the k most likely tokens (0: off)")
      ->capture_default_str();
  gen->add_option("--top-p", g.sp.top_p, "nucleus sampling mass (1: off)")->capture_default_str();
  gen->add_option("--seed", g.sp.seed, "random seed")->capture_default_str();
  gen->add_flag("--chat", g.chat,
                "render the prompt as one user turn with the model's chat template "
                "(tokenizer.chat_template), thinking off");
  gen->add_option("--chat-template", g.chat_template,
                  "a Jinja chat template file to use instead of the model's")
      ->check(CLI::ExistingFile);
  gen->add_flag("--verbose", g.verbose,
                "timings, the drafts' acceptance and the daemon's stats delta on stderr");
  std::string speculative = "none";
  gen->add_option("--speculative", speculative,
                  "draft tokens verified in one batched eval (greedy output unchanged): none, "
                  "ngram (prompt lookup: what followed the text's latest repeat), or mtp (the "
                  "model's own NextN block, as llama.cpp's draft-mtp: GLM-4.5/4.6/4.7, "
                  "GLM-5, Qwen3.5, Qwen3-Next, DeepSeek-V3.2, Hy3, Ling 3.0, MiMo-V2, Step 3.5 "
                  "(their three blocks chained: up to 3 drafts) and DeepSeek-V4 files that carry "
                  "it; through "
                  "expertd its pack must hold the "
                  "block's experts)")
      ->check(CLI::IsMember({"none", "ngram", "mtp"}))
      ->capture_default_str();
  gen->add_option("--draft-max", g.draft_max, "most draft tokens per step")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  gen->add_flag("--draft-hints,!--no-draft-hints", g.draft_hints,
                "with --speculative and expertd: before each verify eval, hint every layer's "
                "experts that the drafts' earlier occurrence routed to (without drafts, the "
                "pending token's latest earlier occurrence's), so deep layers' misses are read "
                "while shallow layers compute; the output is unchanged (default: on)");

  auto* bench = app.add_subcommand(
      "bench", "prefill and decode tokens/s; hit rate and bytes read through expertd");
  add_common(bench, co);
  int n_prompt = 128, n_gen = 64;
  bool json = false;
  bench->add_option("-p", n_prompt, "prompt tokens")->capture_default_str();
  bench->add_option("-n", n_gen, "generated tokens")->capture_default_str();
  bench->add_flag("--json", json, "one JSON object");

  auto* tokz =
      app.add_subcommand("tokenize", "print token ids (llama-tokenize --ids --no-bos semantics)");
  std::string tmodel, ttext, tfile;
  bool no_parse_special = false, add_bos = false, tchat = false;
  std::string tchat_template;
  tokz->add_option(
      "--model", tmodel,
      "GGUF with a tokenizer, a vocab-only GGUF is enough (default: the bundled model)");
  auto* text_opt = tokz->add_option("--text", ttext, "text to tokenize (may be empty)");
  auto* file_opt = tokz->add_option("--file", tfile, "file to tokenize");
  tokz->add_flag("--no-parse-special", no_parse_special, "treat special-token text as plain text");
  tokz->add_flag("--add-bos", add_bos, "prepend BOS");
  tokz->add_flag("--chat", tchat, "render the text as generate --chat does (one user turn)");
  tokz->add_option("--chat-template", tchat_template, "as generate's")->check(CLI::ExistingFile);

  auto* ppl = app.add_subcommand("perplexity", "perplexity of a text file");
  add_common(ppl, co);
  std::string ppl_file;
  int window = 128;
  bool ppl_json = false;
  ppl->add_option("--file", ppl_file, "text file")->required();
  ppl->add_option("--window", window, "tokens of context per window")->capture_default_str();
  ppl->add_flag("--json", ppl_json, "one JSON object");

  CLI11_PARSE(app, argc, argv);
  if (ppl->parsed()) return cmd_perplexity(co, ppl_file, window, ppl_json);
  if (logits->parsed()) return cmd_logits(co, tokens, out, decode_from);
  if (gen->parsed()) {
    if (std::none_of(co.reconnect_opts.begin(), co.reconnect_opts.end(),
                     [](CLI::Option* o) { return o->count() > 0; }))
      co.reconnect = true;
    if (g.prompt.empty() && g.prompt_file.empty()) die("generate needs --prompt or --prompt-file");
    g.draft = *engine::parse_draft_kind(speculative);  // checked by the option
    co.nextn = g.draft == engine::DraftKind::Mtp;
    return cmd_generate(co, g);
  }
  if (bench->parsed()) return cmd_bench(co, n_prompt, n_gen, json);
  if (tokz->parsed()) {
    // An empty --text is a text like any other (it tokenizes to nothing, as llama-tokenize's).
    if ((text_opt->count() > 0) == (file_opt->count() > 0))
      die("tokenize needs exactly one of --text and --file");
    return cmd_tokenize(tmodel, ttext, tfile, no_parse_special, add_bos, tchat, tchat_template);
  }
  return 0;
}
