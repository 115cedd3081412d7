#include "serve/chat_request.h"

#include <set>

namespace expertd::serve {

using nlohmann::ordered_json;

namespace {

// Runs of whitespace between JSON tokens are capped: a model (a random one above all) may
// otherwise fill its whole budget with blanks between two tokens.
constexpr int kMaxWhitespace = 2;

// The JSON-schema keywords xgrammar's schema converter enforces or may ignore safely
// (annotations); anything else would be silently unchecked, so it is refused.
const std::set<std::string>& known_keywords() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "items",
                                          "prefixItems",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "$defs",
                                          "definitions",
                                          "additionalProperties",
                                          "minItems",
                                          "maxItems",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "multipleOf",
                                          "minProperties",
                                          "maxProperties",
                                          "patternProperties",
                                          "propertyNames",
                                          "unevaluatedProperties",
                                          "unevaluatedItems",
                                          "title",
                                          "description",
                                          "default",
                                          "examples",
                                          "$schema",
                                          "$id",
                                          "$comment",
                                          "deprecated",
                                          "readOnly",
                                          "writeOnly",
                                          "strict",
                                          "nullable"};
  return k;
}

void walk_schema(const ordered_json& s, const std::string& where) {
  if (s.is_boolean()) return;
  if (!s.is_object()) throw bad_request(where + " must be a JSON schema (an object)");
  for (const auto& [k, v] : s.items()) {
    if (!known_keywords().count(k))
      throw bad_request(where + ": JSON-schema keyword '" + k +
                        "' is not supported by constrained decoding");
    const std::string at = where + "." + k;
    if (k == "properties" || k == "$defs" || k == "definitions" || k == "patternProperties") {
      if (!v.is_object()) throw bad_request(at + " must be an object");
      for (const auto& [name, sub] : v.items()) walk_schema(sub, at + "." + name);
    } else if (k == "items" || k == "additionalProperties" || k == "propertyNames" ||
               k == "unevaluatedProperties" || k == "unevaluatedItems") {
      walk_schema(v, at);
    } else if (k == "anyOf" || k == "oneOf" || k == "allOf" || k == "prefixItems") {
      if (!v.is_array()) throw bad_request(at + " must be an array of schemas");
      for (size_t i = 0; i < v.size(); ++i) walk_schema(v[i], at + "[" + std::to_string(i) + "]");
    } else if (k == "required" && !v.is_array()) {
      throw bad_request(at + " must be an array of property names");
    }
  }
}

const ordered_json* find_tool(const ordered_json& tools, const std::string& name) {
  for (const auto& t : tools)
    if (t["function"]["name"] == name) return &t;
  return nullptr;
}

ordered_json literal(const std::string& s) {
  return {{"type", "const_string"}, {"value", s}};
}

// Whether the template writes a value of this schema as it is: a string and nothing else.
bool string_only(const ordered_json& s) {
  if (!s.is_object()) return false;
  auto all_strings = [](const ordered_json& vs) {
    if (!vs.is_array() || vs.empty()) return false;
    for (const auto& v : vs)
      if (!v.is_string() || v.get<std::string>().empty()) return false;
    return true;
  };
  if (s.contains("const")) return s["const"].is_string() && !s["const"].get<std::string>().empty();
  if (s.contains("enum")) return all_strings(s["enum"]);
  if (s.contains("anyOf") || s.contains("oneOf") || s.contains("allOf") || s.contains("$ref"))
    return false;
  const auto t = s.value("type", ordered_json());
  return t == "string" || (t.is_array() && t.size() == 1 && t[0] == "string");
}

// One argument where xgrammar has no style for the family's markers: the key's element, then
// the value's, which holds a string as it is (its const, enum, pattern or maxLength kept; a
// minLength or format is not) and anything else as JSON valid against the property's schema
// (the tool's definitions beside it, for its $refs).
ordered_json xml_argument(const chat::CallShape& shape, const std::string& key,
                          const ordered_json& s, const ordered_json& root) {
  ordered_json value;
  if (string_only(s)) {
    if (s.contains("const") || s.contains("enum")) {
      ordered_json alts = ordered_json::array();
      for (const auto& v : s.contains("const") ? ordered_json::array({s["const"]}) : s["enum"])
        alts.push_back(literal(v.get<std::string>()));
      value = alts.size() == 1 ? alts[0] : ordered_json{{"type", "or"}, {"elements", alts}};
    } else if (s.contains("pattern") && s["pattern"].is_string()) {
      value = {{"type", "regex"}, {"pattern", s["pattern"]}};
    } else {
      value = {{"type", "any_text"}};
      if (s.contains("maxLength") && s["maxLength"].is_number_unsigned())
        value["max_chars"] = s["maxLength"];
    }
  } else {
    ordered_json sub = s.is_object() ? s : ordered_json::object();
    for (const char* defs : {"$defs", "definitions"})
      if (root.contains(defs) && !sub.contains(defs)) sub[defs] = root[defs];
    value = {{"type", "json_schema"},
             {"json_schema", s.is_boolean() ? s : sub},
             {"max_whitespace_cnt", kMaxWhitespace}};
  }
  ordered_json parts = ordered_json::array();
  parts.push_back(literal(shape.key_open + key + shape.key_close + shape.blank));
  parts.push_back({{"type", "tag"},
                   {"begin", shape.value_open},
                   {"content", value},
                   {"end", shape.value_close}});
  if (!shape.blank.empty()) parts.push_back(literal(shape.blank));
  return {{"type", "sequence"}, {"elements", parts}};
}

// A whole call where xgrammar has no style for the arguments: the properties in the schema's
// order, each required one present, the others optional (none others: the schema compiler's
// strict mode); with no properties named, any keys and text values unless the schema forbids
// additional ones.
ordered_json xml_call(const chat::CallShape& shape, const ordered_json& schema) {
  ordered_json parts = ordered_json::array({literal(shape.begin)});
  const auto props = schema.value("properties", ordered_json::object());
  std::set<std::string> required;
  for (const auto& r : schema.value("required", ordered_json::array()))
    if (r.is_string()) required.insert(r.get<std::string>());
  for (const auto& [key, sub] : props.items()) {
    ordered_json arg = xml_argument(shape, key, sub, schema);
    if (!required.count(key)) arg = {{"type", "optional"}, {"content", arg}};
    parts.push_back(std::move(arg));
  }
  if (props.empty() && schema.value("additionalProperties", ordered_json(true)) != false) {
    auto text = [&](const std::string& open, const std::string& close) {
      return ordered_json{
          {"type", "tag"}, {"begin", open}, {"content", {{"type", "any_text"}}}, {"end", close}};
    };
    ordered_json pair = ordered_json::array(
        {text(shape.key_open, shape.key_close), text(shape.value_open, shape.value_close)});
    if (!shape.blank.empty()) {
      pair.insert(pair.begin() + 1, literal(shape.blank));
      pair.push_back(literal(shape.blank));
    }
    parts.push_back({{"type", "star"}, {"content", {{"type", "sequence"}, {"elements", pair}}}});
  }
  parts.push_back(literal(shape.end));
  return {{"type", "sequence"}, {"elements", parts}};
}

ordered_json tag_for(const chat::ReplyFormat& f, const ordered_json& tool) {
  const auto shape = chat::call_shape(f, tool["function"]["name"]);
  ordered_json schema = tool["function"].value("parameters", ordered_json());
  if (schema.is_null()) schema = {{"type", "object"}};
  if (shape.style.empty()) return xml_call(shape, schema);
  return {{"type", "tag"},
          {"begin", shape.begin},
          {"content",
           {{"type", "json_schema"},
            {"json_schema", schema},
            {"style", shape.style},
            {"max_whitespace_cnt", kMaxWhitespace}}},
          {"end", shape.end}};
}

std::string dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

GrammarSpec tagged(const ordered_json& format, const std::string& prefix) {
  ordered_json f = format;
  if (!prefix.empty())
    f = {
        {"type", "sequence"},
        {"elements", ordered_json::array({{{"type", "const_string"}, {"value", prefix}}, format})}};
  return {GrammarSpec::Kind::StructuralTag, dump({{"type", "structural_tag"}, {"format", f}})};
}

}  // namespace

void check_schema(const ordered_json& schema, const std::string& where) {
  walk_schema(schema, where);
}

ordered_json check_tools(const ordered_json& tools, const std::string& field) {
  if (!tools.is_array()) throw bad_request(field + " must be an array of tools");
  ordered_json out = ordered_json::array();
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    const auto& t = tools[i];
    if (!t.is_object()) throw bad_request(at + " must be an object");
    if (t.value("type", "function") != "function")
      throw bad_request(at + ".type: only \"function\" tools are supported");
    if (!t.contains("function") || !t["function"].is_object())
      throw bad_request(at + ".function is required (an object)");
    const auto& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
      throw bad_request(at + ".function.name is required (a non-empty string)");
    const std::string name = fn["name"];
    for (char ch : name)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.'))
        throw bad_request(at + ".function.name: '" + name +
                          "' may hold only letters, digits, '_', '-' and '.'");
    if (!names.insert(name).second) throw bad_request(at + ".function.name: '" + name + "' twice");
    if (fn.contains("parameters") && !fn["parameters"].is_null()) {
      if (!fn["parameters"].is_object())
        throw bad_request(at + ".function.parameters must be a JSON schema object");
      check_schema(fn["parameters"], at + ".function.parameters");
    }
    ordered_json n = {{"type", "function"}, {"function", fn}};
    out.push_back(std::move(n));
  }
  return out;
}

ordered_json anthropic_tools(const ordered_json& tools) {
  if (!tools.is_array()) throw bad_request("tools must be an array of tools");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const auto& t = tools[i];
    if (!t.is_object()) throw bad_request(at + " must be an object");
    if (t.contains("type") && t["type"] != "custom" && !t["type"].is_null())
      throw bad_request(at + ".type: only client tools (name, input_schema) are supported");
    if (!t.contains("name") || !t["name"].is_string())
      throw bad_request(at + ".name is required (a string)");
    if (!t.contains("input_schema") || !t["input_schema"].is_object())
      throw bad_request(at + ".input_schema is required (a JSON schema object)");
    ordered_json fn = {{"name", t["name"]}};
    if (t.contains("description")) fn["description"] = t["description"];
    fn["parameters"] = t["input_schema"];
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  // The same checks, with Anthropic's field names.
  try {
    return check_tools(out, "tools");
  } catch (HttpError& e) {
    for (auto [from, to] :
         {std::pair{".function.parameters", ".input_schema"}, std::pair{".function.name", ".name"}})
      for (size_t p; (p = e.message.find(from)) != std::string::npos;)
        e.message.replace(p, std::string(from).size(), to);
    throw;
  }
}

ToolChoice openai_tool_choice(const ordered_json& c, const ordered_json& tools) {
  ToolChoice t;
  if (c.is_null()) return t;
  if (c.is_string()) {
    const std::string s = c;
    if (s == "auto") return t;
    if (s == "none") return {ToolChoice::Mode::None, ""};
    if (s == "required") {
      if (tools.empty()) throw bad_request("tool_choice \"required\" needs tools");
      return {ToolChoice::Mode::Required, ""};
    }
    throw bad_request("tool_choice must be \"auto\", \"none\", \"required\" or a named function");
  }
  if (!c.is_object() || c.value("type", "") != "function" || !c.contains("function") ||
      !c["function"].is_object() || !c["function"].contains("name") ||
      !c["function"]["name"].is_string())
    throw bad_request(
        "tool_choice: a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}");
  const std::string name = c["function"]["name"];
  if (!find_tool(tools, name))
    throw bad_request("tool_choice names the function '" + name + "', which is not in tools");
  return {ToolChoice::Mode::Named, name};
}

ToolChoice anthropic_tool_choice(const ordered_json& c, const ordered_json& tools) {
  if (c.is_null()) return {};
  if (!c.is_object() || !c.contains("type") || !c["type"].is_string())
    throw bad_request("tool_choice must be an object with a type (auto, any, tool, none)");
  const std::string type = c["type"];
  if (type == "auto") return {};
  if (type == "none") return {ToolChoice::Mode::None, ""};
  if (type == "any") {
    if (tools.empty()) throw bad_request("tool_choice {\"type\": \"any\"} needs tools");
    return {ToolChoice::Mode::Required, ""};
  }
  if (type == "tool") {
    if (!c.contains("name") || !c["name"].is_string())
      throw bad_request("tool_choice {\"type\": \"tool\"} needs a name");
    const std::string name = c["name"];
    if (!find_tool(tools, name))
      throw bad_request("tool_choice names the tool '" + name + "', which is not in tools");
    return {ToolChoice::Mode::Named, name};
  }
  throw bad_request("tool_choice.type must be auto, any, tool or none");
}

std::string reply_prefix(const chat::ReplyFormat& f, bool in_reasoning) {
  std::string p;
  if (f.bare_think_close) {
    // MiniMax-M3's template closes the block with the answer right after it, and begins a turn
    // without reasoning with the close alone.
    p += f.think_close;
  } else if (in_reasoning) {
    p += f.think_close + (f.content_open.empty() ? "\n\n" : f.content_open);
  }
  return p + f.content_close;
}

GrammarSpec call_grammar(const chat::ReplyFormat& f, const ordered_json& tools, const ToolChoice& c,
                         const std::string& prefix) {
  ordered_json alts = ordered_json::array();
  for (const auto& t : tools)
    if (c.mode == ToolChoice::Mode::Required || t["function"]["name"] == c.name)
      alts.push_back(tag_for(f, t));
  const ordered_json format =
      alts.size() == 1 ? alts[0] : ordered_json{{"type", "or"}, {"elements", alts}};
  return tagged(format, prefix);
}

GrammarSpec json_grammar(const ordered_json* schema, const std::string& prefix) {
  const ordered_json s = schema ? *schema : ordered_json{{"type", "object"}};
  if (prefix.empty()) return {GrammarSpec::Kind::JsonSchema, dump(s)};
  return tagged(
      {{"type", "json_schema"}, {"json_schema", s}, {"max_whitespace_cnt", kMaxWhitespace}},
      prefix);
}

ReplyDelta ReplyTracker::update(std::string_view text, bool final) {
  ReplyDelta d;
  if (!f_) {
    last_.content = std::string(text);
  } else {
    chat::ParseOptions o = o_;
    o.partial = !final;
    last_ = chat::parse_reply(*f_, text, o);
  }
  if (last_.reasoning.size() > sent_reasoning_) {
    d.reasoning = last_.reasoning.substr(sent_reasoning_);
    sent_reasoning_ = last_.reasoning.size();
  }
  if (last_.content.size() > sent_content_) {
    d.content = last_.content.substr(sent_content_);
    sent_content_ = last_.content.size();
  }
  const int n = int(last_.calls.size());
  for (int i = started_; i < n; ++i) {
    if (last_.calls[size_t(i)].name.empty() && !final) break;
    d.calls.push_back({i, true, last_.calls[size_t(i)].name, ""});
    started_ = i + 1;
  }
  for (int i = argued_; i < started_; ++i) {
    const auto& c = last_.calls[size_t(i)];
    if (!c.complete && !final) break;
    d.calls.push_back({i, false, c.name, c.arguments});
    argued_ = i + 1;
  }
  return d;
}

}  // namespace expertd::serve
