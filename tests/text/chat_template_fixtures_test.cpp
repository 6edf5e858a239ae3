// Byte-equal renders of real chat templates against python3-jinja2 (set up as transformers
// does), from tests/fixtures/chat_templates/ (made by scripts/make_chat_template_fixtures.py).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "text/chat_template.h"
#include "text/jinja/template.h"

namespace crl::text {
namespace {

using ojson = nlohmann::ordered_json;

const ojson& fixture(const char* file) {
  static std::map<std::string, ojson> cache;
  auto it = cache.find(file);
  if (it == cache.end()) {
    std::ifstream in(std::string(CRL_FIXTURES_DIR) + "/chat_templates/" + file);
    it = cache.emplace(file, ojson::parse(in)).first;
  }
  return it->second;
}

// 2025-01-15 12:00 UTC: the fixtures' strftime_now() date in any time zone within 11 hours.
constexpr std::time_t kFixtureNow = 1736942400;

struct Case {
  std::string template_name;
  std::string case_name;
  size_t index;
};

std::vector<Case> all_cases() {
  std::vector<Case> out;
  const ojson& cases = fixture("expected.json")["cases"];
  for (size_t i = 0; i < cases.size(); ++i) {
    out.push_back(
        {cases[i]["template"].get<std::string>(), cases[i]["case"].get<std::string>(), i});
  }
  return out;
}

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.template_name << " / " << c.case_name << " (expected.json case " << c.index << ")";
}

class ChatTemplateFixtureTest : public ::testing::TestWithParam<Case> {};

TEST_P(ChatTemplateFixtureTest, RendersLikePythonJinja2) {
  const ojson& c = fixture("expected.json")["cases"][GetParam().index];
  ojson config;
  for (const auto& t : fixture("templates.json")) {
    if (t["name"] == c["template"])
      config = {{"chat_template", t["template"]},
                {"bos_token", t["bos_token"]},
                {"eos_token", t["eos_token"]}};
  }
  ASSERT_TRUE(config.is_object()) << "no template " << c["template"];
  const ChatTemplate chat =
      ChatTemplate::from_tokenizer_config(config, c["template"].get<std::string>());
  ASSERT_TRUE(chat.is_jinja());
  const ojson& vars = c["variables"];
  ChatRenderOptions options;
  options.now = kFixtureNow;
  options.add_generation_prompt = vars["add_generation_prompt"].get<bool>();
  options.continue_final_message = vars.value("continue_final_message", false);
  options.content_as_given = true;  // the reference is transformers' apply_chat_template
  if (vars.contains("tools")) options.tools = vars["tools"];
  for (auto it = vars.begin(); it != vars.end(); ++it) {
    if (it.key() != "messages" && it.key() != "tools" && it.key() != "add_generation_prompt" &&
        it.key() != "continue_final_message") {
      options.kwargs[it.key()] = it.value();
    }
  }
  if (c.contains("expected")) {
    EXPECT_EQ(chat.render(vars["messages"], options), c["expected"].get<std::string>());
  } else if (c["error_kind"] == "raise_exception") {
    try {
      chat.render(vars["messages"], options);
      FAIL() << "expected raise_exception(" << c["error"] << ")";
    } catch (const jinja::TemplateError& e) {
      EXPECT_EQ(e.kind(), jinja::TemplateError::Kind::kRaised) << e.what();
      EXPECT_EQ(e.message(), c["error"].get<std::string>());
      EXPECT_GT(e.line(), 0);
    }
  } else {  // Python raised a TypeError / UndefinedError: ours must fail too, with a location
    try {
      chat.render(vars["messages"], options);
      FAIL() << "expected an error like: " << c["error"];
    } catch (const jinja::TemplateError& e) {
      EXPECT_GT(e.line(), 0) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RealTemplates, ChatTemplateFixtureTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.template_name + "_" + info.param.case_name;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

// Content given as lists of text parts reaches each real template in the form vLLM's "auto"
// content format gives it: the list for the templates that loop over a message's content
// (Gemma-3, Llama-3.2-Vision), the parts joined by newlines for the others. Both forms are
// python3-jinja2 renders (scripts/make_chat_template_fixtures.py).
TEST(ChatTemplateFixtureTest, ContentPartsReachEachTemplateInTheFormItTakes) {
  const std::set<std::string> loops_over_content = {"Gemma-3", "Llama-3.2-11B-Vision-Instruct"};
  size_t checked = 0;
  for (const auto& e : fixture("expected.json")["content_parts"]) {
    const std::string name = e["template"].get<std::string>();
    ojson config;
    for (const auto& t : fixture("templates.json")) {
      if (t["name"] == e["template"])
        config = {{"chat_template", t["template"]},
                  {"bos_token", t["bos_token"]},
                  {"eos_token", t["eos_token"]}};
    }
    const ChatTemplate chat = ChatTemplate::from_tokenizer_config(config, name);
    const auto tmpl = jinja::Template::parse(config["chat_template"].get<std::string>(), name);
    const bool as_list = loops_over_content.count(name) > 0;
    EXPECT_EQ(tmpl.iterates_message_content(), as_list) << name;
    const std::string key = as_list ? "as_list" : "joined";
    ChatRenderOptions options;
    options.now = kFixtureNow;
    if (e.contains(key)) {
      EXPECT_EQ(chat.render(e["messages"], options), e[key].get<std::string>()) << name;
      ++checked;
    } else {
      EXPECT_THROW(chat.render(e["messages"], options), jinja::TemplateError)
          << name << ": " << e[key + "_error"];
    }
  }
  EXPECT_GE(checked, 15u);
}

TEST(ChatTemplateFixtureTest, CoversTheTemplatesTheIssueNames) {
  std::map<std::string, int> renders;
  for (const auto& c : fixture("expected.json")["cases"]) {
    if (c.contains("expected")) ++renders[c["template"].get<std::string>()];
  }
  for (const char* name : {"Llama-3.1-8B-Instruct", "Llama-3.2-3B-Instruct", "Qwen2.5-7B-Instruct",
                           "Qwen3", "SmolLM2-Instruct", "Mistral-7B-Instruct-v0.3",
                           "Mistral-Nemo-Instruct-2407", "DeepSeek-R1-Distill-Qwen-32B"}) {
    EXPECT_GE(renders[name], 8) << name;
  }
}

}  // namespace
}  // namespace crl::text
