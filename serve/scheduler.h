// expert-serve's engine loop: continuous batching. Up to `parallel` sequences run at once, each
// in its own slot of one batched Engine (engine/engine.h): every step evaluates all active
// sequences together — prompt chunks of joining ones beside one token of each decoding one — so
// each MoE layer fetches the union of their experts once. Sequences join from a bounded FIFO
// queue and leave (finished, stopped, cancelled) between steps.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "engine/draft_hints.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/tokenizer.h"
#include "proto/metrics.h"
#include "serve/grammar.h"
#include "serve/kv_events.h"
#include "serve/metrics.h"
#include "serve/prefix_cache.h"
#include "serve/prefix_disk.h"

namespace expertd::serve {

struct GenParams {
  int max_tokens = 16;
  float temperature = 1.0f, top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop sequences (not included in the text)
  GrammarSpec grammar;            // constrained decoding: only tokens it allows are drawn
  bool special_text = false;      // control tokens' text kept (a family's call markers)
  int logprobs = -1;              // >= 0: each drawn token's log-probability and this many others
  bool prompt_logprobs = false;   // and the prompt's tokens' (completions with echo)
  // The family's end of turn written as text (Laguna's </assistant> spelled out): the reply ends
  // there as at the end-of-turn token, not as at a stop sequence of the client's.
  std::string turn_end;
  // Speculative decoding (engine/speculative.h): most drafts per step; 0 off, -1 the server's
  // --speculative/--draft-max. Their source: "ngram" (prompt lookup), "mtp" (the model's NextN
  // block, where the server runs it), or empty: the server's.
  int draft_max = -1;
  std::string draft_source;
};

// A token's log-probability under the model (its raw logits, before temperature or grammar)
// and the most likely alternatives.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};
// The parameters as the worker protocol carries them (one codec for both ends).
nlohmann::json params_to_json(const GenParams& p);
GenParams params_from_json(const nlohmann::json& j);

enum class Finish { None, EndOfText, Length, StopSequence, Error };

// Log-probabilities as the worker protocol carries them: [token, logprob, [[token, logprob]..]].
nlohmann::json logprobs_to_json(const std::vector<TokenLogprob>& v);
std::vector<TokenLogprob> logprobs_from_json(const nlohmann::json& j);

// One generation: the HTTP thread submits it and reads its text as it comes; the engine loop
// appends to it. Thread-safe.
class Request {
 public:
  Request(std::vector<int32_t> prompt, GenParams p)
      : prompt(std::move(prompt)), params(std::move(p)) {}
  const std::vector<int32_t> prompt;
  const GenParams params;
  const std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();

  struct Update {
    std::string text;  // since the last take
    bool done = false;
    Finish finish = Finish::None;
    std::string stop_sequence, error;
    int completion_tokens = 0;
    std::vector<TokenLogprob> logprobs;         // of the tokens drawn since the last take
    std::vector<TokenLogprob> prompt_logprobs;  // once: the prompt's from its second token on
    int cached_tokens = 0;                      // prompt tokens resumed from the prefix cache
  };
  // Waits up to `timeout` for new text or the end; returns what is new.
  Update take(std::chrono::milliseconds timeout);
  // The client went away (or gave up): the engine loop frees the sequence at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // The engine loop's side.
  void append(const std::string& text, int completion_tokens);
  void finish(Finish f, std::string stop_sequence = {}, std::string error = {});
  void add_logprobs(std::vector<TokenLogprob> lp, bool prompt);
  void set_cached(int n) { cached_ = n; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  bool done_ = false;
  Finish finish_ = Finish::None;
  std::string stop_sequence_, error_;
  int completion_tokens_ = 0;
  std::vector<TokenLogprob> logprobs_, prompt_logprobs_;
  std::atomic<int> cached_{0};
  std::atomic<bool> cancelled_{false};
};

// Makes the engine (and its connection to expertd); called again after the daemon went away.
using EngineFactory = std::function<Result<std::unique_ptr<engine::Engine>>()>;

// What the HTTP side hands generations to: the engine loop in this process (Scheduler), or
// engine processes (Workers, serve/workers.h).
class Generator {
 public:
  virtual ~Generator() = default;
  enum class Admit { Ok, QueueFull, Unavailable };
  virtual Admit submit(std::shared_ptr<Request> r) = 0;
  // The engine is up (expertd connected): what /health reports.
  virtual bool healthy() const = 0;
  virtual std::string last_error() const = 0;
  virtual int n_ctx() const = 0;  // of each sequence
  // expertd's counters (empty without a daemon); also brings Metrics' engine counters up to date.
  virtual std::vector<proto::Metric> daemon_metrics() = 0;
};

class Scheduler final : public Generator {
 public:
  // `grammars` compiles the requests' grammars (shared with the HTTP side, which checks them);
  // prefix_cache_bytes: the RAM kept for prompt prefixes' states (0: no reuse).
  // prefix_disk: the prefix cache's SSD tier (none: RAM only).
  Scheduler(EngineFactory make, const engine::Tokenizer& tok, int parallel, int n_ctx,
            int queue_max, Metrics& metrics, Grammars& grammars, size_t prefix_cache_bytes = 0,
            PrefixDisk* prefix_disk = nullptr);
  ~Scheduler() override;

  Admit submit(std::shared_ptr<Request> r) override;
  bool healthy() const override { return healthy_; }
  std::string last_error() const override;
  int n_ctx() const override { return n_ctx_; }
  // Fetched by the engine loop between steps.
  std::vector<proto::Metric> daemon_metrics() override;
  // The prefix cache's block events go here (set before the first request; none: not tracked).
  void set_kv_events(KvEvents* k) { kv_events_ = k; }
  // Speculative decoding's drafts per step for requests that do not say (0: off; before the
  // first request).
  void set_draft_max(int n) { draft_max_ = n; }
  // Their source for requests that do not say (Mtp: the engines run their NextN block).
  void set_draft_source(engine::DraftKind k) { drafter_.kind = k; }

 private:
  struct Seq {
    std::shared_ptr<Request> req;
    int slot = 0;
    size_t fed = 0;     // prompt tokens evaluated
    int32_t next = -1;  // the token to evaluate next (decoding)
    int generated = 0;
    std::string text;  // generated so far
    size_t sent = 0;   // of text, handed to the request
    engine::Utf8Stream utf8;
    std::unique_ptr<engine::Sampler> sampler;
    std::unique_ptr<Constraint> constraint;  // the request's grammar, if any
    size_t saved = 0;                        // prompt positions last saved to the prefix cache
    std::vector<int32_t> evaluated;          // reply tokens evaluated (kept with the prefix)
    int draft_max = 0;                       // speculative decoding: drafts per step (0: off)
    engine::DraftKind draft_kind = engine::DraftKind::Ngram;  // and where they come from
    engine::DraftLength draft_len{0};                         // and how many to ask for now
    std::vector<int32_t> history;  // with drafts: the prompt and the tokens drawn
    std::vector<int32_t> feed;     // this step's rows: the pending token, the drafts
    // With drafts through expertd: each position's routing, hinted before each verify eval
    // where the drafts copy it (engine/draft_hints.h).
    std::unique_ptr<engine::RouteHistory> routing;
    std::chrono::steady_clock::time_point last_token;
  };
  void loop();
  void step();
  void fail_all(const std::string& why);
  // The load's gauges (Metrics): the queue's (mu_ held), the running sequences' (the loop's).
  void count_queue();
  void count_active();
  // After a token: hands out the text that cannot be part of a stop sequence; true if a stop
  // sequence ended the generation.
  bool emit(Seq& s, bool final);
  // A drawn token (from logits row `raw`) handed to the request: its logprobs, its text, the end
  // of generation, stop sequences, the length; true if the sequence is finished. n_past: the
  // positions its row followed (the context is full when they are all of it).
  bool take(Seq& s, int32_t tok, std::span<const float> raw,
            std::chrono::steady_clock::time_point now, int n_past);

  EngineFactory make_;
  const engine::Tokenizer& tok_;
  const int parallel_, queue_max_, n_ctx_;
  Metrics& metrics_;
  Grammars& grammars_;
  std::unique_ptr<engine::Engine> engine_;
  std::vector<float> masked_;  // one row of logits under a grammar
  int draft_max_ = 0;
  engine::Drafter drafter_;
  const size_t prefix_bytes_;
  std::unique_ptr<PrefixCache> prefix_;  // made with the first engine (it knows the caches)
  PrefixDisk* disk_;
  std::atomic<KvEvents*> kv_events_{nullptr};
  void put_prefix(std::span<const int32_t> tokens, engine::SeqState st);
  void keep(std::span<const int32_t> tokens, engine::SeqState st, bool to_disk);
  void resume(Seq& s);
  void checkpoint(Seq& s);
  void keep_reply(Seq& s);
  std::vector<Seq> active_;
  std::vector<bool> slot_used_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  bool stop_ = false, want_metrics_ = false, metrics_ready_ = false;
  std::vector<proto::Metric> metrics_snapshot_;
  std::condition_variable metrics_cv_;
  std::string last_error_;
  std::atomic<bool> healthy_{false};
  bool announced_ = false;  // the engine's one line at its first start
  std::thread thread_;
};

}  // namespace expertd::serve
