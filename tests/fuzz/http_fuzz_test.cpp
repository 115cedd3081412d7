// Seeded mutations of real clients' requests through the HTTP fuzz entry, for a bounded time
// (EXPERTD_HTTP_FUZZ_SECONDS, default 15): bytes anywhere (the request line, headers, framing),
// bodies with their Content-Length kept true, and JSON values swapped for hostile ones (wrong
// types, huge or negative numbers, deep nesting, long strings, removed keys). Every answer must
// be one well-formed HTTP response with a JSON error or reply, and what reaches the backend
// must fit the context (the entry aborts otherwise).
#include <chrono>
#include <nlohmann/json.hpp>

#include "fuzz/http_fuzz_target.h"
#include "fuzz/mutate.h"
#include "test_util.h"

using namespace expertd;
using nlohmann::ordered_json;

namespace {

ordered_json hostile_value(std::mt19937_64& rng) {
  switch (rng() % 12) {
    case 0:
      return nullptr;
    case 1:
      return -1;
    case 2:
      return int64_t(1) << 62;
    case 3:
      return 1e308;
    case 4:
      return "";
    case 5:
      return std::string(1 + rng() % 5000, char('a' + rng() % 26));
    case 6:
      return ordered_json::array();
    case 7:
      return ordered_json::object();
    case 8:
      return true;
    case 9: {
      ordered_json deep = 1;
      for (int i = 0, n = int(rng() % 300); i < n; ++i) deep = ordered_json::array({deep});
      return deep;
    }
    case 10:
      return 0.5;
    default:
      return "\xff\xfe invalid UTF-8 \xc3";
  }
}

// A random node of `j` replaced, removed or duplicated.
void mutate_json(ordered_json& j, std::mt19937_64& rng, int depth = 0) {
  if ((!j.is_object() && !j.is_array()) || j.empty() || (depth > 0 && rng() % 3 == 0)) {
    j = hostile_value(rng);
    return;
  }
  const size_t i = rng() % j.size();
  auto it = j.begin();
  std::advance(it, i);
  if (rng() % 6 == 0) {
    if (j.is_object())
      j.erase(it.key());
    else
      j.erase(i);
    return;
  }
  mutate_json(*it, rng, depth + 1);
}

std::string with_body(const std::string& req, const std::string& body) {
  const size_t end = req.find("\r\n\r\n");
  std::string head = req.substr(0, end + 2);
  const size_t cl = head.find("Content-Length: ");
  if (cl != std::string::npos) {
    const size_t eol = head.find("\r\n", cl);
    head.replace(cl, eol - cl, "Content-Length: " + std::to_string(body.size()));
  }
  return head + "\r\n" + body;
}

}  // namespace

TEST(HttpFuzz, SeededRequestMutationsAnswerEveryRequestWell) {
  const auto seeds = fuzz::http_seeds();
  ASSERT_GE(seeds.size(), 10u) << "tests/data/fuzz/http/ holds the corpus";
  double seconds = 15;
  if (const char* s = std::getenv("EXPERTD_HTTP_FUZZ_SECONDS")) seconds = std::atof(s);
  std::mt19937_64 rng(20261202);
  auto feed = [](const std::string& m) {
    fuzz::http(reinterpret_cast<const uint8_t*>(m.data()), m.size());
  };
  for (const auto& s : seeds) feed(s);
  const size_t admitted_seeds = fuzz::http_admitted();
  EXPECT_GE(admitted_seeds, 8u) << "the unmutated client requests reach generation";
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  size_t runs = 0;
  while (std::chrono::steady_clock::now() < until) {
    const std::string& s = seeds[rng() % seeds.size()];
    const size_t end = s.find("\r\n\r\n");
    std::string m;
    switch (rng() % 3) {
      case 0:  // bytes anywhere, stacked a few times
        m = s;
        for (int k = 0, n = 1 + int(rng() % 3); k < n; ++k) m = fuzz::mutate(m, rng);
        break;
      case 1:  // the body's bytes, its length kept true
        m = with_body(s, fuzz::mutate(s.substr(end + 4), rng));
        break;
      default: {  // the body's JSON values
        ordered_json j = ordered_json::parse(s.substr(end + 4), nullptr, false);
        if (j.is_discarded()) {
          m = fuzz::mutate(s, rng);
          break;
        }
        for (int k = 0, n = 1 + int(rng() % 3); k < n; ++k) mutate_json(j, rng);
        m = with_body(s, j.dump(-1, ' ', false, ordered_json::error_handler_t::replace));
      }
    }
    feed(m);
    ++runs;
  }
  std::printf("%zu mutated requests in %.0f s, %zu admitted to generation\n", runs, seconds,
              fuzz::http_admitted() - admitted_seeds);
  EXPECT_GE(runs, 100u);
  EXPECT_GT(fuzz::http_admitted(), admitted_seeds) << "some mutated requests reach generation";
}
