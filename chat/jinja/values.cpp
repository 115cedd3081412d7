// Python's values (jinja.h's Value and Object), its formatting (str, repr), strings (the
// methods templates call: strip, split, replace, title, format) and JSON (tojson).
#include <algorithm>
#include <charconv>
#include <cmath>

#include "chat/jinja/internal.h"

namespace expertd::jinja {

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

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

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

}  // namespace expertd::jinja
