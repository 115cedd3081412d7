#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace expertd::serve {

using Clock = std::chrono::steady_clock;

namespace {
constexpr size_t kPrefillChunk = 512;  // prompt tokens a joining sequence feeds per step
double secs(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// log-softmax of `row` at `token`, and the `top` most likely tokens.
TokenLogprob logprob_of(std::span<const float> row, int32_t token, int top) {
  float mx = -INFINITY;
  for (float v : row) mx = std::max(mx, v);
  double sum = 0;
  for (float v : row) sum += std::exp(double(v) - mx);
  const float lse = float(mx + std::log(sum));
  TokenLogprob t;
  t.token = token;
  t.logprob = row[size_t(token)] - lse;
  if (top > 0) {
    std::vector<int32_t> ids(row.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    const size_t k = std::min(ids.size(), size_t(top));
    std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(),
                      [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
    for (size_t i = 0; i < k; ++i) t.top.push_back({ids[i], row[size_t(ids[i])] - lse});
  }
  return t;
}
}  // namespace

Request::Update Request::take(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return done_ || !text_.empty() || !logprobs_.empty(); });
  Update u;
  u.text = std::move(text_);
  text_.clear();
  u.done = done_;
  u.finish = finish_;
  u.stop_sequence = stop_sequence_;
  u.error = error_;
  u.completion_tokens = completion_tokens_;
  u.cached_tokens = cached_;
  u.logprobs = std::move(logprobs_);
  u.prompt_logprobs = std::move(prompt_logprobs_);
  logprobs_.clear(), prompt_logprobs_.clear();
  return u;
}

void Request::add_logprobs(std::vector<TokenLogprob> lp, bool prompt) {
  {
    std::lock_guard lk(mu_);
    auto& to = prompt ? prompt_logprobs_ : logprobs_;
    to.insert(to.end(), std::make_move_iterator(lp.begin()), std::make_move_iterator(lp.end()));
  }
  cv_.notify_all();
}

void Request::append(const std::string& text, int completion_tokens) {
  {
    std::lock_guard lk(mu_);
    text_ += text;
    completion_tokens_ = completion_tokens;
  }
  cv_.notify_all();
}

void Request::finish(Finish f, std::string stop_sequence, std::string error) {
  {
    std::lock_guard lk(mu_);
    if (done_) return;
    done_ = true, finish_ = f;
    stop_sequence_ = std::move(stop_sequence), error_ = std::move(error);
  }
  cv_.notify_all();
}

nlohmann::json params_to_json(const GenParams& p) {
  return {{"max_tokens", p.max_tokens},
          {"temperature", p.temperature},
          {"top_p", p.top_p},
          {"top_k", p.top_k},
          {"seed", p.seed},
          {"stop", p.stop},
          {"turn_end", p.turn_end},
          {"grammar", kind_name(p.grammar.kind)},
          {"grammar_text", p.grammar.text},
          {"special_text", p.special_text},
          {"logprobs", p.logprobs},
          {"prompt_logprobs", p.prompt_logprobs},
          {"draft_max", p.draft_max},
          {"draft_source", p.draft_source}};
}

GenParams params_from_json(const nlohmann::json& j) {
  GenParams g;
  g.max_tokens = j.value("max_tokens", 16);
  g.temperature = j.value("temperature", 1.0f);
  g.top_p = j.value("top_p", 1.0f);
  g.top_k = j.value("top_k", 0);
  g.seed = j.value("seed", uint64_t{0});
  g.stop = j.value("stop", std::vector<std::string>{});
  g.turn_end = j.value("turn_end", std::string());
  auto kind = kind_from_name(j.value("grammar", std::string("none")));
  g.grammar.kind = kind ? *kind : GrammarSpec::Kind::None;
  g.grammar.text = j.value("grammar_text", std::string());
  g.special_text = j.value("special_text", false);
  g.logprobs = j.value("logprobs", -1);
  g.prompt_logprobs = j.value("prompt_logprobs", false);
  g.draft_max = j.value("draft_max", -1);
  g.draft_source = j.value("draft_source", std::string());
  return g;
}

nlohmann::json logprobs_to_json(const std::vector<TokenLogprob>& v) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : v) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, lp] : t.top) top.push_back({id, lp});
    out.push_back({t.token, t.logprob, std::move(top)});
  }
  return out;
}

std::vector<TokenLogprob> logprobs_from_json(const nlohmann::json& j) {
  std::vector<TokenLogprob> out;
  if (!j.is_array()) return out;
  for (const auto& e : j) {
    if (!e.is_array() || e.size() != 3) continue;
    TokenLogprob t{e[0].get<int32_t>(), e[1].get<float>(), {}};
    for (const auto& x : e[2]) t.top.push_back({x[0].get<int32_t>(), x[1].get<float>()});
    out.push_back(std::move(t));
  }
  return out;
}

Scheduler::Scheduler(EngineFactory make, const engine::Tokenizer& tok, int parallel, int n_ctx,
                     int queue_max, Metrics& metrics, Grammars& grammars, size_t prefix_cache_bytes,
                     PrefixDisk* prefix_disk)
    : make_(std::move(make)),
      tok_(tok),
      parallel_(parallel),
      queue_max_(queue_max),
      n_ctx_(n_ctx),
      metrics_(metrics),
      grammars_(grammars),
      prefix_bytes_(prefix_cache_bytes),
      disk_(prefix_disk),
      slot_used_(size_t(parallel), false) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  metrics_cv_.notify_all();
  thread_.join();
}

Scheduler::Admit Scheduler::submit(std::shared_ptr<Request> r) {
  {
    std::lock_guard lk(mu_);
    if (!healthy_) return Admit::Unavailable;
    if (int(queue_.size()) >= queue_max_) return Admit::QueueFull;
    queue_.push_back(std::move(r));
    count_queue();
  }
  cv_.notify_all();
  return Admit::Ok;
}

std::string Scheduler::last_error() const {
  std::lock_guard lk(mu_);
  return last_error_;
}

std::vector<proto::Metric> Scheduler::daemon_metrics() {
  std::unique_lock lk(mu_);
  metrics_.engines_ready = healthy_ ? 1 : 0;
  if (!healthy_) return {};
  want_metrics_ = true, metrics_ready_ = false;
  cv_.notify_all();
  metrics_cv_.wait_for(lk, std::chrono::seconds(5), [&] { return metrics_ready_ || stop_; });
  return metrics_snapshot_;
}

void Scheduler::fail_all(const std::string& why) {
  for (Seq& s : active_) s.req->finish(Finish::Error, {}, why);
  active_.clear();
  std::fill(slot_used_.begin(), slot_used_.end(), false);
  count_active();
}

void Scheduler::count_queue() {
  int64_t tokens = 0;
  for (const auto& r : queue_) tokens += int64_t(r->prompt.size());
  metrics_.queue_length = int64_t(queue_.size());
  metrics_.queued_prompt_tokens = tokens;
}

void Scheduler::count_active() {
  int64_t positions = 0;
  if (engine_)
    for (const Seq& s : active_) positions += engine_->n_past(s.slot);
  metrics_.active_sequences = int64_t(active_.size());
  metrics_.kv_positions = positions;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      if (stop_) break;
      if (want_metrics_ && engine_) {
        lk.unlock();
        auto m = engine_->daemon_metrics();
        lk.lock();
        metrics_snapshot_ = std::move(m);
        want_metrics_ = false, metrics_ready_ = true;
        metrics_cv_.notify_all();
      }
    }
    if (!engine_) {  // (re)connect: the daemon may be starting or coming back
      auto e = make_();
      std::unique_lock lk(mu_);
      if (!e) {
        last_error_ = e.error().message;
        healthy_ = false;
        // Requests that queued while the engine was up get the error rather than waiting.
        while (!queue_.empty()) {
          queue_.front()->finish(Finish::Error, {}, last_error_);
          queue_.pop_front();
        }
        count_queue();
        if (want_metrics_) want_metrics_ = false, metrics_ready_ = true, metrics_cv_.notify_all();
        cv_.wait_for(lk, std::chrono::milliseconds(500), [&] { return stop_; });
        continue;
      }
      engine_ = std::move(*e);
      last_error_.clear();
      healthy_ = true;
      if (!announced_) {  // once: what the engine is, and what a position of state costs
        announced_ = true;
        const double per_pos =
            double(engine_->cache_bytes()) / double(uint64_t(parallel_) * uint64_t(n_ctx_));
        std::fprintf(stderr,
                     "expert-serve: engine on %s, %s KV cache %.1f MiB (%.1f KiB per position "
                     "and sequence at this context)\n",
                     engine_->device_name().c_str(), engine::kv_type_name(engine_->kv_type()),
                     double(engine_->cache_bytes()) / (1 << 20), per_pos / 1024);
      }
    }
    {  // admit queued requests into free slots; drop cancelled ones
      std::unique_lock lk(mu_);
      if (active_.empty() && queue_.empty() && !want_metrics_)
        cv_.wait_for(lk, std::chrono::milliseconds(200),
                     [&] { return stop_ || !queue_.empty() || want_metrics_; });
      while (!queue_.empty() && int(active_.size()) < parallel_) {
        auto r = queue_.front();
        queue_.pop_front();
        if (r->cancelled()) {
          r->finish(Finish::Error, {}, "cancelled");
          continue;
        }
        Seq s;
        if (r->params.grammar) {
          auto g = grammars_.compile(r->params.grammar);
          if (!g) {
            r->finish(Finish::Error, {}, "the grammar: " + g.error().message);
            continue;
          }
          s.constraint = std::make_unique<Constraint>(std::move(*g));
        }
        s.req = std::move(r);
        s.slot = int(std::find(slot_used_.begin(), slot_used_.end(), false) - slot_used_.begin());
        slot_used_[s.slot] = true;
        const GenParams& p = s.req->params;
        s.sampler = std::make_unique<engine::Sampler>(
            engine::SamplerParams{p.temperature, p.top_k, p.top_p, p.seed});
        s.last_token = s.req->arrived;  // the first token's latency counts from the arrival
        s.draft_max = p.draft_max >= 0 ? p.draft_max : draft_max_;
        s.draft_kind =
            p.draft_source.empty() ? drafter_.kind : *engine::parse_draft_kind(p.draft_source);
        if (s.draft_kind == engine::DraftKind::Mtp && !engine_->nextn_on()) s.draft_max = 0;
        if (s.draft_max > 0)
          s.history = s.req->prompt, s.draft_len = engine::DraftLength(s.draft_max);
        if (s.draft_max > 0 && engine_->wants_hints())
          s.routing = std::make_unique<engine::RouteHistory>(0, engine_->n_ctx());
        engine_->reset(s.slot);
        resume(s);
        active_.push_back(std::move(s));
      }
      count_queue();
    }
    // Leaving: cancelled sequences free their slots (and the engine their cache) at once.
    std::erase_if(active_, [&](Seq& s) {
      if (!s.req->cancelled()) return false;
      slot_used_[s.slot] = false;
      s.req->finish(Finish::Error, {}, "cancelled");
      return true;
    });
    count_active();
    if (!active_.empty()) step();
  }
  fail_all("expert-serve is shutting down");
  std::lock_guard lk(mu_);
  for (auto& r : queue_) r->finish(Finish::Error, {}, "expert-serve is shutting down");
  queue_.clear();
}

// A joining sequence resumes from the longest cached prefix of its prompt.
void Scheduler::resume(Seq& s) {
  // A prompt whose own log-probabilities are asked for (echo) is computed whole: they come from
  // its rows.
  if (prefix_bytes_ == 0 || s.req->params.prompt_logprobs) return;
  if (!prefix_) {
    prefix_ = std::make_unique<PrefixCache>(prefix_bytes_, engine_->can_cut());
    prefix_->track_events(kv_events_ != nullptr);
  }
  auto hit = prefix_->find(s.req->prompt);
  bool from_disk = false;
  if (disk_) {
    // The SSD tier when it holds a longer prefix than RAM: read, checked, and kept in RAM again.
    int n = 0;
    if (auto e = disk_->find(s.req->prompt, engine_->can_cut(), n); e && n > hit.n) {
      if (auto st = disk_->read(*e)) {
        auto sp = std::make_shared<const engine::SeqState>(std::move(*st));
        put_prefix(e->tokens, *sp);
        hit = {std::move(sp), n};
        from_disk = true;
      }
    }
  }
  if (hit.n == 0) {
    ++metrics_.prefix_misses;
    return;
  }
  if (auto st = engine_->load_state(s.slot, *hit.state, hit.n); !st) {
    ++metrics_.prefix_errors;  // the sequence computes its whole prompt instead
    engine_->reset(s.slot);
    return;
  }
  s.fed = size_t(hit.n), s.saved = size_t(hit.n);
  s.req->set_cached(hit.n);
  ++(from_disk ? metrics_.prefix_disk_hits : metrics_.prefix_hits);
  metrics_.prefix_reused_tokens += uint64_t(hit.n);
}

// Into the RAM tier, its block events published.
void Scheduler::put_prefix(std::span<const int32_t> tokens, engine::SeqState st) {
  prefix_->put(tokens, std::move(st));
  if (KvEvents* k = kv_events_) k->publish(prefix_->take_events());
}

void Scheduler::keep(std::span<const int32_t> tokens, engine::SeqState st, bool to_disk) {
  if (disk_ && to_disk) disk_->write(tokens, st);
  put_prefix(tokens, std::move(st));
  metrics_.prefix_bytes = int64_t(prefix_->bytes());
  metrics_.prefix_entries = int64_t(prefix_->entries());
  metrics_.prefix_evictions = prefix_->evictions();
}

// A prompt's state is kept when its prefill ends; where states cannot be cut, at each chunk's
// end too, so a prompt sharing only part of this one resumes at the nearest checkpoint.
void Scheduler::checkpoint(Seq& s) {
  if (!prefix_ || s.fed == s.saved || s.generated > 0) return;
  const auto& prompt = s.req->prompt;
  if (s.fed != prompt.size() && engine_->can_cut()) return;
  engine::SeqState st;
  if (!engine_->save_state(s.slot, st)) {
    const bool had = prefix_->entries() > 0;
    prefix_.reset();  // this backend cannot copy states: reuse stays off
    if (KvEvents* k = kv_events_; k && had) k->publish({{BlockEvent::Cleared, {}, false, 0, {}}});
    return;
  }
  s.saved = s.fed;
  // Chunk checkpoints stay in RAM; the prompt's end goes to the SSD tier too.
  keep({prompt.data(), s.fed}, std::move(st), s.fed == prompt.size());
}

// A finished sequence's state (its prompt and the reply it evaluated) is kept too: the next
// turn of a conversation sends both back.
void Scheduler::keep_reply(Seq& s) {
  if (!prefix_ || s.evaluated.empty()) return;
  std::vector<int32_t> tokens = s.req->prompt;
  tokens.insert(tokens.end(), s.evaluated.begin(), s.evaluated.end());
  if (engine_->n_past(s.slot) != int(tokens.size())) return;
  engine::SeqState st;
  if (!engine_->save_state(s.slot, st)) return;
  keep(tokens, std::move(st), true);
}

bool Scheduler::emit(Seq& s, bool final) {
  // The client's stop sequences and the family's end of turn written as text (which ends the
  // reply as the end-of-turn token would: not a stop sequence of the client's).
  const std::string& turn_end = s.req->params.turn_end;
  auto each_stop = [&](auto&& fn) {
    for (const std::string& st : s.req->params.stop) fn(st);
    if (!turn_end.empty()) fn(turn_end);
  };
  size_t cut = s.text.size();
  std::string hit;
  // The earliest stop sequence in what has not been sent yet (it may begin in held-back text).
  each_stop([&](const std::string& st) {
    if (st.empty()) return;
    const size_t from = s.sent >= st.size() ? s.sent - st.size() + 1 : 0;
    const size_t at = s.text.find(st, from);
    if (at != std::string::npos && at < cut) cut = at, hit = st;
  });
  if (!hit.empty()) {
    if (cut > s.sent) s.req->append(s.text.substr(s.sent, cut - s.sent), s.generated);
    s.sent = s.text.size();
    if (hit == turn_end)
      s.req->finish(Finish::EndOfText);
    else
      s.req->finish(Finish::StopSequence, hit);
    return true;
  }
  size_t keep = 0;  // the longest tail that may begin a stop sequence
  if (!final)
    each_stop([&](const std::string& st) {
      for (size_t n = std::min(st.size() - (st.empty() ? 0 : 1), s.text.size() - s.sent); n > keep;
           --n)
        if (s.text.compare(s.text.size() - n, n, st, 0, n) == 0) {
          keep = n;
          break;
        }
    });
  const size_t upto = s.text.size() - keep;
  if (upto > s.sent || final) {
    s.req->append(upto > s.sent ? s.text.substr(s.sent, upto - s.sent) : std::string(),
                  s.generated);
    s.sent = std::max(s.sent, upto);
  }
  return false;
}

bool Scheduler::take(Seq& s, int32_t tok, std::span<const float> raw, Clock::time_point now,
                     int n_past) {
  if (s.generated == 0)
    metrics_.ttft_s.observe(secs(now - s.last_token));
  else
    metrics_.token_s.observe(secs(now - s.last_token));
  s.last_token = now;
  if (s.req->params.logprobs >= 0 && !tok_.is_end_of_generation(tok))
    s.req->add_logprobs({logprob_of(raw, tok, s.req->params.logprobs)}, false);
  if (tok_.is_end_of_generation(tok)) {
    s.text += s.utf8.flush();
    emit(s, true);
    s.req->finish(Finish::EndOfText);
    return true;
  }
  ++s.generated;
  ++metrics_.generated_tokens;
  s.text += s.utf8.push(tok_.piece(tok, s.req->params.special_text));
  if (emit(s, false)) return true;
  if (s.generated >= s.req->params.max_tokens || n_past >= engine_->n_ctx()) {
    s.text += s.utf8.flush();
    if (!emit(s, true)) s.req->finish(Finish::Length);
    return true;
  }
  return false;
}

void Scheduler::step() {
  std::vector<engine::SeqTokens> batch;
  std::vector<bool> samples(active_.size());
  std::vector<size_t> first_row(active_.size()), chunk_from(active_.size());
  size_t rows = 0;
  bool all_logits = false;  // a prompt's own log-probabilities are asked for
  expertd::Status marked;   // Engine::mark's (a backend that cannot copy a recurrent state out)
  for (size_t i = 0; i < active_.size(); ++i) {
    Seq& s = active_[i];
    const auto& prompt = s.req->prompt;
    first_row[i] = rows;
    chunk_from[i] = s.fed;
    if (s.fed < prompt.size()) {
      const size_t n = std::min(kPrefillChunk, prompt.size() - s.fed);
      all_logits = all_logits || s.req->params.prompt_logprobs;
      batch.push_back({s.slot, {prompt.data() + s.fed, n}});
      s.fed += n;
      samples[i] = s.fed == prompt.size();
      metrics_.prompt_tokens += n;
      rows += n;
    } else {
      // The pending token, then drafts (prompt lookup's, or the NextN block's: as many as the
      // context and the token budget have room for): one batched eval verifies them.
      s.feed.assign(1, s.next);
      if (s.draft_max > 0) {
        const int room = std::min(engine_->n_ctx() - engine_->n_past(s.slot) - 1,
                                  s.req->params.max_tokens - s.generated - 1);
        const int want = std::min(s.draft_len.next(), room);
        int64_t from = -1;
        std::vector<int32_t> d;
        if (want > 0 && s.draft_kind == engine::DraftKind::Mtp) {
          if (auto st = engine_->draft_nextn(s.slot, s.next, want, d); !st) marked = st;
        } else if (want > 0) {
          d = drafter_.ngram.draft(s.history, want, &from);
        }
        s.feed.insert(s.feed.end(), d.begin(), d.end());
        // Draft hints: the copied positions' routing and the pending token's twin's (without
        // drafts, the twin alone), sent after the eval's first acquire.
        if (s.routing)
          if (const int64_t twin = from >= 1 ? from - 1 : engine::pending_twin(s.history);
              twin >= 0)
            s.routing->hint(*engine_, twin, int(d.size()) + 1);
        all_logits = all_logits || d.size() > 0;
        // A recurrent state is kept before the verify, to go back to the kept drafts.
        if (!d.empty() && marked)
          if (auto m = engine_->mark(s.slot); !m) marked = m;
      }
      batch.push_back({s.slot, s.feed});
      if (prefix_) s.evaluated.push_back(s.next);
      samples[i] = true;
      rows += s.feed.size();
    }
  }
  std::vector<float> logits;
  auto st = marked ? engine_->eval(batch, all_logits, logits) : marked;
  ++metrics_.steps;
  metrics_.batched_rows += rows;
  if (!st) {
    // The daemon went away (or another fault): every open stream gets the error; the engine is
    // made again (reconnecting) before new requests are admitted.
    {
      std::lock_guard lk(mu_);
      last_error_ = st.error().message;
      healthy_ = false;
    }
    fail_all("generation failed: " + st.error().message);
    engine_.reset();
    return;
  }
  // The routers' choices of this step, for the dashboard's heat map (a few hundred increments).
  const auto& routes = engine_->routes();
  for (size_t l = 0; l < routes.size(); ++l)
    for (const engine::Route& r : routes[l])
      for (uint32_t e : r.experts) metrics_.expert_use.count(int(l), e);
  const int V = int(logits.size() / (all_logits ? rows : batch.size()));
  // Each sequence's last row (its next token's distribution).
  auto last_row = [&](size_t i) {
    return all_logits ? first_row[i] + batch[i].tokens.size() - 1 : i;
  };
  if (all_logits)
    for (size_t i = 0; i < active_.size(); ++i) {
      Seq& s = active_[i];
      if (!s.req->params.prompt_logprobs || chunk_from[i] >= s.req->prompt.size()) continue;
      // Row j of this chunk predicts prompt token chunk_from + j + 1.
      std::vector<TokenLogprob> lp;
      const auto& prompt = s.req->prompt;
      for (size_t j = 0; j < batch[i].tokens.size(); ++j) {
        const size_t at = chunk_from[i] + j + 1;
        if (at >= prompt.size()) break;
        lp.push_back(logprob_of({logits.data() + (first_row[i] + j) * size_t(V), size_t(V)},
                                prompt[at], std::max(0, s.req->params.logprobs)));
      }
      s.req->add_logprobs(std::move(lp), true);
    }
  for (size_t i = 0; i < active_.size(); ++i)  // a prompt chunk's routing, for draft hints
    if (Seq& s = active_[i]; s.routing && chunk_from[i] < s.req->prompt.size())
      s.routing->record(*engine_, int(chunk_from[i]), int(first_row[i]),
                        int(batch[i].tokens.size()));
  for (size_t i = 0; i < active_.size(); ++i) checkpoint(active_[i]);
  const auto now = Clock::now();
  std::vector<size_t> done;
  struct Cut {
    size_t seq;
    int n;        // the position the sequence goes back to
    size_t kept;  // its pending token and kept drafts
  };
  std::vector<Cut> cuts;
  for (size_t i = 0; i < active_.size(); ++i) {
    if (!samples[i]) continue;
    Seq& s = active_[i];
    // A decoding sequence's rows: the pending token's, then each draft's; the walk draws from
    // each in turn while the drafts are kept (engine/speculative.h).
    const size_t k = chunk_from[i] >= s.req->prompt.size() ? s.feed.size() - 1 : 0;
    const size_t row0 = last_row(i) - k;
    size_t kept = 0;
    bool finished = false;
    for (size_t j = 0; j <= k && !finished; ++j) {
      std::span<const float> row{logits.data() + (row0 + j) * size_t(V), size_t(V)};
      const std::span<const float> raw = row;
      if (s.constraint) {
        const auto t0 = Clock::now();
        masked_.assign(row.begin(), row.end());
        s.constraint->mask(masked_);
        row = masked_;
        metrics_.grammar_mask_s.observe(secs(Clock::now() - t0));
      }
      const int32_t draft = j < k ? s.feed[j + 1] : -1;
      const int32_t tok = engine::verify_row(*s.sampler, row, draft);
      if (s.constraint && !s.constraint->accept(tok)) {
        s.req->finish(Finish::Error, {}, "the grammar refused a token it had allowed");
        finished = true;
        break;
      }
      if (s.draft_max > 0) s.history.push_back(tok);
      finished = take(s, tok, raw, now, engine_->n_past(s.slot) - int(k - j));
      if (finished) break;
      if (tok != draft) {
        s.next = tok;
        break;
      }
      ++kept;  // in the cache already, as the next step's pending token would have been
      if (prefix_) s.evaluated.push_back(tok);
    }
    if (s.draft_max > 0) s.draft_len.update(int(k), int(kept));
    // A decoding step's routing: the pending token's row and the kept drafts' (a prompt chunk's
    // was kept above), read before any cut (below) replaces the eval's routing.
    if (s.routing && !finished && chunk_from[i] >= s.req->prompt.size())
      s.routing->record(*engine_, engine_->n_past(s.slot) - int(k) - 1, int(first_row[i]),
                        int(kept) + 1);
    if (k > 0) {
      cuts.push_back({i, engine_->n_past(s.slot) - int(k - kept), kept + 1});
      ++metrics_.draft_steps;
      metrics_.draft_tokens += k;
      metrics_.draft_accepted += kept;
      engine_->report_drafts(1, k, kept);  // expertctl stats: the daemon sums them
    }
    if (finished) done.push_back(i);
  }
  // The rejected drafts leave the caches (and the drafts after a finish), once every sequence's
  // rows have been read: a recurrent state's cut evaluates the kept tokens again, which replaces
  // the eval's routing.
  for (const Cut& c : cuts) {
    Seq& s = active_[c.seq];
    if (auto st = engine_->cut(s.slot, c.n, std::span<const int32_t>(s.feed).first(c.kept)); !st) {
      s.req->finish(Finish::Error, {}, st.error().message);
      if (std::find(done.begin(), done.end(), c.seq) == done.end()) done.push_back(c.seq);
    }
  }
  std::sort(done.begin(), done.end());
  for (auto it = done.rbegin(); it != done.rend(); ++it) {
    keep_reply(active_[*it]);
    slot_used_[active_[*it].slot] = false;
    active_.erase(active_.begin() + long(*it));
  }
  count_active();
}

}  // namespace expertd::serve
