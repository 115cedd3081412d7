// The lexer: text, {{ }}, {% %} and {# #} with Jinja2's whitespace rules (trim_blocks,
// lstrip_blocks, the - and + markers), names, numbers, strings and operators.
#include "chat/jinja/internal.h"

namespace expertd::jinja {

std::vector<Token> lex(std::string_view in) {
  std::string src;  // newlines normalised, the last one dropped (keep_trailing_newline=False)
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      src += '\n';
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      src += in[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  std::vector<Token> out;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false, line_start = true;
  auto count_lines = [&](size_t a, size_t b) {
    line += int(std::count(src.begin() + a, src.begin() + b, '\n'));
  };
  while (pos <= src.size()) {
    size_t start = pos;
    for (;;) {
      start = src.find('{', start);
      if (start == std::string::npos || start + 1 >= src.size()) {
        start = std::string::npos;
        break;
      }
      const char c = src[start + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++start;
    }
    std::string text =
        src.substr(pos, start == std::string::npos ? std::string::npos : start - pos);
    const int text_line = line;
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_ws(text[k])) ++k;
      text.erase(0, k);
    }
    char kind = 0, mod = 0;
    if (start != std::string::npos) {
      kind = src[start + 1];
      mod = start + 2 < src.size() ? src[start + 2] : 0;
      if (mod == '-') {
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      } else if (mod != '+' && (kind == '%' || kind == '#')) {  // lstrip_blocks
        const size_t l = text.rfind('\n');
        const size_t from = l == std::string::npos ? 0 : l + 1;
        if ((l != std::string::npos || line_start) &&
            text.find_first_not_of(" \t", from) == std::string::npos)
          text.erase(from);
      }
    }
    if (!text.empty()) out.push_back({Tok::Text, text, 0, 0, text_line});
    if (start == std::string::npos) {
      count_lines(pos, src.size());
      break;
    }
    count_lines(pos, start);
    pos = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
    strip_next = false;
    line_start = false;
    if (kind == '#') {
      const size_t e = src.find("#}", pos);
      if (e == std::string::npos) fail("line " + std::to_string(line) + ": unclosed comment");
      count_lines(pos, e);
      strip_next = e > pos && src[e - 1] == '-';
      pos = e + 2;
      if (!strip_next && pos < src.size() && src[pos] == '\n') ++pos, ++line, line_start = true;
      continue;
    }
    out.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", 0, 0, line});
    const char* close = kind == '{' ? "}}" : "%}";
    int depth = 0;
    for (;;) {
      while (pos < src.size() && is_ws(src[pos])) {
        if (src[pos] == '\n') ++line;
        ++pos;
      }
      if (pos >= src.size()) fail("line " + std::to_string(line) + ": unclosed tag");
      const char c = src[pos];
      if (depth == 0) {
        if ((c == '-' || c == '+') && src.compare(pos + 1, 2, close) == 0) {
          strip_next = c == '-';
          pos += 3;
          if (kind == '%' && c != '+' && !strip_next && pos < src.size() && src[pos] == '\n')
            ++pos, ++line, line_start = true;
          break;
        }
        if (src.compare(pos, 2, close) == 0) {
          pos += 2;
          if (kind == '%' && pos < src.size() && src[pos] == '\n') ++pos, ++line, line_start = true;
          break;
        }
      }
      Token t{Tok::Op, "", 0, 0, line};
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src.size() &&
               (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_'))
          ++e;
        t.t = Tok::Name, t.s = src.substr(pos, e - pos), pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        bool is_float = false;
        while (e < src.size() &&
               (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_'))
          ++e;
        if (e + 1 < src.size() && src[e] == '.' &&
            std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
          is_float = true, ++e;
          while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
        }
        if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
          size_t k = e + 1;
          if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
          if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
            is_float = true, e = k;
            while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
          }
        }
        std::string num;
        for (size_t k = pos; k < e; ++k)
          if (src[k] != '_') num += src[k];
        if (is_float)
          t.t = Tok::Float, t.f = std::stod(num);
        else
          t.t = Tok::Int, t.i = std::stoll(num);
        pos = e;
      } else if (c == '\'' || c == '"') {
        std::string s;
        size_t k = pos + 1;
        for (;; ++k) {
          if (k >= src.size()) fail("line " + std::to_string(line) + ": unclosed string");
          if (src[k] == c) break;
          if (src[k] == '\n') ++line;
          if (src[k] != '\\' || k + 1 >= src.size()) {
            s += src[k];
            continue;
          }
          const char e = src[++k];
          switch (e) {
            case 'n':
              s += '\n';
              break;
            case 't':
              s += '\t';
              break;
            case 'r':
              s += '\r';
              break;
            case '\\':
            case '\'':
            case '"':
              s += e;
              break;
            case '\n':
              break;
            case 'u':
            case 'x': {
              const int n = e == 'u' ? 4 : 2;
              put_cp(s, uint32_t(std::stoul(src.substr(k + 1, n), nullptr, 16)));
              k += n;
              break;
            }
            default:
              s += '\\', s += e;
          }
        }
        t.t = Tok::Str, t.s = std::move(s), pos = k + 1;
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                    "/",  "%",  "~",  "<",  ">",  "=",  ".", ",", ":",
                                    "|",  "(",  ")",  "[",  "]",  "{",  "}"};
        bool found = false;
        for (const char* op : ops)
          if (src.compare(pos, std::strlen(op), op) == 0) {
            t.s = op, pos += std::strlen(op), found = true;
            break;
          }
        if (!found)
          fail("line " + std::to_string(line) + ": unexpected character '" + std::string(1, c) +
               "'");
        if (t.s == "(" || t.s == "[" || t.s == "{") ++depth;
        if (t.s == ")" || t.s == "]" || t.s == "}") --depth;
      }
      out.push_back(std::move(t));
    }
    out.push_back({kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", 0, 0, line});
  }
  out.push_back({Tok::End, "", 0, 0, line});
  return out;
}

}  // namespace expertd::jinja
