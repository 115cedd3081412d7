#include "serve/http.h"

#include <chrono>
#include <cstdio>
#include <random>

namespace expertd::serve {

using json = nlohmann::json;

std::string random_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char b[32];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(rng()));
  return prefix + b;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// JSON text; bytes of the model's text that are not UTF-8 become U+FFFD rather than an exception.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_body(Api api, const HttpError& e) {
  if (api == Api::Anthropic)
    return dump(json{{"type", "error"}, {"error", {{"type", e.type}, {"message", e.message}}}});
  return dump(
      json{{"error",
            {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}}}});
}

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}
std::string event(const std::string& name, const json& j) {
  return "event: " + name + "\ndata: " + dump(j) + "\n\n";
}

}  // namespace expertd::serve
