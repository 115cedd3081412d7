// The Jinja renderer (chat/jinja.h): a lexer with Jinja2's whitespace rules, a recursive-descent
// parser of Jinja2's grammar into a tree, and an interpreter with Python's value semantics.
#include "chat/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

namespace expertd::jinja {

namespace {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& why) {
  throw Error(why);
}

}  // namespace

// ---- values ------------------------------------------------------------------------------

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
Value* Object::find(std::string_view key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
void Object::set(const std::string& key, Value v) {
  if (Value* p = find(key))
    *p = std::move(v);
  else
    items.emplace_back(key, std::move(v));
}

Value Value::array(std::vector<Value> items, bool tuple) {
  Value v(Kind::Array);
  v.arr_ = std::make_shared<std::vector<Value>>(std::move(items));
  v.tuple_ = tuple;
  return v;
}
Value Value::generator(std::vector<Value> items) {
  Value v = array(std::move(items));
  v.gen_ = true;
  return v;
}
Value Object::key(const std::string& k) const {
  for (const auto& [text, v] : key_values)
    if (text == k) return v;
  return Value(k);
}
Value Value::object(bool is_namespace) {
  Value v(Kind::Object);
  v.obj_ = std::make_shared<Object>();
  v.ns_ = is_namespace;
  return v;
}
Value Value::func(std::string name, Native f) {
  Value v(Kind::Func);
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<Native>(std::move(f));
  return v;
}
bool Value::same(const Value& o) const {
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::Bool:
    case Kind::Int:
      return i_ == o.i_;
    case Kind::Float:
      return f_ == o.f_;
    case Kind::String:
      return s_ == o.s_;
    case Kind::Array:
      return arr_ == o.arr_;
    case Kind::Object:
      return obj_ == o.obj_;
    case Kind::Func:
      return fn_ == o.fn_;
  }
  return false;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& e : j) items.push_back(from_json(e));
      return array(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value o = object();
      for (const auto& [k, e] : j.items()) o.obj().items.emplace_back(k, from_json(e));
      return o;
    }
    default:
      return none();
  }
}

namespace {

using Kind = Value::Kind;
using Kwargs = std::vector<std::pair<std::string, Value>>;

// ---- Python's formatting -------------------------------------------------------------------

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // d.ddde±XX, shortest round trip
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  bool neg = sci[0] == '-';
  for (size_t i = neg; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) return out + "0." + std::string(-exp - 1, '0') + digits;
  if (int(digits.size()) <= exp + 1)
    return out + digits + std::string(exp + 1 - digits.size(), '0') + ".0";
  return out + digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
}

// Decodes one UTF-8 code point at s[i] (advancing i); invalid bytes are taken as themselves.
uint32_t next_cp(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  bool ok = n > 0 && i + n < s.size();
  for (int k = 1; ok && k <= n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
  if (!ok) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0x3f >> n);
  for (int k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += n + 1;
  return cp;
}
void put_cp(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6)), out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3f)),
        out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3f)),
        out += char(0x80 | ((cp >> 6) & 0x3f)), out += char(0x80 | (cp & 0x3f));
  }
}
std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) cps.push_back(next_cp(s, i));
  return cps;
}
std::string from_cps(const std::vector<uint32_t>& cps, size_t a, size_t b) {
  std::string out;
  for (size_t i = a; i < b; ++i) put_cp(out, cps[i]);
  return out;
}

std::string str_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_cp(s, i);
    if (cp == uint32_t(q) || cp == '\\')
      out += '\\', out += char(cp);
    else if (cp == '\n')
      out += "\\n";
    else if (cp == '\r')
      out += "\\r";
    else if (cp == '\t')
      out += "\\t";
    else if (cp < 0x20 || cp == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", cp);
      out += b;
    } else {
      put_cp(out, cp);
    }
  }
  return out + q;
}

std::string repr(const Value& v);
std::string to_str(const Value& v) {  // Python's str()
  switch (v.kind()) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.b() ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.i());
    case Kind::Float:
      return float_repr(v.f());
    case Kind::String:
      return v.s();
    default:
      return repr(v);
  }
}
std::string repr(const Value& v) {
  switch (v.kind()) {
    case Kind::String:
      return str_repr(v.s());
    case Kind::Array: {
      if (v.is_generator()) return "<generator object>";
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.arr().size(); ++i) out += (i ? ", " : "") + repr(v.arr()[i]);
      if (v.is_tuple() && v.arr().size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Kind::Object: {
      if (v.is_namespace()) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.obj().items)
        out += (first ? "" : ", ") + str_repr(k) + ": " + repr(e), first = false;
      return out + "}";
    }
    case Kind::Func:
      return "<function " + v.fn_name() + ">";
    default:
      return to_str(v);
  }
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::Array:
      return v.is_generator() ? "generator" : v.is_tuple() ? "tuple" : "list";
    case Kind::Object:
      return v.is_namespace() ? "Namespace" : "dict";
    case Kind::Func:
      return "function";
  }
  return "?";
}

std::string html_escape(const std::string& s) {  // markupsafe's escape
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}
// A string result that keeps `like`'s mark (Markup's methods return Markup).
Value like(const Value& like, std::string s) {
  return like.is_safe() ? Value::markup(std::move(s)) : Value(std::move(s));
}

void json_str(std::string& out, const std::string& s, bool ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_cp(s, i);
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ascii && cp >= 0x7f)) {
          char b[16];
          if (cp >= 0x10000) {
            const uint32_t c = cp - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", cp);
          }
          out += b;
        } else {
          put_cp(out, cp);
        }
    }
  }
  out += '"';
}

struct JsonOpts {
  bool ascii = false, sort = false;
  int indent = -1;  // < 0: none
  std::string item_sep = ", ", key_sep = ": ";
};
void to_json(std::string& out, const Value& v, const JsonOpts& o, int depth) {
  auto nl = [&](int d) {
    if (o.indent >= 0) out += "\n" + std::string(size_t(o.indent) * d, ' ');
  };
  switch (v.kind()) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.b() ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.i());
      return;
    case Kind::Float:
      out += std::isnan(v.f())   ? "NaN"
             : std::isinf(v.f()) ? (v.f() > 0 ? "Infinity" : "-Infinity")
                                 : float_repr(v.f());
      return;
    case Kind::String:
      json_str(out, v.s(), o.ascii);
      return;
    case Kind::Array: {
      if (v.is_generator()) fail("TypeError: Object of type generator is not JSON serializable");
      if (v.arr().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.arr().size(); ++i) {
        if (i) out += o.item_sep;
        nl(depth + 1);
        to_json(out, v.arr()[i], o, depth + 1);
      }
      nl(depth);
      out += ']';
      return;
    }
    case Kind::Object: {
      if (v.is_namespace()) fail("TypeError: Object of type Namespace is not JSON serializable");
      if (v.obj().items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.obj().items) items.push_back(&kv);
      if (o.sort)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        nl(depth + 1);
        json_str(out, items[i]->first, o.ascii);
        out += o.key_sep;
        to_json(out, items[i]->second, o, depth + 1);
      }
      nl(depth);
      out += '}';
      return;
    }
    default:
      fail("TypeError: Object of type " + type_name(v) + " is not JSON serializable");
  }
}

// ---- lexer ---------------------------------------------------------------------------------

enum class Tok : uint8_t {
  Text,
  VarBegin,
  VarEnd,
  BlockBegin,
  BlockEnd,
  Name,
  Str,
  Int,
  Float,
  Op,
  End
};
struct Token {
  Tok t;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

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

}  // namespace

// ---- syntax tree ---------------------------------------------------------------------------

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum class K : uint8_t {
    Lit,
    Name,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    Neg,
    Pos,
    Not,
    Bin,
    Cmp,
    And,
    Or,
    Cond,
    List,
    Tuple,
    Dict,
    Concat
  };
  K k;
  int line = 0;
  Value lit;
  std::string name;                               // Name, Attr, Filter, Test; Bin: the operator
  std::vector<ExprP> a;                           // operands, arguments
  std::vector<std::string> ops;                   // Cmp
  std::vector<std::pair<std::string, ExprP>> kw;  // keyword arguments
  bool negated = false;                           // Test
};

struct Node {
  enum class K : uint8_t {
    Body,
    Text,
    Out,
    If,
    For,
    Set,
    SetBlock,
    Macro,
    Break,
    Continue,
    FilterBlock
  };
  K k;
  int line = 0;
  std::string text;                  // Text
  ExprP e;                           // Out, For's iterable, Set's value
  std::vector<std::string> targets;  // For, Set (tuple unpacking); Set: "ns.attr" as {ns, attr}
  bool attr_target = false;
  std::vector<std::pair<ExprP, std::unique_ptr<Node>>> branches;  // If (null cond: else)
  std::unique_ptr<Node> body, else_body;                          // For, SetBlock, Macro
  ExprP cond;                                                     // For's filter
  std::vector<std::pair<std::string, ExprP>> params;              // Macro
  ExprP filter;                                                   // FilterBlock: Filter on null
  std::vector<std::unique_ptr<Node>> children;                    // Body
};

namespace {

const std::set<std::string> kFilters = {
    "abs",        "attr",       "batch",    "capitalize", "center",    "count",     "d",
    "default",    "dictsort",   "e",        "escape",     "first",     "float",     "forceescape",
    "format",     "from_json",  "groupby",  "indent",     "int",       "items",     "join",
    "last",       "length",     "list",     "lower",      "map",       "max",       "min",
    "reject",     "rejectattr", "replace",  "reverse",    "round",     "safe",      "select",
    "selectattr", "slice",      "sort",     "string",     "striptags", "sum",       "title",
    "tojson",     "trim",       "truncate", "unique",     "upper",     "urlencode", "wordcount",
    "wordwrap",   "xmlattr"};
const std::set<std::string> kTests = {
    "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto", "escaped",
    "even",    "false",    "filter",   "float",       "ge",       "gt",      "greaterthan",
    "in",      "integer",  "iterable", "le",          "lessthan", "lower",   "lt",
    "mapping", "ne",       "none",     "number",      "odd",      "sameas",  "sequence",
    "string",  "test",     "true",     "undefined",   "upper",    "=="};

class Parser {
 public:
  explicit Parser(std::vector<Token> t) : t_(std::move(t)) {}

  std::unique_ptr<Node> parse_template() {
    auto body = parse_body({});
    if (peek().t != Tok::End) err("unexpected '" + stop_ + "'");
    return body;
  }

 private:
  const Token& peek(int k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  [[noreturn]] void err(const std::string& why) const {
    fail("TemplateSyntaxError: line " + std::to_string(peek().line) + ": " + why);
  }
  bool is_op(const char* op, int k = 0) const { return peek(k).t == Tok::Op && peek(k).s == op; }
  bool is_name(const char* n, int k = 0) const { return peek(k).t == Tok::Name && peek(k).s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) err(std::string("expected '") + op + "'");
    ++p_;
  }
  std::string expect_name() {
    if (peek().t != Tok::Name) err("expected a name");
    return next().s;
  }
  void expect_block_end() {
    if (peek().t != Tok::BlockEnd) err("expected the end of the tag");
    ++p_;
  }

  // Statements until a block tag whose name is in `stops` (left for the caller in stop_).
  std::unique_ptr<Node> parse_body(const std::set<std::string>& stops) {
    auto body = std::make_unique<Node>();
    body->k = Node::K::Body;
    for (;;) {
      const Token& t = peek();
      if (t.t == Tok::End) {
        if (!stops.empty()) {
          std::string end = *stops.begin();
          for (const std::string& s : stops)
            if (s.rfind("end", 0) == 0) end = s;
          err("unexpected end of template: missing '{% " + end + " %}'");
        }
        return body;
      }
      if (t.t == Tok::Text) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::Text, n->text = t.s, n->line = t.line;
        body->children.push_back(std::move(n));
        ++p_;
      } else if (t.t == Tok::VarBegin) {
        ++p_;
        auto n = std::make_unique<Node>();
        n->k = Node::K::Out, n->line = t.line;
        n->e = parse_tuple_expr();
        if (peek().t != Tok::VarEnd) err("expected '}}'");
        ++p_;
        body->children.push_back(std::move(n));
      } else if (t.t == Tok::BlockBegin) {
        const std::string& kw = peek(1).t == Tok::Name ? peek(1).s : std::string();
        if (stops.count(kw)) {
          stop_ = kw;
          p_ += 2;
          return body;
        }
        ++p_;
        body->children.push_back(parse_statement());
      } else {
        err("unexpected token");
      }
    }
  }

  std::unique_ptr<Node> parse_statement() {
    const int line = peek().line;
    const std::string kw = expect_name();
    auto n = std::make_unique<Node>();
    n->line = line;
    if (kw == "if") {
      n->k = Node::K::If;
      ExprP cond = parse_expr();
      expect_block_end();
      for (;;) {
        auto b = parse_body({"elif", "else", "endif"});
        const std::string s = stop_;
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (s == "endif") break;
        if (s == "elif") {
          cond = parse_expr();
          expect_block_end();
          continue;
        }
        expect_block_end();  // else
        n->branches.emplace_back(nullptr, parse_body({"endif"}));
        break;
      }
      expect_block_end();
    } else if (kw == "for") {
      n->k = Node::K::For;
      n->targets.push_back(expect_name());
      while (is_op(",")) ++p_, n->targets.push_back(expect_name());
      if (!is_name("in")) err("expected 'in'");
      ++p_;
      n->e = parse_expr(/*no_cond=*/true);
      if (is_name("if")) ++p_, n->cond = parse_expr(true);
      if (is_name("recursive")) err("recursive loops are not supported");
      expect_block_end();
      n->body = parse_body({"else", "endfor"});
      if (stop_ == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"});
      }
      expect_block_end();
    } else if (kw == "set") {
      n->targets.push_back(expect_name());
      if (is_op(".")) {
        ++p_;
        n->targets.push_back(expect_name());
        n->attr_target = true;
      } else {
        while (is_op(",")) ++p_, n->targets.push_back(expect_name());
      }
      if (peek().t == Tok::BlockEnd) {
        if (n->attr_target || n->targets.size() != 1) err("a block set takes one name");
        ++p_;
        n->k = Node::K::SetBlock;
        n->body = parse_body({"endset"});
        expect_block_end();
      } else {
        n->k = Node::K::Set;
        expect_op("=");
        n->e = parse_tuple_expr();
        expect_block_end();
      }
    } else if (kw == "macro") {
      n->k = Node::K::Macro;
      n->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string pn = expect_name();
        ExprP def;
        if (is_op("=")) ++p_, def = parse_expr();
        n->params.emplace_back(std::move(pn), std::move(def));
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op(")");
      expect_block_end();
      n->body = parse_body({"endmacro"});
      if (peek().t == Tok::Name) ++p_;  // {% endmacro name %}
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      n->k = kw == "break" ? Node::K::Break : Node::K::Continue;
      expect_block_end();
    } else if (kw == "filter") {
      n->k = Node::K::FilterBlock;
      n->filter = parse_filter_call(nullptr);
      expect_block_end();
      n->body = parse_body({"endfilter"});
      expect_block_end();
    } else if (kw == "generation") {  // Hugging Face's assistant-mask tag: its body as is
      expect_block_end();
      auto b = parse_body({"endgeneration"});
      expect_block_end();
      return b;
    } else {
      err("unknown tag '" + kw + "'");
    }
    return n;
  }

  ExprP make(Expr::K k) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = peek().line;
    return e;
  }

  // An expression, or several separated by commas (a tuple), as {{ }} and set accept.
  ExprP parse_tuple_expr() {
    ExprP first = parse_expr();
    if (!is_op(",")) return first;
    auto t = make(Expr::K::Tuple);
    t->a.push_back(std::move(first));
    while (is_op(",")) {
      ++p_;
      if (peek().t == Tok::BlockEnd || peek().t == Tok::VarEnd) break;
      t->a.push_back(parse_expr());
    }
    return t;
  }

  ExprP parse_expr(bool no_cond = false) {
    ExprP e = parse_or();
    if (no_cond) return e;
    while (is_name("if")) {
      ++p_;
      auto c = make(Expr::K::Cond);
      c->a.push_back(parse_or());  // test
      c->a.push_back(std::move(e));
      if (is_name("else")) {
        ++p_;
        c->a.push_back(parse_expr());
      }
      e = std::move(c);
    }
    return e;
  }
  ExprP parse_or() {
    ExprP l = parse_and();
    while (is_name("or")) {
      ++p_;
      auto n = make(Expr::K::Or);
      n->a.push_back(std::move(l));
      n->a.push_back(parse_and());
      l = std::move(n);
    }
    return l;
  }
  ExprP parse_and() {
    ExprP l = parse_not();
    while (is_name("and")) {
      ++p_;
      auto n = make(Expr::K::And);
      n->a.push_back(std::move(l));
      n->a.push_back(parse_not());
      l = std::move(n);
    }
    return l;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      ++p_;
      auto n = make(Expr::K::Not);
      n->a.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP first = parse_math1();
    ExprP c;
    for (;;) {
      std::string op;
      if (peek().t == Tok::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" ||
                                  peek().s == ">" || peek().s == "<=" || peek().s == ">="))
        op = next().s;
      else if (is_name("in"))
        ++p_, op = "in";
      else if (is_name("not") && is_name("in", 1))
        p_ += 2, op = "notin";
      else
        break;
      if (!c) {
        c = make(Expr::K::Cmp);
        c->a.push_back(std::move(first));
      }
      c->ops.push_back(op);
      c->a.push_back(parse_math1());
    }
    return c ? std::move(c) : std::move(first);
  }
  ExprP bin(const std::string& op, ExprP l, ExprP r) {
    auto n = make(Expr::K::Bin);
    n->name = op;
    n->a.push_back(std::move(l));
    n->a.push_back(std::move(r));
    return n;
  }
  ExprP parse_math1() {
    ExprP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().s;
      l = bin(op, std::move(l), parse_concat());
    }
    return l;
  }
  ExprP parse_concat() {
    ExprP l = parse_math2();
    if (!is_op("~")) return l;
    auto n = make(Expr::K::Concat);
    n->a.push_back(std::move(l));
    while (is_op("~")) ++p_, n->a.push_back(parse_math2());
    return n;
  }
  ExprP parse_math2() {
    ExprP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().s;
      l = bin(op, std::move(l), parse_pow());
    }
    return l;
  }
  ExprP parse_pow() {
    ExprP l = parse_unary(true);
    while (is_op("**")) {
      ++p_;
      l = bin("**", std::move(l), parse_unary(true));
    }
    return l;
  }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const bool neg = next().s == "-";
      e = make(neg ? Expr::K::Neg : Expr::K::Pos);
      e->a.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }
  ExprP parse_primary() {
    const Token& t = peek();
    if (t.t == Tok::Name) {
      ++p_;
      if (t.s == "true" || t.s == "True" || t.s == "false" || t.s == "False") {
        auto e = make(Expr::K::Lit);
        e->lit = Value(t.s == "true" || t.s == "True");
        return e;
      }
      if (t.s == "none" || t.s == "None") {
        auto e = make(Expr::K::Lit);
        e->lit = Value::none();
        return e;
      }
      auto e = make(Expr::K::Name);
      e->name = t.s;
      return e;
    }
    if (t.t == Tok::Str) {
      std::string s;
      while (peek().t == Tok::Str) s += next().s;  // adjacent literals concatenate
      auto e = make(Expr::K::Lit);
      e->lit = Value(std::move(s));
      return e;
    }
    if (t.t == Tok::Int || t.t == Tok::Float) {
      ++p_;
      auto e = make(Expr::K::Lit);
      e->lit = t.t == Tok::Int ? Value(t.i) : Value(t.f);
      return e;
    }
    if (is_op("(")) {
      ++p_;
      if (is_op(")")) {
        ++p_;
        return make(Expr::K::Tuple);
      }
      ExprP first = parse_expr();
      if (is_op(")")) {
        ++p_;
        return first;
      }
      auto tup = make(Expr::K::Tuple);
      tup->a.push_back(std::move(first));
      while (is_op(",")) {
        ++p_;
        if (is_op(")")) break;
        tup->a.push_back(parse_expr());
      }
      expect_op(")");
      return tup;
    }
    if (is_op("[")) {
      ++p_;
      auto l = make(Expr::K::List);
      while (!is_op("]")) {
        l->a.push_back(parse_expr());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      ++p_;
      auto d = make(Expr::K::Dict);
      while (!is_op("}")) {
        d->a.push_back(parse_expr());
        expect_op(":");
        d->a.push_back(parse_expr());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("}");
      return d;
    }
    err("unexpected '" + (t.t == Tok::Op ? t.s : std::string("end of tag")) + "'");
  }
  void parse_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().t == Tok::Name && is_op("=", 1)) {
        std::string k = next().s;
        ++p_;
        call.kw.emplace_back(std::move(k), parse_expr());
      } else {
        call.a.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }
  ExprP parse_postfix(ExprP e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto n = make(Expr::K::Attr);
        if (peek().t == Tok::Int)
          n->k = Expr::K::Item, n->a.push_back(std::move(e)),
          n->a.push_back(std::make_unique<Expr>()), n->a[1]->k = Expr::K::Lit,
          n->a[1]->lit = Value(next().i);
        else
          n->name = expect_name(), n->a.push_back(std::move(e));
        e = std::move(n);
      } else if (is_op("[")) {
        ++p_;
        ExprP idx[3];
        bool slice = false;
        int part = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            ++p_, slice = true, ++part;
            if (part > 2) err("a slice takes at most three parts");
            continue;
          }
          idx[part] = parse_expr();
        }
        expect_op("]");
        auto n = make(slice ? Expr::K::Slice : Expr::K::Item);
        n->a.push_back(std::move(e));
        if (slice)
          for (auto& x : idx) n->a.push_back(std::move(x));
        else
          n->a.push_back(std::move(idx[0]));
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(Expr::K::Call);
        n->a.push_back(std::move(e));
        parse_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
  ExprP parse_filter_call(ExprP subject) {
    auto f = make(Expr::K::Filter);
    f->name = expect_name();
    while (is_op(".")) ++p_, f->name += "." + expect_name();
    if (!kFilters.count(f->name)) err("TemplateAssertionError: no filter named '" + f->name + "'");
    f->a.push_back(std::move(subject));
    if (is_op("(")) parse_args(*f);
    return f;
  }
  ExprP parse_filter_expr(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        e = parse_postfix(parse_filter_call(std::move(e)));
      } else if (is_name("is")) {
        ++p_;
        auto t = make(Expr::K::Test);
        if (is_name("not")) ++p_, t->negated = true;
        if (peek().t == Tok::Name)
          t->name = next().s;
        else if (is_op("=="))
          t->name = next().s;
        else
          err("expected a test name");
        if (!kTests.count(t->name)) err("TemplateAssertionError: no test named '" + t->name + "'");
        t->a.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if (peek().t == Tok::Str || peek().t == Tok::Int || peek().t == Tok::Float ||
                   (peek().t == Tok::Name && !is_name("and") && !is_name("or") &&
                    !is_name("else") && !is_name("if") && !is_name("in") && !is_name("is")) ||
                   is_op("[") || is_op("{")) {
          t->a.push_back(parse_primary());  // a test's one argument without parentheses
          t->a.back() = parse_postfix(std::move(t->a.back()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  std::string stop_;
};

}  // namespace

// ---- interpreter -------------------------------------------------------------------------

struct BreakSignal {};
struct ContinueSignal {};

class Interp {
 public:
  Interp(const Value& ctx, const RenderOptions& o) : opts_(o) {
    scopes_.push_back({});
    add_globals();
    if (ctx.is_object())
      for (const auto& [k, v] : ctx.obj().items) scopes_[0][k] = v;
  }

  void exec(const Node& n, std::string& out) {
    switch (n.k) {
      case Node::K::Body:
        for (const auto& c : n.children) exec(*c, out);
        return;
      case Node::K::Text:
        out += n.text;
        return;
      case Node::K::Out:
        out += to_str(eval(*n.e));
        return;
      case Node::K::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond))) {
            exec(*body, out);
            return;
          }
        return;
      case Node::K::For:
        exec_for(n, out);
        return;
      case Node::K::Set: {
        Value v = eval(*n.e);
        if (n.attr_target) {
          Value ns = lookup(n.targets[0]);
          if (!ns.is_namespace())
            fail("TemplateRuntimeError: cannot assign attribute on non-namespace object");
          ns.obj().set(n.targets[1], std::move(v));
        } else if (n.targets.size() == 1) {
          scopes_.back()[n.targets[0]] = std::move(v);
        } else {
          auto items = iterate(v);
          if (items.size() != n.targets.size())
            fail("ValueError: cannot unpack " + std::to_string(items.size()) + " values into " +
                 std::to_string(n.targets.size()));
          for (size_t i = 0; i < items.size(); ++i) scopes_.back()[n.targets[i]] = items[i];
        }
        return;
      }
      case Node::K::SetBlock: {
        std::string s;
        exec(*n.body, s);
        scopes_.back()[n.targets[0]] = Value(std::move(s));
        return;
      }
      case Node::K::Macro:
        scopes_.back()[n.text] = make_macro(n);
        return;
      case Node::K::Break:
        throw BreakSignal{};
      case Node::K::Continue:
        throw ContinueSignal{};
      case Node::K::FilterBlock: {
        std::string s;
        exec(*n.body, s);
        out += to_str(apply_filter(*n.filter, Value(std::move(s))));
        return;
      }
    }
  }

 private:
  using Scope = std::map<std::string, Value>;

  Value lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
      if (it->count("\x01macro")) {  // a macro's scope sees its own names, then the globals
        auto g = scopes_[0].find(name);
        if (g != scopes_[0].end()) return g->second;
        break;
      }
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  static bool truthy(const Value& v) {
    switch (v.kind()) {
      case Kind::Undefined:
      case Kind::None:
        return false;
      case Kind::Bool:
      case Kind::Int:
        return v.i() != 0;
      case Kind::Float:
        return v.f() != 0;
      case Kind::String:
        return !v.s().empty();
      case Kind::Array:
        return v.is_generator() || !v.arr().empty();
      case Kind::Object:
        return v.is_namespace() || !v.obj().items.empty();
      case Kind::Func:
        return true;
    }
    return false;
  }
  [[noreturn]] static void undefined_error(const Value& v) {
    fail("UndefinedError: " + (v.s().empty() ? std::string("value is undefined") : v.s()));
  }
  static std::vector<Value> iterate(const Value& v) {
    switch (v.kind()) {
      case Kind::Undefined:
        return {};
      case Kind::Array: {
        std::vector<Value> items = v.arr();
        if (v.is_generator()) v.arr().clear();  // one pass
        return items;
      }
      case Kind::Object: {
        std::vector<Value> keys;
        for (const auto& kv : v.obj().items) keys.push_back(v.obj().key(kv.first));
        return keys;
      }
      case Kind::String: {
        std::vector<Value> chars;
        auto cps = code_points(v.s());
        for (size_t i = 0; i < cps.size(); ++i) chars.push_back(Value(from_cps(cps, i, i + 1)));
        return chars;
      }
      default:
        fail("TypeError: '" + type_name(v) + "' object is not iterable");
    }
  }

  void exec_for(const Node& n, std::string& out) {
    std::vector<Value> items = iterate(eval(*n.e));
    scopes_.emplace_back();
    auto bind = [&](const Value& item) {
      if (n.targets.size() == 1) {
        scopes_.back()[n.targets[0]] = item;
        return;
      }
      auto parts = iterate(item);
      if (parts.size() != n.targets.size())
        fail("ValueError: cannot unpack " + std::to_string(parts.size()) + " values into " +
             std::to_string(n.targets.size()));
      for (size_t i = 0; i < parts.size(); ++i) scopes_.back()[n.targets[i]] = parts[i];
    };
    if (n.cond) {  // the loop's filter runs before loop.* are known
      std::vector<Value> kept;
      for (const Value& item : items) {
        bind(item);
        if (truthy(eval(*n.cond))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t len = int64_t(items.size());
    Value loop = Value::object();
    for (int64_t i = 0; i < len; ++i) {
      bind(items[i]);
      Object& l = loop.obj();
      l.items.clear();
      l.set("index0", Value(i));
      l.set("index", Value(i + 1));
      l.set("revindex0", Value(len - i - 1));
      l.set("revindex", Value(len - i));
      l.set("first", Value(i == 0));
      l.set("last", Value(i == len - 1));
      l.set("length", Value(len));
      l.set("depth", Value(1));
      l.set("depth0", Value(0));
      l.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
      l.set("nextitem", i + 1 < len ? items[i + 1] : Value::undefined("there is no next item"));
      l.set("cycle", Value::func("loop.cycle", [i](Interp&, std::vector<Value>& a, Kwargs&) {
              if (a.empty()) fail("TypeError: no items for cycling given");
              return a[size_t(i) % a.size()];
            }));
      scopes_.back()["loop"] = loop;
      try {
        exec(*n.body, out);
      } catch (const BreakSignal&) {
        break;
      } catch (const ContinueSignal&) {
        continue;
      }
    }
    scopes_.pop_back();
    if (len == 0 && n.else_body) exec(*n.else_body, out);
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value::func(n.text, [node](Interp& in, std::vector<Value>& args, Kwargs& kwargs) {
      if (args.size() > node->params.size())
        fail("TypeError: macro '" + node->text + "' takes not more than " +
             std::to_string(node->params.size()) + " argument(s)");
      Scope s;
      s["\x01macro"] = Value(true);
      for (size_t i = 0; i < node->params.size(); ++i) {
        const auto& name = node->params[i].first;
        const auto& def = node->params[i].second;
        if (i < args.size()) {
          s[name] = args[i];
        } else {
          auto kw = std::find_if(kwargs.begin(), kwargs.end(),
                                 [&](const auto& p) { return p.first == name; });
          if (kw != kwargs.end())
            s[name] = kw->second;
          else if (def)
            s[name] = in.eval(*def);
          else
            s[name] = Value::undefined("'" + name + "' is undefined");
        }
      }
      for (const auto& [k, v] : kwargs) {
        bool known = false;
        for (const auto& p : node->params) known |= p.first == k;
        if (!known)
          fail("TypeError: macro '" + node->text + "' takes no keyword argument '" + k + "'");
      }
      in.scopes_.push_back(std::move(s));
      std::string out;
      try {
        in.exec(*node->body, out);
      } catch (...) {
        in.scopes_.pop_back();
        throw;
      }
      in.scopes_.pop_back();
      return Value(std::move(out));
    });
  }

  void add_globals() {
    Scope& g = scopes_[0];
    g["range"] = Value::func("range", [](Interp&, std::vector<Value>& a, Kwargs&) {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& v : a)
        if (v.kind() != Kind::Int && v.kind() != Kind::Bool)
          fail("TypeError: '" + type_name(v) + "' object cannot be interpreted as an integer");
      if (a.size() == 1)
        stop = a[0].i();
      else if (a.size() >= 2)
        start = a[0].i(), stop = a[1].i(), step = a.size() > 2 ? a[2].i() : 1;
      else
        fail("TypeError: range expected at least 1 argument, got 0");
      if (step == 0) fail("ValueError: range() arg 3 must not be zero");
      std::vector<Value> out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(Value(i));
        if (out.size() > 100000) fail("OverflowError: range too big");
      }
      return Value::array(std::move(out));
    });
    g["namespace"] = Value::func("namespace", [](Interp&, std::vector<Value>& a, Kwargs& kw) {
      Value ns = Value::object(/*is_namespace=*/true);
      for (const Value& d : a)
        if (d.is_object())
          for (const auto& [k, v] : d.obj().items) ns.obj().set(k, v);
      for (const auto& [k, v] : kw) ns.obj().set(k, v);
      return ns;
    });
    g["dict"] = Value::func("dict", [](Interp&, std::vector<Value>& a, Kwargs& kw) {
      Value d = Value::object();
      for (const Value& x : a)
        if (x.is_object())
          for (const auto& [k, v] : x.obj().items) d.obj().set(k, v);
      for (const auto& [k, v] : kw) d.obj().set(k, v);
      return d;
    });
    g["raise_exception"] =
        Value::func("raise_exception", [](Interp&, std::vector<Value>& a, Kwargs&) -> Value {
          fail("TemplateError: " + (a.empty() ? std::string() : to_str(a[0])));
        });
    g["strftime_now"] = Value::func("strftime_now", [](Interp& in, std::vector<Value>& a, Kwargs&) {
      std::tm tm{};
      if (in.opts_.now) {  // a fixed clock (tests): its UTC time
        gmtime_r(&in.opts_.now, &tm);
      } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      char buf[256];
      const std::string fmt = a.empty() ? std::string() : to_str(a[0]);
      const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value(std::string(buf, n));
    });
  }

  // ---- expressions ----

 public:
  Value eval(const Expr& e) {
    switch (e.k) {
      case Expr::K::Lit:
        return e.lit;
      case Expr::K::Name:
        return lookup(e.name);
      case Expr::K::Attr:
        return get_attr(eval(*e.a[0]), e.name);
      case Expr::K::Item:
        return get_item(eval(*e.a[0]), eval(*e.a[1]));
      case Expr::K::Slice: {
        Value v = eval(*e.a[0]);
        Value idx[3];
        for (int k = 0; k < 3; ++k) idx[k] = e.a[k + 1] ? eval(*e.a[k + 1]) : Value::none();
        return slice(v, idx[0], idx[1], idx[2]);
      }
      case Expr::K::Call: {
        Value f = eval(*e.a[0]);
        std::vector<Value> args;
        for (size_t i = 1; i < e.a.size(); ++i) args.push_back(eval(*e.a[i]));
        Kwargs kw;
        for (const auto& [k, x] : e.kw) kw.emplace_back(k, eval(*x));
        if (f.is_undefined()) undefined_error(f);
        if (f.kind() != Kind::Func)
          fail("TypeError: '" + type_name(f) + "' object is not callable");
        return f.fn()(*this, args, kw);
      }
      case Expr::K::Filter:
        return apply_filter(e, eval(*e.a[0]));
      case Expr::K::Test: {
        const bool r = apply_test(e);
        return Value(e.negated ? !r : r);
      }
      case Expr::K::Neg:
      case Expr::K::Pos: {
        Value v = eval(*e.a[0]);
        if (v.is_undefined()) undefined_error(v);
        if (!v.is_number()) fail("TypeError: bad operand type for unary -: '" + type_name(v) + "'");
        if (e.k == Expr::K::Pos) return v.kind() == Kind::Bool ? Value(v.i()) : v;
        return v.kind() == Kind::Float ? Value(-v.f()) : Value(-v.i());
      }
      case Expr::K::Not:
        return Value(!truthy(eval(*e.a[0])));
      case Expr::K::And: {
        Value l = eval(*e.a[0]);
        return truthy(l) ? eval(*e.a[1]) : l;
      }
      case Expr::K::Or: {
        Value l = eval(*e.a[0]);
        return truthy(l) ? l : eval(*e.a[1]);
      }
      case Expr::K::Cond:
        if (truthy(eval(*e.a[0]))) return eval(*e.a[1]);
        return e.a.size() > 2
                   ? eval(*e.a[2])
                   : Value::undefined("the inline if's condition is false and it has no else");
      case Expr::K::Bin:
        return binary(e.name, eval(*e.a[0]), eval(*e.a[1]));
      case Expr::K::Cmp: {
        Value l = eval(*e.a[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value r = eval(*e.a[i + 1]);
          if (!compare(e.ops[i], l, r)) return Value(false);
          l = std::move(r);
        }
        return Value(true);
      }
      case Expr::K::List:
      case Expr::K::Tuple: {
        std::vector<Value> items;
        for (const auto& x : e.a) items.push_back(eval(*x));
        return Value::array(std::move(items), e.k == Expr::K::Tuple);
      }
      case Expr::K::Dict: {
        Value d = Value::object();
        for (size_t i = 0; i + 1 < e.a.size(); i += 2) {
          Value k = eval(*e.a[i]);
          const std::string text = to_str(k);
          if (!k.is_string()) d.obj().key_values.emplace_back(text, k);
          d.obj().set(text, eval(*e.a[i + 1]));
        }
        return d;
      }
      case Expr::K::Concat: {
        std::string s;
        for (const auto& x : e.a) s += to_str(eval(*x));
        return Value(std::move(s));
      }
    }
    return Value();
  }

 private:
  static bool equals(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
      if (a.kind() == Kind::Float || b.kind() == Kind::Float) return a.f() == b.f();
      return a.i() == b.i();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
      case Kind::Undefined:
      case Kind::None:
        return true;
      case Kind::String:
        return a.s() == b.s();
      case Kind::Array: {
        if (a.is_tuple() != b.is_tuple() || a.arr().size() != b.arr().size()) return false;
        for (size_t i = 0; i < a.arr().size(); ++i)
          if (!equals(a.arr()[i], b.arr()[i])) return false;
        return true;
      }
      case Kind::Object: {
        if (a.is_namespace() || b.is_namespace()) return a.same(b);
        if (a.obj().items.size() != b.obj().items.size()) return false;
        for (const auto& [k, v] : a.obj().items) {
          const Value* o = b.obj().find(k);
          if (!o || !equals(v, *o)) return false;
        }
        return true;
      }
      default:
        return a.same(b);
    }
  }
  static int order(const Value& a, const Value& b, const std::string& op) {
    if (a.is_undefined()) undefined_error(a);
    if (b.is_undefined()) undefined_error(b);
    if (a.is_number() && b.is_number()) return a.f() < b.f() ? -1 : a.f() > b.f() ? 1 : 0;
    if (a.is_string() && b.is_string()) return a.s() < b.s() ? -1 : a.s() > b.s() ? 1 : 0;
    if (a.is_array() && b.is_array()) {
      for (size_t i = 0; i < std::min(a.arr().size(), b.arr().size()); ++i)
        if (!equals(a.arr()[i], b.arr()[i])) return order(a.arr()[i], b.arr()[i], op);
      return a.arr().size() < b.arr().size() ? -1 : a.arr().size() > b.arr().size() ? 1 : 0;
    }
    fail("TypeError: '" + op + "' not supported between instances of '" + type_name(a) + "' and '" +
         type_name(b) + "'");
  }
  static bool contains(const Value& container, const Value& item) {
    switch (container.kind()) {
      case Kind::Undefined:
        return false;
      case Kind::String:
        if (!item.is_string())
          fail("TypeError: 'in <string>' requires string as left operand, not " + type_name(item));
        return container.s().find(item.s()) != std::string::npos;
      case Kind::Array:
        for (const Value& v : container.arr())
          if (equals(v, item)) return true;
        return false;
      case Kind::Object:
        return item.is_string() && container.obj().find(item.s());
      default:
        fail("TypeError: argument of type '" + type_name(container) + "' is not iterable");
    }
  }
  static bool compare(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in") return contains(r, l);
    if (op == "notin") return !contains(r, l);
    const int c = order(l, r, op);
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  static Value binary(const std::string& op, const Value& l, const Value& r) {
    if (l.is_undefined()) undefined_error(l);
    if (r.is_undefined()) undefined_error(r);
    if (op == "+") {
      if (l.is_string() && r.is_string()) {
        if (l.is_safe() || r.is_safe())  // Markup + str escapes the str
          return Value::markup((l.is_safe() ? l.s() : html_escape(l.s())) +
                               (r.is_safe() ? r.s() : html_escape(r.s())));
        return Value(l.s() + r.s());
      }
      if (l.is_array() && r.is_array() && l.is_tuple() == r.is_tuple()) {
        auto items = l.arr();
        items.insert(items.end(), r.arr().begin(), r.arr().end());
        return Value::array(std::move(items), l.is_tuple());
      }
      if (l.is_string())
        fail("TypeError: can only concatenate str (not \"" + type_name(r) + "\") to str");
      if (l.is_array())
        fail("TypeError: can only concatenate list (not \"" + type_name(r) + "\") to list");
    }
    if (op == "*") {
      if ((l.is_string() || l.is_array()) && (r.kind() == Kind::Int || r.kind() == Kind::Bool)) {
        if (l.is_string()) {
          std::string s;
          for (int64_t i = 0; i < r.i(); ++i) s += l.s();
          return Value(std::move(s));
        }
        std::vector<Value> items;
        for (int64_t i = 0; i < r.i(); ++i)
          items.insert(items.end(), l.arr().begin(), l.arr().end());
        return Value::array(std::move(items), l.is_tuple());
      }
      if (r.is_string() && (l.kind() == Kind::Int || l.kind() == Kind::Bool))
        return binary(op, r, l);
    }
    if (op == "%" && l.is_string())
      fail("TypeError: printf-style string formatting is not supported");
    if (!l.is_number() || !r.is_number())
      fail("TypeError: unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" +
           type_name(r) + "'");
    const bool ints = l.kind() != Kind::Float && r.kind() != Kind::Float;
    if (op == "/") {
      if (r.f() == 0) fail("ZeroDivisionError: division by zero");
      return Value(l.f() / r.f());
    }
    if (op == "//" || op == "%") {
      if (r.f() == 0) fail("ZeroDivisionError: integer division or modulo by zero");
      if (ints) {
        int64_t q = l.i() / r.i(), m = l.i() % r.i();
        if (m != 0 && ((m < 0) != (r.i() < 0))) --q, m += r.i();
        return op == "//" ? Value(q) : Value(m);
      }
      const double q = std::floor(l.f() / r.f());
      return op == "//" ? Value(q) : Value(l.f() - q * r.f());
    }
    if (op == "**") {
      if (ints && r.i() >= 0) {
        int64_t p = 1;
        for (int64_t i = 0; i < r.i(); ++i) p *= l.i();
        return Value(p);
      }
      return Value(std::pow(l.f(), r.f()));
    }
    if (ints) {
      if (op == "+") return Value(l.i() + r.i());
      if (op == "-") return Value(l.i() - r.i());
      return Value(l.i() * r.i());
    }
    if (op == "+") return Value(l.f() + r.f());
    if (op == "-") return Value(l.f() - r.f());
    return Value(l.f() * r.f());
  }

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  Value slice(const Value& v, const Value& a, const Value& b, const Value& c) {
    if (v.is_undefined()) undefined_error(v);
    auto num = [](const Value& x, int64_t def) {
      if (x.is_none() || x.is_undefined()) return def;
      if (x.kind() != Kind::Int && x.kind() != Kind::Bool)
        fail("TypeError: slice indices must be integers or None");
      return x.i();
    };
    int64_t step = num(c, 1);
    if (step == 0) fail("ValueError: slice step cannot be zero");
    std::vector<uint32_t> cps;
    int64_t n;
    if (v.is_string())
      cps = code_points(v.s()), n = int64_t(cps.size());
    else if (v.is_array())
      n = int64_t(v.arr().size());
    else
      fail("TypeError: '" + type_name(v) + "' object is not subscriptable");
    auto clamp = [&](const Value& x, int64_t def) {
      if (x.is_none() || x.is_undefined()) return def;
      int64_t i = num(x, 0);
      if (i < 0) i += n;
      if (step > 0) return std::clamp<int64_t>(i, 0, n);
      return std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t start = clamp(a, step > 0 ? 0 : n - 1), stop = clamp(b, step > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
    if (v.is_string()) {
      std::string s;
      for (int64_t i : idx) put_cp(s, cps[size_t(i)]);
      return Value(std::move(s));
    }
    std::vector<Value> items;
    for (int64_t i : idx) items.push_back(v.arr()[size_t(i)]);
    return Value::array(std::move(items), v.is_tuple());
  }

  Value get_item(const Value& v, const Value& key) {
    switch (v.kind()) {
      case Kind::Undefined:
        undefined_error(v);
      case Kind::Array:
        if (key.kind() == Kind::Int || key.kind() == Kind::Bool) {
          const int64_t i = norm_index(key.i(), int64_t(v.arr().size()));
          if (i >= 0 && i < int64_t(v.arr().size())) return v.arr()[size_t(i)];
          return Value::undefined(type_name(v) + " object has no element " + to_str(key));
        }
        break;
      case Kind::String:
        if (key.kind() == Kind::Int || key.kind() == Kind::Bool) {
          auto cps = code_points(v.s());
          const int64_t i = norm_index(key.i(), int64_t(cps.size()));
          if (i >= 0 && i < int64_t(cps.size()))
            return Value(from_cps(cps, size_t(i), size_t(i) + 1));
          return Value::undefined("str object has no element " + to_str(key));
        }
        break;
      case Kind::Object:
        if (key.is_string()) {
          if (const Value* f = v.obj().find(key.s())) return *f;
          return get_attr_only(v, key.s());
        }
        for (const auto& [text, k] : v.obj().key_values)
          if (equals(k, key)) return *v.obj().find(text);
        return Value::undefined(repr(v) + " has no element " + repr(key));
      default:
        break;
    }
    if (key.is_string()) return get_attr_only(v, key.s());
    return Value::undefined((v.is_none() ? std::string("None") : type_name(v) + " object") +
                            " has no element " + to_str(key));
  }

  Value get_attr(const Value& v, const std::string& name) {
    if (v.is_undefined()) undefined_error(v);
    Value m = get_attr_only(v, name);
    if (!m.is_undefined()) return m;
    if (v.is_object() && !v.is_namespace())
      if (const Value* f = v.obj().find(name)) return *f;
    if (v.is_namespace())
      if (const Value* f = v.obj().find(name)) return *f;
    if (v.is_object()) return Value::undefined("'dict object' has no attribute '" + name + "'");
    if (v.is_none()) return Value::undefined("'None' has no attribute '" + name + "'");
    return Value::undefined("'" + type_name(v) + " object' has no attribute '" + name + "'");
  }

  [[noreturn]] static void unsafe(const std::string& name, const Value& v) {
    fail("SecurityError: access to attribute '" + name + "' of '" + type_name(v) +
         "' object is unsafe.");
  }

  // The methods of Python's str, dict and list that templates call (bound to v), or undefined.
  Value get_attr_only(const Value& v, const std::string& name);

 public:
  Value apply_filter(const Expr& f, Value v);
  bool apply_test(const Expr& t);

 private:
  std::vector<Scope> scopes_;
  RenderOptions opts_;
  friend Value call_filter(Interp&, const std::string&, Value, std::vector<Value>&, Kwargs&);
};

namespace {

std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
  auto is_strip = [&](char c) {
    if (!chars || chars->is_none()) return is_ws(c);
    return chars->s().find(c) != std::string::npos;
  };
  size_t a = 0, b = s.size();
  if (left)
    while (a < b && is_strip(s[a])) ++a;
  if (right)
    while (b > a && is_strip(s[b - 1])) --b;
  return s.substr(a, b - a);
}

std::vector<Value> split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<Value> out;
  if (!sep || sep->is_none()) {
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_ws(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        size_t e = s.size();
        while (e > i && is_ws(s[e - 1])) --e;
        out.push_back(Value(s.substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_ws(s[j])) ++j;
      out.push_back(Value(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->s();
  if (d.empty()) fail("ValueError: empty separator");
  size_t i = 0;
  for (;;) {
    const size_t j = s.find(d, i);
    if (j == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
      out.push_back(Value(s.substr(i)));
      return out;
    }
    out.push_back(Value(s.substr(i, j - i)));
    i = j + d.size();
  }
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character
    auto cps = code_points(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) out += to, ++n;
      if (i < cps.size()) put_cp(out, cps[i]);
    }
    return out;
  }
  size_t i = 0;
  int64_t n = 0;
  for (;;) {
    const size_t j = s.find(from, i);
    if (j == std::string::npos || (count >= 0 && n >= count)) break;
    out += s.substr(i, j - i) + to;
    i = j + from.size();
    ++n;
  }
  return out + s.substr(i);
}

std::string case_map(const std::string& s, int mode) {  // 0 lower, 1 upper (ASCII)
  std::string out = s;
  for (char& c : out)
    c = mode ? char(std::toupper(static_cast<unsigned char>(c)))
             : char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string title_case(const std::string& s) {
  std::string out = s;
  bool prev_alpha = false;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c));
    c = alpha ? (prev_alpha ? char(std::tolower(static_cast<unsigned char>(c)))
                            : char(std::toupper(static_cast<unsigned char>(c))))
              : c;
    prev_alpha = alpha;
  }
  return out;
}

// Python's str.format with {} / {0} / {name} fields (no format specs beyond the empty one).
std::string py_format(const std::string& fmt, const std::vector<Value>& args, const Kwargs& kw) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{', ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}', ++i;
    } else if (c == '{') {
      const size_t e = fmt.find('}', i);
      if (e == std::string::npos) fail("ValueError: Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, e - i - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
        fail("ValueError: format specifications are not supported");
      Value v;
      if (field.empty()) {
        if (auto_idx >= args.size()) fail("IndexError: Replacement index out of range");
        v = args[auto_idx++];
      } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
        const size_t k = std::stoul(field);
        if (k >= args.size()) fail("IndexError: Replacement index out of range");
        v = args[k];
      } else {
        auto f =
            std::find_if(kw.begin(), kw.end(), [&](const auto& p) { return p.first == field; });
        if (f == kw.end()) fail("KeyError: '" + field + "'");
        v = f->second;
      }
      out += to_str(v);
      i = e;
    } else if (c == '}') {
      fail("ValueError: Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

const Value* kwarg(const Kwargs& kw, const char* name) {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}
// Argument i, or keyword `name`, or null.
const Value* arg(const std::vector<Value>& a, const Kwargs& kw, size_t i, const char* name) {
  if (i < a.size()) return &a[i];
  return kwarg(kw, name);
}

}  // namespace

Value Interp::get_attr_only(const Value& v, const std::string& name) {
  auto method = [&](Native f) { return Value::func(name, std::move(f)); };
  if (v.is_string()) {
    const std::string s = v.s();
    const Value self = v;
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return method([s, name, self](Interp&, std::vector<Value>& a, Kwargs&) {
        return like(
            self, strip_chars(s, a.empty() ? nullptr : &a[0], name != "rstrip", name != "lstrip"));
      });
    if (name == "split" || name == "rsplit")
      return method([s, name](Interp&, std::vector<Value>& a, Kwargs& kw) {
        const Value* sep = arg(a, kw, 0, "sep");
        const Value* mx = arg(a, kw, 1, "maxsplit");
        const int64_t m = mx ? mx->i() : -1;
        if (name == "rsplit" && m >= 0) {  // from the right
          auto all = split(s, sep, -1);
          if (int64_t(all.size()) <= m + 1) return Value::array(all);
          const std::string d = sep && !sep->is_none() ? sep->s() : " ";
          std::string head;
          const size_t keep = all.size() - size_t(m);
          for (size_t i = 0; i < keep; ++i) head += (i ? d : "") + all[i].s();
          std::vector<Value> out{Value(head)};
          out.insert(out.end(), all.begin() + long(keep), all.end());
          return Value::array(out);
        }
        return Value::array(split(s, sep, m));
      });
    if (name == "startswith" || name == "endswith")
      return method([s, name](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.empty()) fail("TypeError: " + name + " takes at least 1 argument");
        std::vector<Value> cands = a[0].is_array() ? a[0].arr() : std::vector<Value>{a[0]};
        for (const Value& c : cands) {
          if (!c.is_string()) fail("TypeError: " + name + " arg must be str or a tuple of str");
          const std::string& p = c.s();
          if (p.size() <= s.size() &&
              (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                    : s.compare(s.size() - p.size(), p.size(), p) == 0))
            return Value(true);
        }
        return Value(false);
      });
    if (name == "replace")
      return method([s, self](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.size() < 2 || !a[0].is_string() || !a[1].is_string())
          fail("TypeError: replace expects two strings");
        auto esc = [&](const Value& x) {
          return self.is_safe() && !x.is_safe() ? html_escape(x.s()) : x.s();
        };
        return like(self, replace_all(s, esc(a[0]), esc(a[1]), a.size() > 2 ? a[2].i() : -1));
      });
    if (name == "upper" || name == "lower")
      return method([s, name, self](Interp&, std::vector<Value>&, Kwargs&) {
        return like(self, case_map(s, name == "upper"));
      });
    if (name == "title")
      return method([s](Interp&, std::vector<Value>&, Kwargs&) { return Value(title_case(s)); });
    if (name == "capitalize")
      return method([s](Interp&, std::vector<Value>&, Kwargs&) {
        std::string o = case_map(s, 0);
        if (!o.empty()) o[0] = char(std::toupper(static_cast<unsigned char>(o[0])));
        return Value(o);
      });
    if (name == "format")
      return method(
          [s](Interp&, std::vector<Value>& a, Kwargs& kw) { return Value(py_format(s, a, kw)); });
    if (name == "join")
      return method([s](Interp&, std::vector<Value>& a, Kwargs&) {
        std::string out;
        if (a.empty()) fail("TypeError: join takes one argument");
        auto items = iterate(a[0]);
        for (size_t i = 0; i < items.size(); ++i) {
          if (!items[i].is_string())
            fail("TypeError: sequence item " + std::to_string(i) + ": expected str instance, " +
                 type_name(items[i]) + " found");
          out += (i ? s : "") + items[i].s();
        }
        return Value(out);
      });
    if (name == "find" || name == "rfind" || name == "count" || name == "index")
      return method([s, name](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.empty() || !a[0].is_string()) fail("TypeError: " + name + " expects a string");
        const std::string& p = a[0].s();
        if (name == "count") {
          if (p.empty()) return Value(int64_t(code_points(s).size() + 1));
          int64_t n = 0;
          for (size_t i = s.find(p); i != std::string::npos; i = s.find(p, i + p.size())) ++n;
          return Value(n);
        }
        const size_t at = name == "rfind" ? s.rfind(p) : s.find(p);
        if (at == std::string::npos) {
          if (name == "index") fail("ValueError: substring not found");
          return Value(int64_t{-1});
        }
        return Value(int64_t(code_points(s.substr(0, at)).size()));
      });
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" ||
        name == "islower" || name == "isupper")
      return method([s, name](Interp&, std::vector<Value>&, Kwargs&) {
        if (s.empty()) return Value(false);
        bool any_cased = false;
        for (unsigned char c : s) {
          bool ok = name == "isdigit"   ? std::isdigit(c)
                    : name == "isalpha" ? std::isalpha(c)
                    : name == "isspace" ? std::isspace(c)
                    : name == "isalnum" ? std::isalnum(c)
                    : name == "islower" ? !std::isupper(c)
                                        : !std::islower(c);
          any_cased |= std::isalpha(c) != 0;
          if (!ok) return Value(false);
        }
        return Value(name == "islower" || name == "isupper" ? any_cased : true);
      });
    if (name == "splitlines")
      return method([s](Interp&, std::vector<Value>&, Kwargs&) {
        std::vector<Value> out;
        size_t i = 0;
        while (i < s.size()) {
          size_t j = s.find('\n', i);
          if (j == std::string::npos) j = s.size();
          std::string line = s.substr(i, j - i);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          out.push_back(Value(line));
          i = j + 1;
        }
        return Value::array(out);
      });
    return Value::undefined();
  }
  if (v.is_object() && !v.is_namespace()) {
    const Value self = v;
    if (name == "get")
      return method([self](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.empty()) fail("TypeError: get expected at least 1 argument, got 0");
        if (a[0].is_string())
          if (const Value* f = self.obj().find(a[0].s())) return *f;
        return a.size() > 1 ? a[1] : Value::none();
      });
    if (name == "items" || name == "keys" || name == "values")
      return method([self, name](Interp&, std::vector<Value>&, Kwargs&) {
        std::vector<Value> out;
        for (const auto& [k, e] : self.obj().items)
          out.push_back(name == "items"  ? Value::array({self.obj().key(k), e}, /*tuple=*/true)
                        : name == "keys" ? self.obj().key(k)
                                         : e);
        return Value::array(out);
      });
    if (name == "copy")
      return method([self](Interp&, std::vector<Value>&, Kwargs&) {
        Value d = Value::object();
        d.obj().items = self.obj().items;
        return d;
      });
    if (name == "pop" || name == "update" || name == "setdefault" || name == "clear" ||
        name == "popitem")
      unsafe(name, v);
    return Value::undefined();
  }
  if (v.is_array()) {
    const Value self = v;
    if (name == "index" || name == "count")
      return method([self, name](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.empty()) fail("TypeError: " + name + " takes one argument");
        int64_t n = 0;
        for (size_t i = 0; i < self.arr().size(); ++i)
          if (equals(self.arr()[i], a[0])) {
            if (name == "index") return Value(int64_t(i));
            ++n;
          }
        if (name == "index") fail("ValueError: " + repr(a[0]) + " is not in list");
        return Value(n);
      });
    if (!v.is_tuple() &&
        (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
         name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
      unsafe(name, v);
    return Value::undefined();
  }
  return Value::undefined();
}

namespace {

// Attribute lookup for filters' `attribute=` ("a.b" and integer parts, as Jinja's).
Value lookup_path(Interp& in, const Value& v, const std::string& path, auto&& get_item) {
  Value cur = v;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('.', i);
    if (j == std::string::npos) j = path.size();
    const std::string part = path.substr(i, j - i);
    const bool num = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = get_item(in, cur, num ? Value(int64_t(std::stoll(part))) : Value(part));
    i = j + 1;
  }
  return cur;
}

}  // namespace

bool Interp::apply_test(const Expr& t) {
  Value v = eval(*t.a[0]);
  std::vector<Value> args;
  for (size_t i = 1; i < t.a.size(); ++i) args.push_back(eval(*t.a[i]));
  const std::string& n = t.name;
  auto need = [&](size_t k) {
    if (args.size() < k) fail("TypeError: test '" + n + "' needs an argument");
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.is_object() && !v.is_namespace();
  if (n == "iterable") return v.is_array() || v.is_object() || v.is_string() || v.is_undefined();
  if (n == "sequence") return v.is_array() || v.is_string() || (v.is_object() && !v.is_namespace());
  if (n == "boolean") return v.kind() == Kind::Bool;
  if (n == "true") return v.kind() == Kind::Bool && v.b();
  if (n == "false") return v.kind() == Kind::Bool && !v.b();
  if (n == "number") return v.is_number();
  if (n == "integer") return v.kind() == Kind::Int;
  if (n == "float") return v.kind() == Kind::Float;
  if (n == "callable") return v.kind() == Kind::Func;
  if (n == "lower" || n == "upper") {
    const std::string s = to_str(v);
    return s == case_map(s, n == "upper");
  }
  if (n == "odd" || n == "even" || n == "divisibleby") {
    if (v.is_undefined()) undefined_error(v);
    if (v.kind() != Kind::Int && v.kind() != Kind::Bool)
      fail("TypeError: test '" + n + "' needs an integer");
    if (n == "divisibleby") {
      need(1);
      if (args[0].i() == 0) fail("ZeroDivisionError: integer division or modulo by zero");
      return v.i() % args[0].i() == 0;
    }
    return (std::abs(v.i()) % 2 == 1) == (n == "odd");
  }
  need(1);
  if (n == "eq" || n == "equalto" || n == "==") return equals(v, args[0]);
  if (n == "ne") return !equals(v, args[0]);
  if (n == "sameas") return v.same(args[0]);
  if (n == "in") return contains(args[0], v);
  if (n == "gt" || n == "greaterthan") return order(v, args[0], ">") > 0;
  if (n == "ge") return order(v, args[0], ">=") >= 0;
  if (n == "lt" || n == "lessthan") return order(v, args[0], "<") < 0;
  if (n == "le") return order(v, args[0], "<=") <= 0;
  fail("TemplateRuntimeError: the test '" + n + "' is not supported");
}

Value call_filter(Interp& in, const std::string& n, Value v, std::vector<Value>& a, Kwargs& kw);

Value Interp::apply_filter(const Expr& f, Value v) {
  std::vector<Value> args;
  for (size_t i = 1; i < f.a.size(); ++i) args.push_back(eval(*f.a[i]));
  Kwargs kw;
  for (const auto& [k, x] : f.kw) kw.emplace_back(k, eval(*x));
  return call_filter(*this, f.name, std::move(v), args, kw);
}

Value call_filter(Interp& in, const std::string& n, Value v, std::vector<Value>& a, Kwargs& kw) {
  auto item = [](Interp& i, const Value& x, const Value& k) { return i.get_item(x, k); };
  if (n == "default" || n == "d") {
    const Value* def = arg(a, kw, 0, "default_value");
    const Value* boolean = arg(a, kw, 1, "boolean");
    const bool use =
        v.is_undefined() || (boolean && Interp::truthy(*boolean) && !Interp::truthy(v));
    return use ? (def ? *def : Value("")) : v;
  }
  if (n == "safe") return v.is_safe() ? v : Value::markup(to_str(v));
  if (n == "e" || n == "escape" || n == "forceescape")
    return v.is_safe() && n != "forceescape" ? v : Value::markup(html_escape(to_str(v)));
  if (n == "tojson") {
    JsonOpts o;
    if (const Value* x = arg(a, kw, 0, "ensure_ascii")) o.ascii = Interp::truthy(*x);
    if (const Value* x = arg(a, kw, 1, "indent"); x && !x->is_none()) {
      if (x->is_string()) fail("TypeError: string indents are not supported");
      o.indent = int(x->i()), o.item_sep = ",";
    }
    if (const Value* x = arg(a, kw, 2, "separators"); x && !x->is_none()) {
      auto parts = Interp::iterate(*x);
      if (parts.size() != 2) fail("ValueError: separators must be a pair");
      o.item_sep = to_str(parts[0]), o.key_sep = to_str(parts[1]);
    }
    if (const Value* x = arg(a, kw, 3, "sort_keys")) o.sort = Interp::truthy(*x);
    std::string out;
    to_json(out, v, o, 0);
    return Value(out);
  }
  if (n == "from_json") {
    if (!v.is_string()) fail("TypeError: the JSON object must be str, not " + type_name(v));
    auto j = nlohmann::ordered_json::parse(v.s(), nullptr, false);
    if (j.is_discarded()) fail("JSONDecodeError: invalid JSON");
    return Value::from_json(j);
  }
  if (n == "length" || n == "count") {
    switch (v.kind()) {
      case Kind::Undefined:
        return Value(int64_t{0});
      case Kind::String:
        return Value(int64_t(code_points(v.s()).size()));
      case Kind::Array:
        if (v.is_generator()) fail("TypeError: object of type 'generator' has no len()");
        return Value(int64_t(v.arr().size()));
      case Kind::Object:
        return Value(int64_t(v.obj().items.size()));
      default:
        fail("TypeError: object of type '" + type_name(v) + "' has no len()");
    }
  }
  // soft_str keeps Markup, and Markup's methods return Markup.
  if (n == "string") return v.is_string() ? v : Value(to_str(v));
  if (n == "trim") {
    const Value* chars = arg(a, kw, 0, "chars");
    return like(v, strip_chars(to_str(v), chars, true, true));
  }
  if (n == "upper" || n == "lower") return like(v, case_map(to_str(v), n == "upper"));
  if (n == "title") return like(v, title_case(to_str(v)));
  if (n == "capitalize") {
    std::string s = case_map(to_str(v), 0);
    if (!s.empty()) s[0] = char(std::toupper(static_cast<unsigned char>(s[0])));
    return like(v, s);
  }
  if (n == "replace") {
    if (a.size() < 2) fail("TypeError: replace needs two arguments");
    return Value(replace_all(to_str(v), to_str(a[0]), to_str(a[1]), a.size() > 2 ? a[2].i() : -1));
  }
  if (n == "join") {
    const Value* sep = arg(a, kw, 0, "d");
    const Value* attr = arg(a, kw, 1, "attribute");
    std::string out;
    auto items = Interp::iterate(v);
    for (size_t i = 0; i < items.size(); ++i) {
      Value x = attr ? lookup_path(in, items[i], to_str(*attr), item) : items[i];
      out += (i && sep ? to_str(*sep) : "") + to_str(x);
    }
    return Value(out);
  }
  if (n == "list") return Value::array(Interp::iterate(v));
  if (n == "first" || n == "last") {
    auto items = Interp::iterate(v);
    if (items.empty()) return Value::undefined("No " + n + " item, sequence was empty.");
    return n == "first" ? items.front() : items.back();
  }
  if (n == "reverse") {
    if (v.is_string()) {
      auto cps = code_points(v.s());
      std::reverse(cps.begin(), cps.end());
      return Value(from_cps(cps, 0, cps.size()));
    }
    auto items = Interp::iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::array(items);
  }
  if (n == "items") {
    if (v.is_undefined()) return Value::array();
    if (!v.is_object()) fail("TypeError: can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, e] : v.obj().items) out.push_back(Value::array({v.obj().key(k), e}, true));
    return Value::generator(out);
  }
  if (n == "dictsort") {
    if (!v.is_object()) fail("TypeError: can only dictsort a mapping.");
    const Value* cs = arg(a, kw, 0, "case_sensitive");
    const Value* by = arg(a, kw, 1, "by");
    const Value* rev = arg(a, kw, 2, "reverse");
    const bool by_value = by && to_str(*by) == "value";
    const bool case_sensitive = cs && Interp::truthy(*cs);
    std::vector<Value> out;
    for (const auto& [k, e] : v.obj().items) out.push_back(Value::array({v.obj().key(k), e}, true));
    std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
      Value kx = x.arr()[by_value], ky = y.arr()[by_value];
      if (!case_sensitive && kx.is_string()) kx = Value(case_map(kx.s(), 0));
      if (!case_sensitive && ky.is_string()) ky = Value(case_map(ky.s(), 0));
      return Interp::order(kx, ky, "<") < 0;
    });
    if (rev && Interp::truthy(*rev)) std::reverse(out.begin(), out.end());
    return Value::array(out);
  }
  if (n == "sort") {
    const Value* rev = arg(a, kw, 0, "reverse");
    const Value* cs = arg(a, kw, 1, "case_sensitive");
    const Value* attr = arg(a, kw, 2, "attribute");
    const bool case_sensitive = cs && Interp::truthy(*cs);
    auto items = Interp::iterate(v);
    auto key = [&](const Value& x) {
      Value k = attr ? lookup_path(in, x, to_str(*attr), item) : x;
      if (!case_sensitive && k.is_string()) k = Value(case_map(k.s(), 0));
      return k;
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return Interp::order(key(x), key(y), "<") < 0;
    });
    if (rev && Interp::truthy(*rev)) std::reverse(items.begin(), items.end());
    return Value::array(items);
  }
  if (n == "unique") {
    std::vector<Value> out;
    for (const Value& x : Interp::iterate(v)) {
      bool seen = false;
      for (const Value& y : out) {
        Value lx = x.is_string() ? Value(case_map(x.s(), 0)) : x;
        Value ly = y.is_string() ? Value(case_map(y.s(), 0)) : y;
        seen |= Interp::equals(lx, ly);
      }
      if (!seen) out.push_back(x);
    }
    return Value::generator(out);
  }
  if (n == "min" || n == "max") {
    auto items = Interp::iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    Value best = items[0];
    for (const Value& x : items)
      if (Interp::order(x, best, "<") * (n == "min" ? 1 : -1) < 0) best = x;
    return best;
  }
  if (n == "sum") {
    Value total = Value(int64_t{0});
    for (const Value& x : Interp::iterate(v)) total = Interp::binary("+", total, x);
    return total;
  }
  if (n == "int") {
    const Value* def = arg(a, kw, 0, "default");
    if (v.kind() == Kind::Int || v.kind() == Kind::Bool) return Value(v.i());
    if (v.kind() == Kind::Float) return Value(int64_t(v.f()));
    if (v.is_string()) {
      try {
        size_t used = 0;
        std::string s = strip_chars(v.s(), nullptr, true, true);
        const int64_t r = std::stoll(s, &used);
        if (used == s.size()) return Value(r);
        return Value(int64_t(std::stod(s)));
      } catch (...) {
      }
    }
    return def ? *def : Value(int64_t{0});
  }
  if (n == "float") {
    if (v.is_number()) return Value(v.f());
    if (v.is_string()) try {
        return Value(std::stod(v.s()));
      } catch (...) {
      }
    const Value* def = arg(a, kw, 0, "default");
    return def ? *def : Value(0.0);
  }
  if (n == "abs") {
    if (!v.is_number()) fail("TypeError: bad operand type for abs()");
    return v.kind() == Kind::Float ? Value(std::fabs(v.f())) : Value(std::abs(v.i()));
  }
  if (n == "round") {
    const Value* prec = arg(a, kw, 0, "precision");
    const double p = std::pow(10.0, prec ? double(prec->i()) : 0.0);
    return Value(std::round(v.f() * p) / p);
  }
  if (n == "indent") {
    const Value* width = arg(a, kw, 0, "width");
    const Value* first = arg(a, kw, 1, "first");
    const Value* blank = arg(a, kw, 2, "blank");
    const std::string pad =
        width ? (width->is_string() ? width->s() : std::string(size_t(width->i()), ' '))
              : std::string(4, ' ');
    std::string s = to_str(v), out;
    const bool ind_blank = blank && Interp::truthy(*blank);
    // Jinja: newline + pad joins the lines; blank lines stay unindented unless `blank`.
    std::vector<std::string> lines;
    size_t i = 0;
    for (;;) {
      size_t j = s.find('\n', i);
      if (j == std::string::npos) {
        lines.push_back(s.substr(i));
        break;
      }
      lines.push_back(s.substr(i, j - i));
      i = j + 1;
    }
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) out += "\n";
      const bool indent =
          (k > 0 || (first && Interp::truthy(*first))) && (ind_blank || !lines[k].empty());
      out += (indent ? pad : "") + lines[k];
    }
    return Value(out);
  }
  if (n == "map" || n == "select" || n == "reject" || n == "selectattr" || n == "rejectattr") {
    // Jinja2 iterates only a true value (so none gives nothing) and yields lazily.
    auto items = Interp::truthy(v) ? Interp::iterate(v) : std::vector<Value>{};
    std::vector<Value> out;
    if (n == "map") {
      const Value* attr = kwarg(kw, "attribute");
      if (attr) {
        const Value* def = kwarg(kw, "default");
        for (const Value& x : items) {
          Value r = lookup_path(in, x, to_str(*attr), item);
          out.push_back(r.is_undefined() && def ? *def : r);
        }
      } else {
        if (a.empty()) fail("TypeError: map needs a filter name or attribute=");
        const std::string fname = to_str(a[0]);
        if (!kFilters.count(fname)) fail("TemplateRuntimeError: No filter named '" + fname + "'");
        std::vector<Value> rest(a.begin() + 1, a.end());
        for (const Value& x : items) {
          auto r2 = rest;
          Kwargs k2;
          out.push_back(call_filter(in, fname, x, r2, k2));
        }
      }
      return Value::generator(out);
    }
    const bool attr_mode = n == "selectattr" || n == "rejectattr";
    const bool want = n == "select" || n == "selectattr";
    size_t ai = 0;
    std::string attr;
    if (attr_mode) {
      if (a.empty()) fail("TypeError: " + n + " needs an attribute");
      attr = to_str(a[ai++]);
    }
    std::string test = ai < a.size() ? to_str(a[ai++]) : "";
    if (!test.empty() && !kTests.count(test))
      fail("TemplateRuntimeError: No test named '" + test + "'");
    for (const Value& x : items) {
      Value subject = attr_mode ? lookup_path(in, x, attr, item) : x;
      bool r;
      if (test.empty()) {
        r = Interp::truthy(subject);
      } else {
        Expr e;
        e.k = Expr::K::Test;
        e.name = test;
        auto lit = [](Value val) {
          auto p = std::make_unique<Expr>();
          p->k = Expr::K::Lit;
          p->lit = std::move(val);
          return p;
        };
        e.a.push_back(lit(subject));
        for (size_t k = ai; k < a.size(); ++k) e.a.push_back(lit(a[k]));
        r = in.apply_test(e);
      }
      if (r == want) out.push_back(x);
    }
    return Value::generator(out);
  }
  if (n == "batch" || n == "slice") {
    if (a.empty()) fail("TypeError: " + n + " needs a count");
    auto items = Interp::iterate(v);
    const int64_t k = a[0].i();
    if (k <= 0) fail("ValueError: " + n + " needs a positive count");
    std::vector<Value> out;
    if (n == "batch") {
      for (size_t i = 0; i < items.size(); i += size_t(k))
        out.push_back(Value::array(std::vector<Value>(
            items.begin() + long(i), items.begin() + long(std::min(items.size(), i + size_t(k))))));
    } else {
      const size_t per = items.size() / size_t(k), extra = items.size() % size_t(k);
      size_t at = 0;
      for (int64_t s = 0; s < k; ++s) {
        const size_t len = per + (size_t(s) < extra);
        out.push_back(Value::array(
            std::vector<Value>(items.begin() + long(at), items.begin() + long(at + len))));
        at += len;
      }
    }
    return Value::array(out);
  }
  if (n == "wordcount") return Value(int64_t(split(to_str(v), nullptr, -1).size()));
  if (n == "attr") return in.get_attr(v, a.empty() ? std::string() : to_str(a[0]));
  if (n == "format") {
    std::vector<Value> rest = a;
    return Value(py_format(to_str(v), rest, kw));
  }
  if (n == "center") {
    const int64_t w = a.empty() ? 80 : a[0].i();
    std::string s = to_str(v);
    const int64_t len = int64_t(code_points(s).size());
    if (len >= w) return Value(s);
    const int64_t left = (w - len) / 2 + ((w - len) % 2 & w % 2);
    return Value(std::string(size_t(left), ' ') + s + std::string(size_t(w - len - left), ' '));
  }
  fail("TemplateRuntimeError: the filter '" + n + "' is not supported");
}

// ---- Template ------------------------------------------------------------------------------

Result<Template> Template::parse(std::string_view source) {
  try {
    Template t;
    t.root_ = Parser(lex(source)).parse_template();
    return t;
  } catch (const Error& e) {
    return make_error(e.what());
  }
}

Result<std::string> Template::render(const Value& context, const RenderOptions& o) const {
  try {
    Interp in(context, o);
    std::string out;
    in.exec(*root_, out);
    return out;
  } catch (const Error& e) {
    return make_error(e.what());
  } catch (const BreakSignal&) {
    return make_error("TemplateSyntaxError: break outside a loop");
  } catch (const ContinueSignal&) {
    return make_error("TemplateSyntaxError: continue outside a loop");
  }
}

}  // namespace expertd::jinja
