// What a gateway in front of several expert-serve processes asks each of them (docs/fleet.md),
// in the shapes the gateways read. The sources are the gateways' own:
// - /health: 200 once the engine is up (expertd connected); 503 before, and while draining.
//   The SGLang Model Gateway probes GET <worker>/health and takes any 2xx as healthy, anything
//   else (or no answer) as a failure (sgl-model-gateway/src/core/worker.rs,
//   http_health_check); SGLang's own server answers 503 while starting and while shutting down
//   (python/sglang/srt/entrypoints/http_server.py, /health).
// - /server_info (and SGLang's older /get_server_info): the gateway names a worker's model by
//   served_model_name, else model_path, else "unknown" (sgl-model-gateway/src/core/steps/worker/
//   local/discover_metadata.rs reads them; create_worker.rs picks).
// - /model_info (and /get_model_info): SGLang's {model_path, tokenizer_path, is_generation}
//   (http_server.py, model_info).
// - /get_load: SGLang's array of one entry per data-parallel rank, {dp_rank, num_reqs,
//   num_waiting_reqs, num_tokens}, num_tokens being the tokens held plus those waiting
//   (python/sglang/srt/managers/scheduler_metrics_mixin.py, get_load); the gateway sums
//   num_tokens over the entries as the worker's load (sgl-model-gateway/src/core/
//   worker_manager.rs, get_worker_load). vllm-router's power_of_two reads an object's "load"
//   instead (vllm-project/router src/routers/http/router.rs, get_worker_load): one body cannot
//   be both, and SGLang's is the one answered.
#include "serve/server_impl.h"

namespace expertd::serve {

bool Server::Impl::answer_fleet(const std::string& path,
                                const http::request<http::string_body>& req, Conn& c) {
  if (path.size() < 2 || path[0] != '/') return false;  // "" or "*": not one of these
  std::string name = path.substr(1);
  if (name.starts_with("get_") && name != "get_load") name = name.substr(4);
  if (name != "health" && name != "server_info" && name != "model_info" && name != "get_load")
    return false;
  if (req.method() != http::verb::get) {
    c.send_json(405, error_body(Api::OpenAI, {405, "invalid_request_error", "use GET"}));
    metrics.count_request(name, 405);
    return true;
  }
  int status = 200;
  json j;
  if (name == "health") {
    // Draining first: a worker leaving must read as not ready even while its engine is up.
    if (draining) {
      status = 503, j = {{"status", "draining"}};
    } else if (!sched.healthy()) {
      status = 503, j = {{"status", "unavailable"}, {"error", sched.last_error()}};
    } else {
      j = {{"status", "ok"}};
    }
  } else if (name == "server_info") {
    j = {{"served_model_name", o.model_id},
         {"model_path", o.model_path},
         {"tokenizer_path", o.model_path},
         {"architecture", o.model_arch},
         {"dp_size", 1},
         {"context_length", sched.n_ctx()},
         {"max_running_requests", o.sequences_max},
         {"max_queued_requests", o.queue_max},
         {"max_total_tokens", metrics.kv_positions_max},
         {"draining", draining.load()},
         {"version", EXPERTD_VERSION}};
  } else if (name == "model_info") {
    j = {{"model_path", o.model_path},
         {"tokenizer_path", o.model_path},
         {"served_model_name", o.model_id},
         {"is_generation", true}};
  } else {  // get_load: one rank
    const int64_t running = metrics.active_sequences, waiting = metrics.queue_length;
    j = json::array({{{"dp_rank", 0},
                      {"num_reqs", running + waiting},
                      {"num_waiting_reqs", waiting},
                      {"num_tokens", metrics.kv_positions + metrics.queued_prompt_tokens}}});
  }
  c.send_json(status, dump(j));
  metrics.count_request(name, status);
  return true;
}

}  // namespace expertd::serve
