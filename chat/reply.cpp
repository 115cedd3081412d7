#include "chat/reply.h"

#include <algorithm>
#include <cstring>

#include "chat/reply_cursor.h"

namespace expertd::chat {

using nlohmann::ordered_json;

namespace {

using namespace detail;

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
      const Got g = m3_arguments(c, params, ns + "</invoke>", args);
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
