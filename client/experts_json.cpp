// Client::experts_json: the daemon's compact ExpertsReply (proto/expertd.fbs) rendered as the one
// JSON document every dashboard reads (expertctl stats --experts --json, expertctl top,
// expert-serve's page). Its keys are documented in docs/expertctl.md.
#include <nlohmann/json.hpp>

#include "client/expert_client.h"
#include "proto/frame.h"

namespace expertd::client {

namespace {

nlohmann::ordered_json render(const wire::ExpertsReply& r) {
  const uint32_t L = r.n_layers(), E = r.n_experts();
  nlohmann::ordered_json j;
  j["t_us"] = r.t_us();
  j["n_layer"] = L;
  j["n_expert"] = E;
  j["tiers"] = r.tiers() ? r.tiers()->str() : "";
  j["policy"] = r.policy() ? r.policy()->str() : "";
  j["slot_count"] = r.slot_count();
  j["slot_bytes"] = r.slot_bytes();
  j["host_slot_count"] = r.host_slot_count();
  auto layers = nlohmann::ordered_json::array();
  for (uint32_t l = 0; l < L; ++l) {
    const size_t at = size_t{l} * E;
    nlohmann::ordered_json layer;
    layer["model_layer"] = r.model_layers() ? r.model_layers()->Get(l) : l;
    layer["resident"] = std::string(reinterpret_cast<const char*>(r.residency()->data()) + at, E);
    layer["hits"] = std::vector<uint64_t>(r.hits()->begin() + at, r.hits()->begin() + at + E);
    layer["misses"] = std::vector<uint64_t>(r.misses()->begin() + at, r.misses()->begin() + at + E);
    layers.push_back(std::move(layer));
  }
  j["layers"] = std::move(layers);
  auto engines = nlohmann::ordered_json::array();
  if (r.engines())
    for (const auto* e : *r.engines())
      engines.push_back({{"name", e->name() ? e->name()->str() : ""},
                         {"pid", e->pid()},
                         {"kind", e->kind() == wire::ClientKind::Monitor ? "monitor" : "engine"},
                         {"acquires", e->acquires()},
                         {"connected_s", double(e->connected_us()) / 1e6},
                         {"draft_steps", e->draft_steps()},
                         {"drafted", e->drafted()},
                         {"accepted", e->accepted()}});
  j["engines"] = std::move(engines);
  j["drive"] = {{"read_bytes", r.read_bytes()},
                {"read_mib_s_measured", nullptr},
                {"busy_s", double(r.read_busy_us()) / 1e6}};
  if (r.read_mib_s() >= 0) j["drive"]["read_mib_s_measured"] = r.read_mib_s();
  auto rows = nlohmann::ordered_json::array();
  if (r.what_if())
    for (const auto* w : *r.what_if()) {
      nlohmann::ordered_json row = {
          {"cache_mib", w->cache_mib()}, {"slots", w->slots()}, {"hit_rate", nullptr}};
      if (w->hit_rate() >= 0) row["hit_rate"] = w->hit_rate();
      rows.push_back(std::move(row));
    }
  j["what_if"] = std::move(rows);
  j["what_if_accesses"] = r.what_if_accesses();
  j["what_if_age_s"] = double(r.what_if_age_us()) / 1e6;
  j["what_if_replay_s"] = double(r.what_if_replay_us()) / 1e6;
  return j;
}

}  // namespace

Result<std::string> Client::experts_json() {
  flatbuffers::FlatBufferBuilder fbb(64);
  const uint64_t rid = next_request_++;
  auto body = round_trip(rid, proto::make_frame(fbb, rid, wire::CreateExpertsRequest(fbb)));
  if (!body) {
    if (body.error().message.find("not accepted") != std::string::npos)
      return make_error(body.error().message +
                        " (this expertd is older than per-expert snapshots: upgrade it)");
    return body.error();
  }
  const auto* r = wire::GetEnvelope(body->data())->msg_as_ExpertsReply();
  if (!r) return make_error("expertd sent an unexpected reply to Experts");
  const size_t keys = size_t{r->n_layers()} * r->n_experts();
  if (!r->residency() || !r->hits() || !r->misses() || r->residency()->size() != keys ||
      r->hits()->size() != keys || r->misses()->size() != keys ||
      (r->model_layers() && r->model_layers()->size() != r->n_layers()))
    return make_error("expertd sent a malformed Experts reply");
  return render(*r).dump();
}

}  // namespace expertd::client
