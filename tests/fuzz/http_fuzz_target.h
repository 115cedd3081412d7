// The HTTP front's fuzz entry: one request's bytes through Server::answer (Beast's parser with
// the server's limits, the key check, routing, each API's JSON validation, the chat template,
// tools, tool choice and grammars) to a Generator that checks what reaches it and answers at once.
// A libFuzzer target with -DEXPERTD_FUZZ=ON (clang); driven by seeded mutations of real clients'
// requests (tests/data/fuzz/http/, tests/fuzz/capture_http_corpus.py) in the test suite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace expertd::fuzz {

int http(const uint8_t* data, size_t size);
// The corpus: real clients' requests (tests/data/fuzz/http/*.http).
std::vector<std::string> http_seeds();
// Requests the backend admitted so far (a driver's sign that mutations reach generation).
size_t http_admitted();

}  // namespace expertd::fuzz
