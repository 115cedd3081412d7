// MiniMax-M3's argument values read by the tool's schema (see reply_cursor.h).
#include <algorithm>
#include <vector>

#include "chat/reply_cursor.h"

namespace expertd::chat::detail {

using nlohmann::ordered_json;

namespace {

// MiniMax-M3 (llama.cpp's common/parsers/minimax-m3.cpp): every marker carries the namespace
// token, an argument is an element named by its key, and objects and arrays are written as nested
// elements (an array's as <item>s), as the template's to_xml() writes them. How a value is read
// follows the parameter's schema, as llama.cpp's parser does (common/json-schema.cpp for which
// schemas are strings, objects, arrays or alternatives).
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

}  // namespace

Got m3_arguments(Cur& c, const ordered_json* params, const std::string& close, ordered_json& args) {
  const size_t from = c.p;
  Got g = Got::Bad;
  if (params) {
    M3Reader typed{c, params, true};
    g = typed.members(m3_deref(params, params), close, args, 0);
  }
  if (g == Got::Bad) {
    c.p = from;
    c.short_ = false;
    M3Reader open{c, params, false};
    g = open.members(nullptr, close, args, 0, false);
  }
  return g;
}

}  // namespace expertd::chat::detail
