// The Jinja renderer against python3-jinja2: llama.cpp's 70 real chat templates
// (tests/data/templates) rendered with ten conversations (system, multi-turn, no generation
// prompt, thinking off, tool calls with null, empty and string arguments, content parts,
// reasoning) must give Jinja2's
// text byte for byte, and fail where Jinja2 fails (expected.json, written by
// scripts/gen-template-cases.py with Debian's python3-jinja2).
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace expertd::test;
using nlohmann::ordered_json;

namespace {

std::string data(const std::string& f) {
  return std::string(EXPERTD_SOURCE_DIR) + "/tests/data/templates/" + f;
}

// The clock the expectations were rendered at: 2026-03-14 15:09:26.
std::time_t fixed_now() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900, tm.tm_mon = 2, tm.tm_mday = 14, tm.tm_hour = 15, tm.tm_min = 9,
  tm.tm_sec = 26;
  return timegm(&tm);
}

expertd::Result<std::string> render(const std::string& src, const ordered_json& ctx) {
  auto t = expertd::jinja::Template::parse(src);
  if (!t) return t.error();
  expertd::jinja::Value c = expertd::jinja::Value::from_json(ctx);
  c.obj().set("bos_token", expertd::jinja::Value("<|bos|>"));
  c.obj().set("eos_token", expertd::jinja::Value("<|eos|>"));
  return t->render(c, {fixed_now()});
}

}  // namespace

TEST(ChatTemplate, SeventyRealTemplatesRenderAsJinja2Does) {
  const auto expected = ordered_json::parse(read_file(data("expected.json")));
  const auto convs = ordered_json::parse(read_file(data("conversations.json")));
  size_t cases = 0, texts = 0, mismatched = 0;
  std::string report;
  for (const auto& [name, per_conv] : expected["cases"].items()) {
    const std::string src = read_file(data(name));
    ASSERT_FALSE(src.empty()) << name;
    for (const auto& conv : convs) {
      const std::string cname = conv["name"];
      const auto& want = per_conv[cname];
      auto got = render(src, conv["context"]);
      ++cases;
      if (want.contains("text")) {
        ++texts;
        if (!got || *got != want["text"].get<std::string>()) {
          ++mismatched;
          if (mismatched <= 12)
            report += name + " / " + cname + ": " +
                      (got ? "text differs:\n--- want\n" + want["text"].get<std::string>() +
                                 "\n--- got\n" + *got + "\n"
                           : "failed: " + got.error().message + "\n");
        }
      } else if (got) {
        ++mismatched;
        if (mismatched <= 12)
          report += name + " / " + cname + ": rendered, but jinja2 failed with " +
                    want["error"].get<std::string>() + "\n";
      }
    }
  }
  EXPECT_EQ(cases, 70u * convs.size());
  EXPECT_GT(texts, cases * 4 / 5);
  EXPECT_EQ(mismatched, 0u) << mismatched << " of " << cases << " cases differ:\n" << report;
}

// The chat layer: variables, tools and a clear error naming a template's raise_exception.
TEST(ChatTemplate, ChatLayerPassesVariablesAndReportsTemplateErrors) {
  auto t = expertd::chat::ChatTemplate::parse(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if tools %}[{{ tools | length }} tools]{% endif %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}{{ flavour | default('plain') }}");
  ASSERT_TRUE(t) << t.error().message;
  expertd::chat::ChatOptions o;
  o.bos_token = "<s>";
  o.tools = ordered_json::array({{{"type", "function"}}});
  o.extra["flavour"] = "spicy";
  auto r = t->render(ordered_json::parse(R"([{"role":"user","content":"hi"}])"), o);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(*r, "<s><user>hi[1 tools]<assistant>spicy");

  auto bad = expertd::chat::ChatTemplate::parse(
      "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}ok");
  ASSERT_TRUE(bad);
  auto e = bad->render(ordered_json::parse(R"([{"role":"system","content":"x"}])"), {});
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("System role not supported"), std::string::npos);
  auto syntax = expertd::chat::ChatTemplate::parse("{% if x %}unclosed");
  ASSERT_FALSE(syntax);
  EXPECT_NE(syntax.error().message.find("endif"), std::string::npos) << syntax.error().message;
  auto unknown = expertd::chat::ChatTemplate::parse("{{ x | no_such_filter }}");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("no_such_filter"), std::string::npos);
}
