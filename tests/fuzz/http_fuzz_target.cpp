#include "fuzz/http_fuzz_target.h"

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/model_chat.h"
#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"
#include "serve/server.h"

namespace expertd::fuzz {
namespace {

namespace http = boost::beast::http;

const std::string kSource = EXPERTD_SOURCE_DIR;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "http fuzz: %s\n", what);
  std::abort();
}

// What reaches generation must be a request the engine can run: a prompt that fits the
// context and a reply that fits what is left of it. Answered at once, with a tool call in the
// template's family (Qwen3's Hermes form) so that the replies' parsing and shaping run too.
struct CheckingGenerator final : serve::Generator {
  static constexpr int kCtx = 512;
  size_t admitted = 0;
  Admit submit(std::shared_ptr<serve::Request> r) override {
    const int n = int(r->prompt.size());
    if (n == 0 || n >= kCtx) broken("a prompt that does not fit the context was admitted");
    if (r->params.max_tokens < 1 || n + r->params.max_tokens > kCtx)
      broken("max_tokens beyond the context was admitted");
    if (!(r->params.temperature >= 0 && r->params.temperature <= 2) ||
        !(r->params.top_p > 0 && r->params.top_p <= 1))
      broken("sampling parameters out of range were admitted");
    r->append(
        "Thinking.</think>Sure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\"}}\n</tool_call>",
        3);
    r->finish(serve::Finish::EndOfText);
    ++admitted;
    return Admit::Ok;
  }
  bool healthy() const override { return true; }
  std::string last_error() const override { return ""; }
  int n_ctx() const override { return kCtx; }
  std::vector<proto::Metric> daemon_metrics() override { return {}; }
};

struct Fixture {
  std::unique_ptr<gguf::Model> file;
  std::unique_ptr<engine::Tokenizer> tok;
  serve::Metrics metrics;
  std::unique_ptr<serve::Grammars> grammars;
  CheckingGenerator generator;
  std::unique_ptr<serve::Server> server;

  Fixture() {
    auto f = gguf::Model::open(kSource + "/model/kjv-moe-q8_0.gguf");
    if (!f) broken("cannot open the bundled model");
    file = std::make_unique<gguf::Model>(std::move(*f));
    auto t = engine::Tokenizer::load(*file);
    if (!t) broken("cannot load the bundled model's tokenizer");
    tok = std::make_unique<engine::Tokenizer>(std::move(*t));
    auto chat =
        chat::ModelChat::load(*file, *tok, kSource + "/tests/data/templates/Qwen-Qwen3-0.6B.jinja");
    if (!chat) broken("cannot load the Qwen3 template");
    grammars = std::make_unique<serve::Grammars>(*tok);
    serve::ServerOptions o;
    o.api_key = "fuzz-key";  // the corpus's
    o.model_id = "m";
    o.max_body = 1 << 20;
    server =
        std::make_unique<serve::Server>(o, generator, *tok, std::move(*chat), metrics, *grammars);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// Each `data: ` line of an event stream holds JSON (or OpenAI's [DONE]).
void check_events(const std::string& body) {
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("data: ")) continue;
    const std::string j = line.substr(6);
    if (j != "[DONE]" && !nlohmann::json::accept(j)) broken("an event that is not JSON");
  }
}

}  // namespace

int http(const uint8_t* data, size_t size) {
  Fixture& f = fixture();
  const std::string out = f.server->answer({reinterpret_cast<const char*>(data), size});
  if (out.empty()) return 0;  // incomplete: a connection would wait for more
  // One well-formed response, whole.
  http::response_parser<http::string_body> p;
  p.eager(true);
  p.body_limit(64 << 20);
  boost::beast::error_code ec;
  size_t used = 0;
  while (!ec && !p.is_done() && used < out.size())
    used += p.put(boost::asio::buffer(out.data() + used, out.size() - used), ec);
  if (ec || !p.is_done() || used != out.size()) broken("the answer is not one HTTP response");
  const auto& res = p.get();
  const int status = res.result_int();
  switch (status) {
    case 200:
    case 400:
    case 401:
    case 404:
    case 405:
    case 413:
    case 503:
      break;
    default:
      broken("an unexpected status");
  }
  const std::string type(res[http::field::content_type]);
  if (type == "application/json") {
    if (!nlohmann::json::accept(res.body())) broken("a JSON answer that is not JSON");
    if (status != 200 && !nlohmann::json::parse(res.body()).contains("error"))
      broken("an error answer without an error");
  } else if (type == "text/event-stream") {
    check_events(res.body());
  } else if (!type.starts_with("text/plain")) {  // /metrics
    broken("an unexpected content type");
  }
  return 0;
}

std::vector<std::string> http_seeds() {
  std::vector<std::string> seeds;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(kSource + "/tests/data/fuzz/http"))
    files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return seeds;
}

size_t http_admitted() {
  return fixture().generator.admitted;
}

}  // namespace expertd::fuzz

#ifdef EXPERTD_FUZZ_TARGET
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return expertd::fuzz::http(data, size);
}
#endif
