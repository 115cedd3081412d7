#include "chat/reply.h"

#include <algorithm>
#include <cstring>

namespace expertd::chat {

using nlohmann::ordered_json;

namespace {

bool has(std::string_view s, std::string_view x) {
  return s.find(x) != std::string_view::npos;
}
bool is_ws(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
std::string_view trim_end(std::string_view s) {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}
std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  return s;
}
std::string_view trim(std::string_view s) {
  return ltrim(trim_end(s));
}
// The length of the longest tail of `s` that begins one of `markers` (0: none).
size_t marker_tail(std::string_view s, const std::vector<std::string_view>& markers) {
  size_t keep = 0;
  for (auto m : markers)
    for (size_t n = std::min(m.size() - 1, s.size()); n > keep; --n)
      if (s.substr(s.size() - n) == m.substr(0, n)) {
        keep = n;
        break;
      }
  return keep;
}
// What a partial parse may show of running text: not a tail that may begin a marker, and not
// trailing whitespace (it may come before a marker, where the finished parse trims it).
std::string_view settled(std::string_view s, const std::vector<std::string_view>& markers,
                         bool partial) {
  if (!partial) return s;
  s.remove_suffix(marker_tail(s, markers));
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
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

const ordered_json* tool_params(const ordered_json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools)
    if (t.is_object() && t.contains("function") && t["function"].is_object() &&
        t["function"].value("name", "") == name && t["function"].contains("parameters"))
      return &t["function"]["parameters"];
  return nullptr;
}

// A value written as text in an XML-style call: a string where the tool's schema says so,
// else JSON when it parses as JSON, else the string.
ordered_json typed_value(std::string_view v, const ordered_json* params, const std::string& key) {
  if (params && params->is_object() && params->contains("properties") &&
      (*params)["properties"].contains(key)) {
    const auto& t = (*params)["properties"][key].value("type", ordered_json());
    const bool is_string = t == "string" || (t.is_array() && t.size() == 1 && t[0] == "string");
    if (is_string) return std::string(v);
  }
  auto j = ordered_json::parse(v, nullptr, false);
  if (!j.is_discarded()) return j;
  return std::string(v);
}

std::string json_text(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// Arguments given as JSON text: normalised when they parse as an object.
bool json_args(std::string_view raw, std::string& out) {
  auto j = ordered_json::parse(trim(raw), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  out = json_text(j);
  return true;
}

std::string attr(std::string_view attrs, std::string_view key) {
  const std::string k = " " + std::string(key) + "=\"";
  const size_t at = (" " + std::string(attrs)).find(k);
  if (at == std::string::npos) return "";
  const size_t from = at + k.size() - 1;
  const size_t to = attrs.find('"', from);
  std::string v(
      attrs.substr(from, to == std::string_view::npos ? std::string_view::npos : to - from));
  for (auto [esc, ch] : {std::pair{"&quot;", "\""}, std::pair{"&amp;", "&"}})
    for (size_t i; (i = v.find(esc)) != std::string::npos;) v.replace(i, std::strlen(esc), ch);
  return v;
}

// The string a template sets a variable to ({%- set NAME = '...' %}); none: empty.
std::string template_string(std::string_view src, std::string_view name) {
  const std::string key = "set " + std::string(name) + " = ";
  const size_t at = src.find(key);
  if (at == std::string_view::npos || at + key.size() >= src.size()) return "";
  const char q = src[at + key.size()];
  const size_t from = at + key.size() + 1, to = src.find(q, from);
  if ((q != '\'' && q != '"') || to == std::string_view::npos) return "";
  return std::string(src.substr(from, to - from));
}

enum class Got { Ok, Short, Bad };

// MiniMax-M3 (llama.cpp's common/parsers/minimax-m3.cpp): every marker carries the namespace
// token, an argument is an element named by its key, and objects and arrays are written as nested
// elements (an array's as <item>s), as the template's to_xml() writes them. How a value is read
// follows the parameter's schema, as llama.cpp's parser does (common/json-schema.cpp for which
// schemas are strings, objects, arrays or alternatives).
constexpr std::string_view kM3 = "]<]minimax[>[";

// A schema with its $ref followed into the tool's own parameters (null: none to follow to).
const ordered_json* m3_deref(const ordered_json* s, const ordered_json* root) {
  for (int hops = 0; s && s->is_object() && s->contains("$ref"); ++hops) {
    const auto& ref = (*s)["$ref"];
    if (hops == 16 || !root || !ref.is_string() || ref.get<std::string>().rfind("#/", 0) != 0)
      return nullptr;
    const auto ptr = ordered_json::json_pointer(ref.get<std::string>().substr(1));
    if (!root->contains(ptr)) return nullptr;
    s = &(*root)[ptr];
  }
  return s && s->is_object() ? s : nullptr;
}

bool m3_has_properties(const ordered_json& s) {
  return s.contains("properties") ||
         (s.contains("additionalProperties") && s["additionalProperties"] != true);
}

// What llama.cpp's schema builder reads a schema as, after $ref, oneOf/anyOf and type lists.
enum class M3Kind { Any, AllOf, Const, Object, Array, Tuple, String, Scalar };
M3Kind m3_kind(const ordered_json& s) {
  if (s.contains("const") || s.contains("enum")) return M3Kind::Const;
  const std::string type =
      s.contains("type") && s["type"].is_string() ? s["type"].get<std::string>() : "";
  const bool items = s.contains("items") || s.contains("prefixItems");
  const bool tuple =
      (s.contains("items") ? s["items"] : s.value("prefixItems", ordered_json())).is_array();
  if (type.empty()) {
    if (m3_has_properties(s)) return M3Kind::Object;
    if (s.contains("allOf")) return M3Kind::AllOf;
    if (items) return tuple ? M3Kind::Tuple : M3Kind::Array;
    static const std::vector<std::string> formats = {"date",  "time",  "date-time", "uuid", "uuid1",
                                                     "uuid2", "uuid3", "uuid4",     "uuid5"};
    const bool format = s.contains("format") && s["format"].is_string() &&
                        std::count(formats.begin(), formats.end(), s["format"]) > 0;
    if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") || format)
      return M3Kind::String;
    return M3Kind::Any;
  }
  if (type == "object")
    return !m3_has_properties(s) && s.contains("allOf") ? M3Kind::AllOf : M3Kind::Object;
  if (type == "string") return s.contains("allOf") ? M3Kind::AllOf : M3Kind::String;
  if (type == "array") return tuple ? M3Kind::Tuple : M3Kind::Array;
  return M3Kind::Scalar;
}

// The alternatives of a oneOf/anyOf, or of a list of types (one schema per type); none: empty.
std::vector<ordered_json> m3_alternatives(const ordered_json& s) {
  std::vector<ordered_json> alts;
  const char* key = s.contains("oneOf") ? "oneOf" : s.contains("anyOf") ? "anyOf" : nullptr;
  if (key && s[key].is_array()) {
    for (const auto& a : s[key]) alts.push_back(a);
  } else if (!key && s.contains("type") && s["type"].is_array()) {
    for (const auto& t : s["type"]) {
      ordered_json a = s;
      a["type"] = t;
      alts.push_back(std::move(a));
    }
  }
  return alts;
}

// Whether a value of the schema may be a string (then its text is taken as it is, whatever it
// looks like: llama.cpp's common_chat_schema::may_be_string).
bool m3_may_be_string(const ordered_json* s, const ordered_json* root, int depth = 0) {
  s = m3_deref(s, root);
  if (!s || depth > 32) return false;
  const auto alts = m3_alternatives(*s);
  if (!alts.empty()) {
    for (const auto& a : alts)
      if (m3_may_be_string(&a, root, depth + 1)) return true;
    return false;
  }
  if (s->contains("const")) return (*s)["const"].is_string();
  if (s->contains("enum")) {
    for (const auto& v : (*s)["enum"].is_array() ? (*s)["enum"] : ordered_json::array())
      if (v.is_string()) return true;
    return false;
  }
  switch (m3_kind(*s)) {
    case M3Kind::String:
      return true;
    case M3Kind::AllOf: {
      // Every part must allow a string; a part that constrains nothing does not count.
      bool any = false;
      for (const auto& part : (*s)["allOf"]) {
        const ordered_json* p = m3_deref(&part, root);
        if (p && m3_alternatives(*p).empty() && !p->contains("const") && !p->contains("enum") &&
            m3_kind(*p) == M3Kind::Any)
          continue;
        if (!m3_may_be_string(&part, root, depth + 1)) return false;
        any = true;
      }
      return any;
    }
    default:
      return false;
  }
}

// Reads M3 argument values at a cursor. Typed (by the tool's schema), as llama.cpp's parser
// does: an element the schema does not name, or text that is no JSON where no string may stand,
// does not read (Bad), so that a union's alternatives are chosen as llama.cpp chooses them (its
// order of members and required ones are not checked, and blanks around JSON are let through).
// Untyped, whatever the template can write: nested elements as an object (an array where all are
// <item>s), text as JSON where it parses, else as the string.
struct M3Reader {
  Cur& c;
  const ordered_json* root;  // the tool's parameters ($ref targets)
  bool typed;

  Got fail() const { return c.short_ ? Got::Short : Got::Bad; }

  // The value of an element up to and including its closing tag `close`.
  Got value(const ordered_json* schema, const std::string& close, ordered_json& out, int depth) {
    const ordered_json* s = typed ? m3_deref(schema, root) : nullptr;
    if (depth > 32) return Got::Bad;
    if (s && m3_may_be_string(s, root)) {
      std::string_view v;
      if (!c.until(close, v)) return Got::Short;
      out = std::string(v);
      return Got::Ok;
    }
    if (s) {
      const auto alts = m3_alternatives(*s);
      if (!alts.empty()) {
        // The first alternative that reads (llama.cpp's ordered choice).
        const size_t at = c.p;
        for (const auto& a : alts) {
          c.p = at;
          const Got g = value(&a, close, out, depth + 1);
          if (g != Got::Bad) return g;
        }
        return Got::Bad;
      }
    }
    const M3Kind k = !s                                            ? M3Kind::Any
                     : s->contains("const") || s->contains("enum") ? M3Kind::Const
                                                                   : m3_kind(*s);
    // Nested elements next, or the element's close (an empty value), or text.
    const size_t at = c.p;
    c.ws();
    const std::string lt = std::string(kM3) + "<";
    const bool nested = c.at(lt) && !c.at(close), empty = c.at(close);
    const std::string_view rest = c.s.substr(c.p);
    if (!nested && !empty && rest.size() < close.size() &&
        (lt.compare(0, rest.size(), rest) == 0 || close.compare(0, rest.size(), rest) == 0))
      return Got::Short;  // the text ends where an element or the close may be being written
    c.p = at;
    if (k == M3Kind::Object) {
      if (!nested && !empty) return json_value(close, out, ordered_json::value_t::object);
      const auto props = s->find("properties");
      if (props != s->end() && props->is_object() && !props->empty())
        return members(s, close, out, depth);
      // No properties named: the members as the template writes them (llama.cpp wants JSON).
      M3Reader open{c, root, false};
      return open.members(nullptr, close, out, depth);
    }
    if (k == M3Kind::Array) {
      if (!nested && !empty) return json_value(close, out, ordered_json::value_t::array);
      const char* key = s->contains("items") ? "items" : "prefixItems";
      return elements(s->contains(key) ? &(*s)[key] : nullptr, close, out, depth);
    }
    // Where the schema leaves the shape open, nested elements are read as the template writes
    // them (llama.cpp wants JSON there).
    if (nested && (k == M3Kind::Any || k == M3Kind::Tuple || k == M3Kind::AllOf)) {
      M3Reader open{c, root, false};
      return open.members(nullptr, close, out, depth);
    }
    return json_value(close, out, ordered_json::value_t::discarded);
  }

  // JSON text up to `close` (`want`: the kind of value it must be; discarded: any).
  Got json_value(const std::string& close, ordered_json& out, ordered_json::value_t want) {
    std::string_view v;
    if (!c.until(close, v)) return Got::Short;
    auto j = ordered_json::parse(trim(v), nullptr, false);
    if (j.is_discarded() || (want != ordered_json::value_t::discarded && j.type() != want)) {
      if (typed) return Got::Bad;
      j = std::string(v);
    }
    out = std::move(j);
    return Got::Ok;
  }

  // An object's members up to `close`: <key>value</key> each. Untyped, members all named "item"
  // make an array (where one may stand).
  Got members(const ordered_json* s, const std::string& close, ordered_json& out, int depth,
              bool arrays = true) {
    out = ordered_json::object();
    ordered_json items = ordered_json::array();
    bool all_items = true;
    for (;;) {
      c.ws();
      if (c.lit(close)) break;
      std::string_view key;
      if (!c.lit(std::string(kM3) + "<")) return fail();
      if (!c.until(">", key)) return Got::Short;
      if (key.empty() || key[0] == '/' || has(key, "<")) return Got::Bad;
      const std::string k(key);
      const ordered_json* prop = nullptr;
      if (s) {
        const auto props = s->find("properties");
        if (props == s->end() || !props->is_object() || !props->contains(k)) return Got::Bad;
        prop = &(*props)[k];
      }
      ordered_json v;
      const Got g = value(prop, std::string(kM3) + "</" + k + ">", v, depth + 1);
      if (g == Got::Bad) return g;
      if (!s) {
        all_items = all_items && k == "item";
        items.push_back(v);
      }
      out[k] = std::move(v);
      if (g == Got::Short) return g;
    }
    if (!s && arrays && all_items && !items.empty()) out = std::move(items);
    return Got::Ok;
  }

  // An array's <item>s up to `close`.
  Got elements(const ordered_json* item, const std::string& close, ordered_json& out, int depth) {
    out = ordered_json::array();
    const std::string open = std::string(kM3) + "<item>", end = std::string(kM3) + "</item>";
    for (;;) {
      c.ws();
      if (c.lit(close)) return Got::Ok;
      if (!c.lit(open)) return fail();
      out.push_back(nullptr);
      const Got g = value(item, end, out.back(), depth + 1);
      if (g != Got::Ok) return g;
    }
  }
};

// One call at the cursor (its opening marker already matched for the JSON families).
Got parse_call(const ReplyFormat& f, Cur& c, const ParseOptions& o, ToolCall& call) {
  std::string_view v;
  auto done = [&](Got g) {
    if (g == Got::Short) c.short_ = true;
    return g;
  };
  switch (f.tools) {
    case ToolSyntax::Hermes: {
      if (!c.until("</tool_call>", v)) {
        // The name as soon as it is written.
        const size_t k = v.find("\"name\"");
        if (k != std::string_view::npos) {
          Cur n{v, k + 6};
          n.ws();
          std::string_view name;
          if (n.lit(":") && (n.ws(), n.lit("\"")) && n.until("\"", name)) call.name = name;
        }
        const size_t a = v.find("\"arguments\"");
        if (a != std::string_view::npos) {
          const size_t colon = v.find(':', a);
          if (colon != std::string_view::npos) call.arguments = trim(v.substr(colon + 1));
        }
        return done(Got::Short);
      }
      auto j = ordered_json::parse(trim(v), nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string())
        return Got::Bad;
      call.name = j["name"];
      ordered_json args = j.value("arguments", ordered_json::object());
      if (args.is_string()) args = ordered_json::parse(args.get<std::string>(), nullptr, false);
      if (!args.is_object()) return Got::Bad;
      call.arguments = json_text(args);
      return Got::Ok;
    }
    case ToolSyntax::KimiK2:
    case ToolSyntax::DeepSeekV3: {
      const bool k2 = f.tools == ToolSyntax::KimiK2;
      std::string_view id;
      if (!c.until(k2 ? "<|tool_call_argument_begin|>" : "<｜tool▁sep｜>", id))
        return done(Got::Short);
      id = trim(id);
      if (k2) {  // functions.NAME:INDEX
        if (id.substr(0, 10) == "functions.") id.remove_prefix(10);
        const size_t colon = id.rfind(':');
        if (colon != std::string_view::npos) id = id.substr(0, colon);
      }
      call.name = id;
      if (!c.until(k2 ? "<|tool_call_end|>" : "<｜tool▁call▁end｜>", v)) {
        call.arguments = ltrim(v);
        return done(Got::Short);
      }
      return json_args(v, call.arguments) ? Got::Ok : Got::Bad;
    }
    default:
      break;
  }
  // The XML forms: a name, then key/value pairs.
  const ordered_json* params = nullptr;
  ordered_json args = ordered_json::object();
  // Values of the tag-per-argument forms are taken without the blank lines around them (the
  // templates write one; a grammar may allow a few).
  const bool trim_values = f.tools == ToolSyntax::Qwen3Coder || f.tools == ToolSyntax::Glm ||
                           f.tools == ToolSyntax::KimiK3;
  auto put = [&](std::string_view key, std::string_view value, int is_string) {
    if (trim_values) value = trim(value);
    const std::string k(key);
    args[k] = is_string == 1   ? ordered_json(std::string(value))
              : is_string == 0 ? ordered_json::parse(value, nullptr, false)
                               : typed_value(value, params, k);
    if (args[k].is_discarded()) args[k] = std::string(value);
  };
  auto short_call = [&] {
    call.arguments = json_text(args);
    return done(Got::Short);
  };
  switch (f.tools) {
    case ToolSyntax::Qwen3Coder: {
      c.ws();
      std::string_view name;
      if (!c.lit("<function=")) return c.short_ ? done(Got::Short) : Got::Bad;
      if (!c.until(">", name)) return done(Got::Short);
      call.name = trim(name);
      params = tool_params(o.tools, call.name);
      for (;;) {
        c.ws();
        if (c.lit("</function>")) break;
        std::string_view key;
        if (!c.lit("<parameter=")) return c.short_ ? short_call() : Got::Bad;
        if (!c.until(">", key) || !c.until("</parameter>", v)) return short_call();
        if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
        if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
        put(trim(key), v, -1);
      }
      c.ws();
      c.lit("</tool_call>");  // some models open with <function= alone and close with it anyway
      break;
    }
    case ToolSyntax::Glm:
    case ToolSyntax::Hy3: {
      // The same arguments; Hy3's markers carry the template's suffix and its name ends at
      // <tool_sep:S>, GLM's at a newline or the first tag.
      const bool hy3 = f.tools == ToolSyntax::Hy3;
      auto tag = [&](std::string_view t) {
        return "<" + std::string(t) + (hy3 ? f.tag_suffix : "") + ">";
      };
      const std::string close = tag("/tool_call"), key_open = tag("arg_key"),
                        key_close = tag("/arg_key"), value_open = tag("arg_value"),
                        value_close = tag("/arg_value");
      std::string_view name;
      if (hy3) {
        if (!c.until(tag("tool_sep"), name)) return done(Got::Short);
      } else {
        const std::string_view rest = c.s.substr(c.p);
        const size_t end = std::min({rest.find('\n'), rest.find(key_open), rest.find(close)});
        if (end == std::string_view::npos) return done(Got::Short);
        name = rest.substr(0, end);
        c.p += end;
      }
      call.name = trim(name);
      params = tool_params(o.tools, call.name);
      for (;;) {
        c.ws();
        if (c.lit(close)) break;
        std::string_view key;
        if (!c.lit(key_open)) return c.short_ ? short_call() : Got::Bad;
        if (!c.until(key_close, key)) return short_call();
        c.ws();
        if (!c.lit(value_open)) return c.short_ ? short_call() : Got::Bad;
        if (!c.until(value_close, v)) return short_call();
        put(trim(key), v, -1);
      }
      break;
    }
    case ToolSyntax::DeepSeekDsml: {
      c.ws();
      std::string_view name;
      if (!c.lit("<｜DSML｜invoke name=\"")) return c.short_ ? done(Got::Short) : Got::Bad;
      if (!c.until("\">", name)) return done(Got::Short);
      call.name = name;
      for (;;) {
        c.ws();
        if (c.lit("</｜DSML｜invoke>")) break;
        std::string_view key, str;
        if (!c.lit("<｜DSML｜parameter name=\"")) return c.short_ ? short_call() : Got::Bad;
        if (!c.until("\"", key) || !c.lit(" string=\"") || !c.until("\">", str) ||
            !c.until("</｜DSML｜parameter>", v))
          return short_call();
        put(key, v, str == "true" ? 1 : 0);
      }
      break;
    }
    case ToolSyntax::MiniMax: {
      c.ws();
      std::string_view name;
      if (!c.lit("<invoke name=\"")) return c.short_ ? done(Got::Short) : Got::Bad;
      if (!c.until("\">", name)) return done(Got::Short);
      call.name = name;
      params = tool_params(o.tools, call.name);
      for (;;) {
        c.ws();
        if (c.lit("</invoke>")) break;
        std::string_view key;
        if (!c.lit("<parameter name=\"")) return c.short_ ? short_call() : Got::Bad;
        if (!c.until("\">", key) || !c.until("</parameter>", v)) return short_call();
        put(key, trim(v), -1);  // the grammar lets whitespace around a value, as Qwen3-Coder's
      }
      break;
    }
    case ToolSyntax::MiniMaxM3: {
      const std::string ns(kM3);
      c.ws();
      std::string_view name;
      if (!c.lit(ns + "<invoke name=\"")) return c.short_ ? done(Got::Short) : Got::Bad;
      if (!c.until("\">", name)) return done(Got::Short);
      call.name = name;
      params = tool_params(o.tools, call.name);
      // As llama.cpp reads it where the tool's schema says how; where it does not (or the model
      // strayed from it), as the template writes values.
      const size_t from = c.p;
      Got g = Got::Bad;
      if (params) {
        M3Reader typed{c, params, true};
        g = typed.members(m3_deref(params, params), ns + "</invoke>", args, 0);
      }
      if (g == Got::Bad) {
        c.p = from;
        c.short_ = false;
        M3Reader open{c, params, false};
        g = open.members(nullptr, ns + "</invoke>", args, 0, false);
      }
      if (g == Got::Short) return short_call();
      if (g == Got::Bad) return Got::Bad;
      break;
    }
    case ToolSyntax::KimiK3: {
      std::string_view attrs;
      if (!c.until("<|sep|>", attrs)) return done(Got::Short);
      call.name = attr(attrs, "tool");
      for (;;) {
        c.ws();
        if (c.lit("<|close|>call<|sep|>")) break;
        if (c.lit("<|open|>json")) {
          if (!c.until("<|sep|>", attrs) || !c.until("<|close|>json<|sep|>", v))
            return short_call();
          auto j = ordered_json::parse(v, nullptr, false);
          if (j.is_discarded() || !j.is_object()) return Got::Bad;
          for (auto& [k, x] : j.items()) args[k] = x;
          continue;
        }
        if (!c.lit("<|open|>argument")) return c.short_ ? short_call() : Got::Bad;
        if (!c.until("<|sep|>", attrs) || !c.until("<|close|>argument<|sep|>", v))
          return short_call();
        put(attr(attrs, "key"), v, attr(attrs, "type") == "string" ? 1 : 0);
      }
      break;
    }
    default:
      return Got::Bad;
  }
  call.arguments = json_text(args);
  return Got::Ok;
}

// Where the calls begin (the marker that opens them).
std::vector<std::string> call_openers(const ReplyFormat& f) {
  switch (f.tools) {
    case ToolSyntax::Hermes:
    case ToolSyntax::Glm:
      return {"<tool_call>"};
    case ToolSyntax::Qwen3Coder:
      return {"<tool_call>", "<function="};
    case ToolSyntax::KimiK2:
      return {"<|tool_calls_section_begin|>"};
    case ToolSyntax::KimiK3:
      return {"<|open|>tools<|sep|>"};
    case ToolSyntax::DeepSeekV3:
      return {"<｜tool▁calls▁begin｜>"};
    case ToolSyntax::DeepSeekDsml:
      return {"<｜DSML｜" + f.dsml_block + ">"};
    case ToolSyntax::MiniMax:
      return {"<minimax:tool_call>"};
    case ToolSyntax::MiniMaxM3:
      return {std::string(kM3) + "<tool_call>"};
    case ToolSyntax::Hy3:
      return {"<tool_calls" + f.tag_suffix + ">"};
    default:
      return {};
  }
}

// The calls from the cursor on (the opener is at the cursor). Returns where they end.
void parse_calls(const ReplyFormat& f, Cur& c, const ParseOptions& o, Reply& r) {
  const bool sectioned = f.tools == ToolSyntax::KimiK2 || f.tools == ToolSyntax::KimiK3 ||
                         f.tools == ToolSyntax::DeepSeekV3 || f.tools == ToolSyntax::DeepSeekDsml ||
                         f.tools == ToolSyntax::MiniMax || f.tools == ToolSyntax::MiniMaxM3 ||
                         f.tools == ToolSyntax::Hy3;
  const std::string opener = call_openers(f)[0];
  std::string each, section_end;
  switch (f.tools) {
    case ToolSyntax::KimiK2:
      each = "<|tool_call_begin|>", section_end = "<|tool_calls_section_end|>";
      break;
    case ToolSyntax::KimiK3:
      each = "<|open|>call", section_end = "<|close|>tools<|sep|>";
      break;
    case ToolSyntax::DeepSeekV3:
      each = "<｜tool▁call▁begin｜>", section_end = "<｜tool▁calls▁end｜>";
      break;
    case ToolSyntax::DeepSeekDsml:
      each = "", section_end = "</｜DSML｜" + f.dsml_block + ">";
      break;
    case ToolSyntax::MiniMax:
      each = "", section_end = "</minimax:tool_call>";
      break;
    case ToolSyntax::MiniMaxM3:
      each = "", section_end = std::string(kM3) + "</tool_call>";
      break;
    case ToolSyntax::Hy3:
      each = "<tool_call" + f.tag_suffix + ">", section_end = "</tool_calls" + f.tag_suffix + ">";
      break;
    case ToolSyntax::Qwen3Coder:
      each = "";  // <tool_call> is optional before <function=
      break;
    default:
      each = opener;
  }
  if (sectioned) c.lit(opener);
  for (;;) {
    const size_t start = c.p;
    c.ws();
    if (sectioned && c.lit(section_end)) return;
    if (c.p >= c.s.size() || c.short_) return;
    if (!each.empty() && !c.lit(each)) {
      if (c.short_ || !sectioned) {
        c.p = start;
        return;
      }
      c.p = start;
      return;
    }
    if (f.tools == ToolSyntax::Qwen3Coder) {
      if (c.lit("<tool_call>")) c.ws();
      const std::string_view rest = c.s.substr(c.p), fn = "<function=";
      if (rest.size() < fn.size() && fn.substr(0, rest.size()) == rest) {
        c.short_ = true;  // <function= may be being written
        if (!o.partial) r.bad_at = start;
        return;
      }
      if (!c.at(fn)) {
        c.p = start;
        return;
      }
    }
    ToolCall call;
    const size_t call_start = c.p;
    const Got g = parse_call(f, c, o, call);
    if (g == Got::Bad) {
      // Not a call after all: the text stays the answer's (nothing is dropped).
      r.bad_at = start;
      (void)call_start;
      c.p = c.s.size();
      return;
    }
    call.complete = g == Got::Ok;
    r.calls.push_back(std::move(call));
    if (g == Got::Short) return;
  }
}

// gpt-oss's harmony messages: <|channel|>C[ to=R][ <|constrain|>json]<|message|>BODY<|end|>...
Reply parse_harmony(std::string_view text, const ParseOptions& o) {
  Reply r;
  Cur c{text};
  static const std::vector<std::string_view> kMarkers = {"<|start|>", "<|channel|>", "<|message|>",
                                                         "<|end|>",   "<|call|>",    "<|return|>"};
  while (c.p < text.size()) {
    c.lit("<|start|>");
    const size_t msg = text.find("<|message|>", c.p);
    if (msg == std::string_view::npos) {
      // No message opened: text outside the channels is the answer's; a header still being
      // written shows nothing yet.
      if (!o.partial && text.find("<|channel|>", c.p) == std::string_view::npos)
        r.content += std::string(trim(text.substr(c.p)));
      break;
    }
    std::string_view header = text.substr(c.p, msg - c.p);
    c.p = msg + std::string_view("<|message|>").size();
    std::string recipient;
    const size_t to = header.find("to=");
    if (to != std::string_view::npos) {
      std::string_view rest = header.substr(to + 3);
      rest = rest.substr(0, std::min(rest.find(' '), rest.find('<')));
      recipient = rest;
    }
    const size_t ch = header.find("<|channel|>");
    if (ch != std::string_view::npos) header = header.substr(ch + 11);
    const std::string channel(trim(header.substr(0, std::min(header.find(' '), header.find('<')))));
    std::string_view body;
    size_t end = std::string_view::npos;
    for (auto m : {"<|end|>", "<|call|>", "<|return|>"}) end = std::min(end, text.find(m, c.p));
    const bool closed = end != std::string_view::npos;
    body = text.substr(c.p, closed ? end - c.p : std::string_view::npos);
    c.p = closed ? text.find("|>", end) + 2 : text.size();
    const bool finished = closed || !o.partial;
    if (recipient.substr(0, 10) == "functions.") {
      ToolCall call;
      call.name = recipient.substr(10);
      call.complete = finished && json_args(body, call.arguments);
      if (!call.complete) call.arguments = trim(body);
      r.calls.push_back(std::move(call));
    } else if (channel == "analysis") {
      r.reasoning += std::string(finished ? trim(body) : trim(settled(body, kMarkers, true)));
    } else {
      r.content += std::string(finished ? trim(body) : ltrim(settled(body, kMarkers, true)));
    }
  }
  return r;
}

}  // namespace

ReplyFormat detect_reply_format(std::string_view src) {
  ReplyFormat f;
  auto set = [&](ToolSyntax s, const char* family) {
    f.tools = s;
    f.family = family;
  };
  if (has(src, "<|channel|>")) {
    set(ToolSyntax::Harmony, "gpt-oss");
    f.think_open.clear(), f.think_close.clear();
  } else if (has(src, "<|tool_calls_section_begin|>") && has(src, "<|tool_call_begin|>")) {
    set(ToolSyntax::KimiK2, "kimi-k2");
  } else if (has(src, "<|open|>") && has(src, "<|close|>") && has(src, "<|end_of_msg|>")) {
    set(ToolSyntax::KimiK3, "kimi-k3");
    f.think_open = "<|open|>think<|sep|>", f.think_close = "<|close|>think<|sep|>";
    f.content_open = "<|open|>response<|sep|>", f.content_close = "<|close|>response<|sep|>";
    f.reply_end = "<|close|>message<|sep|>";
  } else if (has(src, kM3) && has(src, "<tool_call>") && has(src, "<invoke name=")) {
    // MiniMax-M3 (checked before the <tool_call> families: its markers carry the namespace).
    set(ToolSyntax::MiniMaxM3, "minimax-m3");
    f.think_open = "<mm:think>", f.think_close = "</mm:think>";
    f.bare_think_close = true;
  } else if (has(src, "dsml_token") && has(src, "DSML") &&
             (has(src, "function_calls") || has(src, "tool_calls"))) {
    set(ToolSyntax::DeepSeekDsml, "deepseek-dsml");
    // V3.2 writes <｜DSML｜function_calls>; V4 <｜DSML｜tool_calls>.
    f.dsml_block = has(src, "'function_calls>") || has(src, "function_calls>\\n") ? "function_calls"
                                                                                  : "tool_calls";
  } else if (has(src, "<minimax:tool_call>") && has(src, "<invoke name=")) {
    set(ToolSyntax::MiniMax, "minimax");
  } else if (has(src, "<tool_calls") && has(src, "<tool_sep") && has(src, "<arg_key")) {
    // Hy3 (tencent-Hy3): its template builds every marker from one suffix it sets (HYTK).
    set(ToolSyntax::Hy3, "hy3");
    f.tag_suffix = template_string(src, "HYTK");
    f.think_open = "<think" + f.tag_suffix + ">", f.think_close = "</think" + f.tag_suffix + ">";
  } else if (has(src, "<｜tool▁calls▁begin｜>")) {
    set(ToolSyntax::DeepSeekV3, "deepseek-v3");
  } else if (has(src, "<tool_call>") && has(src, "<function=") && has(src, "<parameter=")) {
    set(ToolSyntax::Qwen3Coder, "qwen3-coder");
  } else if (has(src, "<tool_call>") && has(src, "<arg_key>") && has(src, "<arg_value>")) {
    set(ToolSyntax::Glm, "glm");
    // Laguna (poolside): GLM's calls in <assistant>..</assistant> turns. Ling 3.0 (Bailing V3):
    // in <role>ASSISTANT</role>..<|role_end|> turns, and a call may begin before </think>.
    if (has(src, "</assistant>")) {
      f.family = "laguna", f.reply_end = "</assistant>";
    } else if (has(src, "<role>ASSISTANT</role>") && has(src, "<|role_end|>")) {
      f.family = "ling3", f.reply_end = "<|role_end|>", f.call_ends_reasoning = true;
    }
  } else if (has(src, "<tool_call>")) {
    set(ToolSyntax::Hermes, "hermes");
  }
  // The <think> block only where the template knows it (Kimi-K3 builds its markers in macros).
  if (f.think_close == "</think>" && !has(src, "</think>"))
    f.think_open.clear(), f.think_close.clear();
  return f;
}

const char* syntax_name(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::None:
      return "none";
    case ToolSyntax::Hermes:
      return "hermes";
    case ToolSyntax::Qwen3Coder:
      return "qwen3-coder";
    case ToolSyntax::Glm:
      return "glm";
    case ToolSyntax::KimiK2:
      return "kimi-k2";
    case ToolSyntax::KimiK3:
      return "kimi-k3";
    case ToolSyntax::DeepSeekV3:
      return "deepseek-v3";
    case ToolSyntax::DeepSeekDsml:
      return "deepseek-dsml";
    case ToolSyntax::MiniMax:
      return "minimax";
    case ToolSyntax::MiniMaxM3:
      return "minimax-m3";
    case ToolSyntax::Hy3:
      return "hy3";
    case ToolSyntax::Harmony:
      return "harmony";
  }
  return "?";
}

bool prompt_opens_reasoning(const ReplyFormat& f, std::string_view prompt) {
  if (f.think_open.empty()) return false;
  const std::string_view p = trim(prompt);
  const std::string_view tail = p.substr(p.size() - std::min(p.size(), f.think_open.size()));
  return tail == f.think_open;
}

Reply parse_reply(const ReplyFormat& f, std::string_view text, const ParseOptions& o) {
  if (f.tools == ToolSyntax::Harmony) return parse_harmony(text, o);
  Reply r;
  // The turn's end closes the reply (the blanks before it are the template's layout).
  if (const size_t end = f.reply_end.empty() ? text.npos : text.find(f.reply_end); end != text.npos)
    text = trim_end(text.substr(0, end));
  std::string_view body = text;
  bool after_reasoning = false;
  // The reasoning block: open at the start of the reply (or left open by the prompt).
  if (!f.think_open.empty()) {
    std::string_view t = ltrim(text);
    bool in = o.starts_in_reasoning;
    if (!in && t.substr(0, f.think_open.size()) == f.think_open) {
      in = true;
      t.remove_prefix(f.think_open.size());
    } else if (!in && f.bare_think_close && t.substr(0, f.think_close.size()) == f.think_close) {
      // No reasoning this turn: the answer follows.
      body = t.substr(f.think_close.size());
      after_reasoning = true;
    } else if (!in && o.partial &&
               ((t.size() < f.think_open.size() && f.think_open.substr(0, t.size()) == t) ||
                (f.bare_think_close && t.size() < f.think_close.size() &&
                 f.think_close.substr(0, t.size()) == t))) {
      return r;  // it may yet open the reasoning block (or say there is none)
    }
    if (in) {
      // The block ends at its close, or (Ling 3.0) where a call begins before it.
      std::vector<std::string> ends = {f.think_close};
      size_t close = t.find(f.think_close), skip = f.think_close.size();
      if (f.call_ends_reasoning && o.calls)
        for (const auto& op : call_openers(f)) {
          ends.push_back(op);
          if (const size_t at = t.find(op); at < close) close = at, skip = 0;
        }
      if (close == std::string_view::npos) {
        r.reasoning =
            trim(settled(t, std::vector<std::string_view>(ends.begin(), ends.end()), o.partial));
        if (!o.partial) r.reasoning = trim(t);
        return r;
      }
      r.reasoning = trim(t.substr(0, close));
      body = t.substr(close + skip);
      after_reasoning = true;
    }
  }
  // The answer after a reasoning block starts at its first non-blank; otherwise it is the
  // model's text as written.
  if (after_reasoning) body = ltrim(body);
  if (!f.content_open.empty()) {
    const std::string_view b = ltrim(body);
    if (b.substr(0, f.content_open.size()) == f.content_open) {
      body = b.substr(f.content_open.size());
    } else if (o.partial && b.size() < f.content_open.size() &&
               f.content_open.substr(0, b.size()) == b) {
      return r;
    }
  }
  const std::vector<std::string> openers = o.calls ? call_openers(f) : std::vector<std::string>{};
  std::vector<std::string_view> markers(openers.begin(), openers.end());
  if (!f.content_close.empty()) markers.push_back(f.content_close);
  if (!f.reply_end.empty()) markers.push_back(f.reply_end);
  size_t at = std::string_view::npos;
  for (auto m : markers) at = std::min(at, body.find(m));
  std::string_view content = body.substr(0, at);
  if (at == std::string_view::npos) {
    r.content = std::string(settled(content, markers, o.partial));
    if (after_reasoning || !f.content_open.empty()) r.content = std::string(ltrim(r.content));
    return r;
  }
  r.content = std::string(content);
  while (!r.content.empty() && is_ws(r.content.back())) r.content.pop_back();
  if (after_reasoning || !f.content_open.empty()) r.content = std::string(ltrim(r.content));
  Cur c{body, at};
  if (!f.content_close.empty() && c.lit(f.content_close)) c.ws();
  bool any = false;
  for (const auto& op : openers) any = any || c.at(op);
  if (any) {
    parse_calls(f, c, o, r);
    if (r.bad_at != std::string_view::npos) {
      const std::string_view rest = trim(body.substr(r.bad_at));
      if (r.calls.empty()) {
        r.content = std::string(after_reasoning || !f.content_open.empty() ? ltrim(body) : body);
      } else {
        r.content += (r.content.empty() ? "" : "\n") + std::string(rest);
      }
      r.bad_at = std::string_view::npos;
      return r;
    }
  } else if (c.p < body.size()) {
    // Text after the answer's close that opens no calls stays the answer's.
    r.content += std::string(settled(body.substr(c.p), markers, o.partial));
    return r;
  }
  // Text after the calls is the answer's too.
  if (c.p < body.size() && !c.short_) {
    std::string_view rest = settled(body.substr(c.p), markers, o.partial);
    if (!trim(rest).empty()) r.content += (r.content.empty() ? "" : "\n") + std::string(trim(rest));
  }
  return r;
}

CallShape call_shape(const ReplyFormat& f, const std::string& name) {
  switch (f.tools) {
    case ToolSyntax::Hermes:
      return {"<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": ", "json",
              "}\n</tool_call>"};
    case ToolSyntax::Qwen3Coder:
      return {"<tool_call>\n<function=" + name + ">\n", "qwen_xml", "</function>\n</tool_call>"};
    case ToolSyntax::Glm:
      return {"<tool_call>" + name + "\n", "glm_xml", "</tool_call>"};
    case ToolSyntax::KimiK2:
      return {"<|tool_calls_section_begin|><|tool_call_begin|>functions." + name +
                  ":0<|tool_call_argument_begin|>",
              "json", "<|tool_call_end|><|tool_calls_section_end|>"};
    case ToolSyntax::KimiK3:
      return {"<|open|>tools<|sep|><|open|>call tool=\"" + name + "\" index=\"1\"<|sep|>",
              "kimi_k3_xml", "<|close|>call<|sep|><|close|>tools<|sep|>"};
    case ToolSyntax::DeepSeekV3:
      return {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>", "json",
              "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"};
    case ToolSyntax::DeepSeekDsml:
      return {"<｜DSML｜" + f.dsml_block + ">\n<｜DSML｜invoke name=\"" + name + "\">\n",
              "deepseek_xml", "</｜DSML｜invoke>\n</｜DSML｜" + f.dsml_block + ">"};
    case ToolSyntax::MiniMax:
      return {"<minimax:tool_call>\n<invoke name=\"" + name + "\">\n", "minimax_xml",
              "</invoke>\n</minimax:tool_call>"};
    case ToolSyntax::MiniMaxM3:
      // xgrammar's own MiniMax-M3 tag (builtin_structural_tag.py): the arguments' elements
      // directly after the invoke's opening, as the template writes them.
      return {
          std::string(kM3) + "<tool_call>\n" + std::string(kM3) + "<invoke name=\"" + name + "\">",
          "minimax_m3_xml", std::string(kM3) + "</invoke>\n" + std::string(kM3) + "</tool_call>"};
    case ToolSyntax::Hy3: {
      // xgrammar has no style for these markers: serve writes the arguments' grammar itself.
      auto tag = [&](std::string_view t) { return "<" + std::string(t) + f.tag_suffix + ">"; };
      CallShape s{tag("tool_calls") + "\n" + tag("tool_call") + name + tag("tool_sep") + "\n", "",
                  tag("/tool_call") + "\n" + tag("/tool_calls")};
      s.key_open = tag("arg_key"), s.key_close = tag("/arg_key");
      s.value_open = tag("arg_value"), s.value_close = tag("/arg_value"), s.blank = "\n";
      return s;
    }
    case ToolSyntax::Harmony:
      return {"<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>",
              "json", "<|call|>"};
    case ToolSyntax::None:
      break;
  }
  return {};
}

}  // namespace expertd::chat
