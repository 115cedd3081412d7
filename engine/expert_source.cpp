#include "engine/expert_source.h"

#include <array>
#include <chrono>
#include <thread>

#include "kernels/kernels.h"
#include "pack/builder.h"
#include "proto/pack_format.h"

namespace engine {

using expertd::make_error;

namespace {

// The engine reads roles stored interleaved on the CPU (kernels' rows8 bodies), not on the GPU.
expertd::client::Client::Options engine_options(const std::string& arena_kind) {
  expertd::client::Client::Options o{"expert-run", 120000};
  o.reads_rows8 = arena_kind == "host";
  return o;
}

class LocalSource final : public ExpertSource {
 public:
  explicit LocalSource(const Model& m) : m_(m) {}
  std::string name() const override { return "local"; }
  bool model_owned() const override { return true; }
  expertd::Status for_each_batch(int layer, std::span<const uint32_t> experts,
                                 const BatchFn& fn) override {
    const MoeWeights& w = *m_.moe(layer);
    ++stats_.acquires;
    std::vector<size_t> idx(experts.size());
    std::vector<ExpertWeights> ws;
    for (size_t i = 0; i < experts.size(); ++i) {
      idx[i] = i;
      const uint32_t e = experts[i];
      auto bias = [e](const Tensor& b) {
        return b ? b.row(e) : Tensor{};
      };  // row e of an (n) x n_expert bias
      ws.push_back({w.gate_exps.matrix(e), w.up_exps.matrix(e), w.down_exps.matrix(e),
                    bias(w.gate_exps_b), bias(w.up_exps_b), bias(w.down_exps_b)});
    }
    stats_.experts += experts.size();
    stats_.ready_at_once += experts.size();
    fn(idx, ws);
    return {};
  }

 private:
  const Model& m_;
};

class DaemonSource final : public ExpertSource {
 public:
  DaemonSource(const Model& m, std::unique_ptr<expertd::client::Client> c,
               std::unique_ptr<SlotMemory> slots, DaemonOptions o)
      : m_(m), c_(std::move(c)), slots_(std::move(slots)), o_(std::move(o)) {
    bind();
  }
  std::string name() const override { return "daemon"; }

  // A daemon that goes away mid-layer (a restart, a crash): with reconnection on, the layer's
  // experts not yet handed to the backend are fetched again from the daemon that comes back
  // (same manifest identity, checked), so the eval goes on with the same numbers.
  expertd::Status for_each_batch(int layer, std::span<const uint32_t> experts,
                                 const BatchFn& fn) override {
    std::vector<bool> delivered(experts.size(), false);
    for (;;) {
      auto st = fetch(layer, experts, fn, delivered);
      if (st || !c_->broken() || o_.reconnect_ms == 0) return st;
      EXPERTD_TRY(reconnect(st.error()));
    }
  }

  std::vector<expertd::proto::Metric> daemon_metrics() override {
    auto m = c_->stats();
    return m ? std::move(*m) : std::vector<expertd::proto::Metric>{};
  }

  // A daemon older than DraftReport answers each with an error: the first one seen ends the
  // reports on this connection (a new one, after a restart, tries again).
  void report_drafts(uint64_t steps, uint64_t drafted, uint64_t accepted) override {
    if (const auto err = c_->take_async_error();
        err && err->find("not accepted") != std::string::npos)
      drafts_refused_ = true;
    if (!c_->broken() && !drafts_refused_) (void)c_->report_drafts(steps, drafted, accepted);
  }

  bool wants_hints() const override { return true; }
  // Hints go out after the next acquire, so the daemon reads this layer's demand misses before
  // a later layer's guesses (sent at once, they would queue ahead of them).
  void prefetch(int layer, std::span<const uint32_t> experts) override {
    if (pack_layer_[layer] >= 0)
      hints_.push_back(
          {static_cast<uint32_t>(pack_layer_[layer]), {experts.begin(), experts.end()}});
  }

 private:
  void bind() {
    const auto& info = c_->info();
    pack_layer_.assign(m_.hp.n_blocks(), -1);
    for (int il = 0; il < m_.hp.n_blocks(); ++il)
      pack_layer_[il] = info.pack_layer_of(static_cast<uint32_t>(il));
    // Role layouts resolved once (check_daemon checked they exist), not per expert.
    roles_.clear();
    for (const auto& l : info.layers)
      roles_.push_back({l.find("gate"), l.find("up"), l.find("down"), l.find("gate_bias"),
                        l.find("up_bias"), l.find("down_bias")});
  }

  expertd::Status reconnect(const expertd::Error& why) {
    (void)slots_->finish();  // the backend reads nothing of the old arena any more
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.reconnect_ms);
    std::string last = why.message;
    while (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      auto c = expertd::client::Client::connect(o_.socket, engine_options(o_.arena_kind));
      if (!c) {
        last = c.error().message;
        continue;  // not back yet
      }
      EXPERTD_TRY(check_daemon(m_, **c, o_.arena_kind));  // another model: an error at once
      EXPERTD_TRY(slots_->reopen((*c)->info()));
      c_ = std::move(*c);
      drafts_refused_ = false;
      bind();
      ++stats_.reconnects;
      return {};
    }
    return make_error("expertd at " + o_.socket + " went away (" + why.message +
                      ") and was not back within " + std::to_string(o_.reconnect_ms) +
                      " ms (last: " + last + ")");
  }

  Tensor role(const expertd::client::Lease& l, size_t i, const expertd::client::RoleView* r) {
    Tensor t;
    if (!r) return t;  // an optional role (bias) this pack does not have
    t.type = r->ggml_type;
    t.ne = {static_cast<int64_t>(r->ne0), static_cast<int64_t>(r->ne1), 1};
    t.data = slots_->slot(l, i) + r->offset;
    t.on_device = slots_->on_device();
    t.rows8 = r->layout == "rows8";
    return t;
  }

  // The experts not yet delivered, in one acquire: the daemon grants them in waves of its pin
  // budget, what is resident first, and reads every miss of the layer at once. Hits are computed
  // while the misses load; used experts are handed back (done) when the next wave needs room.
  expertd::Status fetch(int layer, std::span<const uint32_t> experts, const BatchFn& fn,
                        std::vector<bool>& delivered) {
    int pl = pack_layer_[layer];
    if (pl < 0)
      return make_error("expertd's pack has no experts for model layer " + std::to_string(layer));
    const auto& r = roles_[pl];
    std::vector<size_t> todo;
    std::vector<uint32_t> ids;
    for (size_t i = 0; i < experts.size(); ++i)
      if (!delivered[i]) todo.push_back(i), ids.push_back(experts[i]);
    if (todo.empty()) return {};
    auto lease = c_->acquire(static_cast<uint32_t>(pl), ids);
    if (!lease) return lease.error();
    ++stats_.acquires;
    stats_.board_acquires += lease->from_board;
    for (const auto& [hl, hid] : hints_) (void)c_->prefetch(hl, hid);
    hints_.clear();
    // Every way out finishes the backend's reads of the slots before the release.
    auto fail = [&](expertd::Error e) {
      (void)slots_->finish();
      (void)c_->release(*lease);
      return e;
    };
    std::vector<size_t> idx, used;  // used: delivered, not yet handed back
    std::vector<ExpertWeights> ws;
    auto add = [&](size_t i) -> expertd::Status {
      EXPERTD_TRY(slots_->ready(lease->slots[i]));
      idx.push_back(todo[i]);
      used.push_back(i);
      ws.push_back({role(*lease, i, r[0]), role(*lease, i, r[1]), role(*lease, i, r[2]),
                    role(*lease, i, r[3]), role(*lease, i, r[4]), role(*lease, i, r[5])});
      return {};
    };
    auto deliver = [&] {
      fn(idx, ws);
      for (size_t k : idx) delivered[k] = true;
    };
    // Hits first, in one batch, while the misses are still being read.
    for (size_t i = 0; i < ids.size(); ++i)
      if (lease->ready[i]) {
        if (auto st = add(i); !st) return fail(st.error());
        ++stats_.ready_at_once;
      }
    if (!idx.empty()) deliver();
    const size_t budget = std::max<size_t>(1, c_->info().max_experts_per_request);
    for (;;) {
      // A later wave waits for room: hand back what was used once half the budget is (or when
      // nothing granted is still loading), so the daemon grants the next while we compute.
      bool ungranted = false, loading = false;
      for (size_t i = 0; i < ids.size(); ++i) {
        ungranted |= !lease->granted(i);
        loading |= lease->granted(i) && !lease->ready[i] && lease->errors[i].empty();
      }
      if (ungranted && !used.empty() && (!loading || used.size() * 2 >= budget)) {
        EXPERTD_TRY(slots_->finish());
        if (auto st = c_->done(*lease, used); !st) return fail(st.error());
        used.clear();
        ++stats_.dones;
      }
      auto next = c_->ready_batch(*lease);
      if (!next) return fail(next.error());
      if (next->empty()) break;
      idx.clear(), ws.clear();
      for (size_t i : *next) {
        if (!lease->errors[i].empty())
          return fail(make_error("expert " + std::to_string(ids[i]) + " of layer " +
                                 std::to_string(layer) + ": " + lease->errors[i]));
        if (auto st = add(i); !st) return fail(st.error());
      }
      deliver();
    }
    stats_.experts += ids.size();
    EXPERTD_TRY(slots_->finish());
    return c_->release(*lease);
  }

  const Model& m_;
  std::unique_ptr<expertd::client::Client> c_;
  bool drafts_refused_ = false;  // this connection's daemon refused a DraftReport (older)
  std::unique_ptr<SlotMemory> slots_;
  DaemonOptions o_;
  std::vector<int> pack_layer_;
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> hints_;  // (pack layer, experts) to send
  // gate, up, down and their biases (null when absent) per pack layer
  std::vector<std::array<const expertd::client::RoleView*, 6>> roles_;
};

}  // namespace

std::unique_ptr<ExpertSource> make_local_source(const Model& m) {
  return std::make_unique<LocalSource>(m);
}

expertd::Result<std::unique_ptr<ExpertSource>> make_daemon_source(const Model& m,
                                                                  const std::string& socket,
                                                                  int reconnect_ms) {
  auto c = connect_daemon(m, socket, "host");
  if (!c) return c.error();
  return make_daemon_source(m, std::move(*c), std::make_unique<SlotMemory>(),
                            {socket, "host", reconnect_ms});
}

std::unique_ptr<ExpertSource> make_daemon_source(const Model& m,
                                                 std::unique_ptr<expertd::client::Client> c,
                                                 std::unique_ptr<SlotMemory> slots,
                                                 DaemonOptions o) {
  return std::make_unique<DaemonSource>(m, std::move(c), std::move(slots), std::move(o));
}

expertd::Result<std::unique_ptr<expertd::client::Client>> connect_daemon(
    const Model& m, const std::string& socket, const std::string& arena_kind) {
  auto c = expertd::client::Client::connect(socket, engine_options(arena_kind));
  if (!c) return c.error();
  EXPERTD_TRY(check_daemon(m, **c, arena_kind));
  return std::move(*c);
}

expertd::Status check_daemon(const Model& m, const expertd::client::Client& c,
                             const std::string& arena_kind) {
  const auto& info = c.info();
  if (info.arena_kind != arena_kind)
    return make_error("expertd serves a " + info.arena_kind + " arena; this engine needs a " +
                      arena_kind + " one (" +
                      (arena_kind == "host"
                           ? "expert-run --device cuda, or expertd --backend host)"
                           : "expertd --backend cuda, or expert-run --device cpu)"));
  std::string served = expertd::pack::hex64(info.model_id);
  std::string mine = m.pack_model_id.empty()
                         ? expertd::pack::hex64(expertd::pack::source_identity(*m.file))
                         : m.pack_model_id;
  if (mine != served)
    return make_error("expertd serves model " + served + " but " + m.file->path() + " is model " +
                      mine + " (pack it with expert-pack build and serve that pack)");
  if (static_cast<int>(info.n_experts) != m.hp.n_expert)
    return make_error("expertd serves " + std::to_string(info.n_experts) +
                      " experts per layer, the model has " + std::to_string(m.hp.n_expert));
  for (int il = 0; il < m.hp.n_blocks(); ++il) {
    const MoeWeights* moe = m.moe(il);
    if (!moe) continue;
    const uint64_t E = static_cast<uint64_t>(moe->n_embd ? moe->n_embd : m.hp.n_embd);
    int pl = info.pack_layer_of(static_cast<uint32_t>(il));
    if (pl < 0)
      return make_error("expertd's pack lacks MoE layer " + std::to_string(il) +
                        (il >= m.hp.n_layer ? " (the NextN block: packs from expert-pack before "
                                              "NextN drafting leave it out; build the pack again)"
                                            : ""));
    for (const char* r : {"gate", "up", "down"}) {
      const auto* role = info.layers[pl].find(r);
      if (!role)
        return make_error(std::string("expertd's pack lacks the ") + r + " projection of layer " +
                          std::to_string(il));
      bool shape_ok = std::string(r) == "down"
                          ? role->ne0 == static_cast<uint64_t>(m.hp.n_ff_exp) && role->ne1 == E
                          : role->ne0 == E && role->ne1 == static_cast<uint64_t>(m.hp.n_ff_exp);
      if (!shape_ok)
        return make_error(std::string("expertd's ") + r + " projection of layer " +
                          std::to_string(il) + " has another shape than the model's");
      if (role->layout == "rows8" &&
          (arena_kind != "host" || !kernels::rows8_supported(role->ggml_type) || role->ne1 % 8 ||
           role->ne0 % 256 ||
           role->bytes !=
               kernels::rows8_bytes(role->ggml_type, int64_t(role->ne1), int64_t(role->ne0))))
        return make_error(std::string("expertd's ") + r + " projection of layer " +
                          std::to_string(il) + " stores interleaved rows this engine cannot read" +
                          (arena_kind != "host" ? " on the GPU (build the pack with --layout rows)"
                                                : " (a corrupt manifest?)"));
      if (role->layout != "rows" && role->layout != "rows8")
        return make_error(std::string("expertd's ") + r + " projection of layer " +
                          std::to_string(il) + " has an unknown layout \"" + role->layout + "\"");
      if (!kernels::weight_type_supported(role->ggml_type))
        return make_error(
            std::string("expertd's ") + r + " projection of layer " + std::to_string(il) +
            " has type " +
            (kernels::type_traits(role->ggml_type) ? kernels::type_traits(role->ggml_type)->name
                                                   : "?") +
            ", which the engine does not support (" + kernels::supported_type_names() + ")");
    }
    if (moe->expert_biases)  // gpt-oss experts carry biases
      for (const char* r : {"gate_bias", "up_bias", "down_bias"}) {
        const auto* role = info.layers[pl].find(r);
        if (!role || role->ggml_type != kernels::F32)
          return make_error(std::string("expertd's pack lacks the F32 ") + r + " of layer " +
                            std::to_string(il));
      }
  }
  return {};
}

}  // namespace engine
