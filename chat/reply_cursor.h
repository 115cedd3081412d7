// The reply parser's cursor and its string helpers, shared by reply.cpp and reply_m3.cpp
// (MiniMax-M3's schema-typed argument values). Internal to chat/.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace expertd::chat::detail {

inline bool has(std::string_view s, std::string_view x) {
  return s.find(x) != std::string_view::npos;
}
inline bool is_ws(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
inline std::string_view trim_end(std::string_view s) {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}
inline std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  return s;
}
inline std::string_view trim(std::string_view s) {
  return ltrim(trim_end(s));
}

// A cursor over the reply: literals matched, text taken up to a literal. `short_` records that
// the text ended before the structure did.
struct Cur {
  std::string_view s;
  size_t p = 0;
  bool short_ = false;
  void ws() {
    while (p < s.size() && is_ws(s[p])) ++p;
  }
  // The literal at the cursor (skipped); at the end of the text, a prefix of it counts as short.
  bool lit(std::string_view l) {
    const std::string_view rest = s.substr(p);
    if (rest.substr(0, l.size()) == l) {
      p += l.size();
      return true;
    }
    if (rest.size() < l.size() && l.substr(0, rest.size()) == rest) short_ = true;
    return false;
  }
  bool at(std::string_view l) const { return s.substr(p, l.size()) == l; }
  // The text up to `l` (the cursor moves past `l`); none: short.
  bool until(std::string_view l, std::string_view& out) {
    const size_t at = s.find(l, p);
    if (at == std::string_view::npos) {
      out = s.substr(p);
      short_ = true;
      return false;
    }
    out = s.substr(p, at - p);
    p = at + l.size();
    return true;
  }
};

enum class Got { Ok, Short, Bad };

// MiniMax-M3's marker namespace: every marker of its calls begins with it.
inline constexpr std::string_view kM3 = "]<]minimax[>[";

// A MiniMax-M3 call's arguments at the cursor, up to and including `close`: typed by the tool's
// schema `params` as llama.cpp reads them where it says how, else (no schema, or the model strayed
// from it) as the template writes values.
Got m3_arguments(Cur& c, const nlohmann::ordered_json* params, const std::string& close,
                 nlohmann::ordered_json& args);

}  // namespace expertd::chat::detail
