#include <gtest/gtest.h>

#include <fstream>

#include "server/api_types.h"
#include "server/chat_template.h"
#include "tests/test_utils.h"

namespace crl::server {
namespace {

const std::vector<ChatMessage> kChat = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"},
                                        {"user", "2+2?"}};

TEST(ServerChatTemplateTest, RecognisesFamiliesByPattern) {
  // Excerpts of the real templates are enough: detection looks for the family's markers.
  auto qwen = ChatTemplate::detect(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}");
  EXPECT_EQ(qwen.format(), ChatFormat::kChatML);
  EXPECT_EQ(qwen.render({{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(qwen.render(kChat),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");

  auto llama3 = ChatTemplate::detect("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}");
  EXPECT_EQ(llama3.format(), ChatFormat::kLlama3);
  EXPECT_EQ(llama3.render({{"user", " Hi "}}),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  auto llama2 = ChatTemplate::detect("{{ bos_token + '[INST] ' + '<<SYS>>\\n' + content }}");
  EXPECT_EQ(llama2.format(), ChatFormat::kLlama2);
  EXPECT_EQ(llama2.render(kChat),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] 2+2? [/INST]");

  auto mistral = ChatTemplate::detect("{{ '[INST] ' + message['content'] + ' [/INST]' }}");
  EXPECT_EQ(mistral.format(), ChatFormat::kMistral);
  EXPECT_EQ(mistral.render(kChat), "[INST] Be brief.\n\nHi [/INST]Hello</s>[INST] 2+2? [/INST]");

  auto plain = ChatTemplate::detect("{{ something else }}");
  EXPECT_EQ(plain.format(), ChatFormat::kPlain);
  EXPECT_EQ(plain.render(kChat), "System: Be brief.\nUser: Hi\nAssistant: Hello\nUser: 2+2?\nAssistant:");
  EXPECT_THROW(plain.render({{"wizard", "x"}}), std::invalid_argument);
  EXPECT_THROW(plain.render({}), std::invalid_argument);
}

TEST(ServerChatTemplateTest, ReadsTokenizerConfigIncludingNamedTemplates) {
  test::TempDir dir;
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path()).format(), ChatFormat::kPlain);
  std::ofstream(dir.file("tokenizer_config.json"))
      << R"({"chat_template": [{"name": "tool_use", "template": "[INST]"},
                               {"name": "default", "template": "<|im_start|>"}]})";
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path()).format(), ChatFormat::kChatML);
  std::ofstream(dir.file("tokenizer_config.json")) << "{not json";
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path()).format(), ChatFormat::kPlain);
}

TEST(ServerApiTypesTest, ParsesPromptFormsAndRejectsWrongTypes) {
  ApiLimits limits;
  ChatTemplate chat;
  auto parse = [&](const char* body) {
    return parse_completion_request(nlohmann::json::parse(body), Endpoint::kCompletions, limits, chat);
  };
  EXPECT_EQ(parse(R"({"prompt": "a"})").prompts.size(), 1u);
  EXPECT_EQ(parse(R"({"prompt": ["a", "b"]})").prompts.size(), 2u);
  auto ids = parse(R"({"prompt": [1, 2, 3]})");
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_FALSE(ids.prompts[0].is_text);
  EXPECT_EQ(parse(R"({"prompt": [[1], [2, 3]]})").prompts.size(), 2u);
  auto full = parse(R"({"prompt": "a", "n": 3, "max_tokens": 7, "temperature": 0.5, "top_k": -1,
                        "seed": 9, "stop": "x", "logprobs": 2, "stream": true,
                        "stream_options": {"include_usage": true}, "return_token_ids": true})");
  EXPECT_EQ(full.params.n, 3);
  EXPECT_EQ(full.params.max_tokens, 7);
  EXPECT_EQ(full.params.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*full.params.seed, 9u);
  EXPECT_EQ(full.params.logprobs, 2);
  EXPECT_TRUE(full.stream && full.include_usage && full.return_token_ids && full.logprobs);
  try {
    parse(R"({"prompt": "a", "top_p": "high"})");
    FAIL() << "expected ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "top_p");
  }
  EXPECT_EQ(param_from_message("invalid sampling parameter 'min_p': 2 (must be in [0, 1])"), "min_p");
}

TEST(ServerApiTypesTest, ModelSamplingDefaultsApplyOnlyWhereTheRequestGivesNone) {
  ApiLimits limits;
  limits.default_temperature = 0.6;  // as a generation_config.json sets them
  limits.default_top_p = 0.95;
  limits.default_top_k = 20;
  ChatTemplate chat;
  auto parse = [&](const char* body) {
    return parse_completion_request(nlohmann::json::parse(body), Endpoint::kCompletions, limits, chat);
  };
  auto d = parse(R"({"prompt": "a"})").params;
  EXPECT_DOUBLE_EQ(d.temperature, 0.6);
  EXPECT_DOUBLE_EQ(d.top_p, 0.95);
  EXPECT_EQ(d.top_k, 20);
  auto own = parse(R"({"prompt": "a", "temperature": 0, "top_p": 1, "top_k": 0})").params;
  EXPECT_DOUBLE_EQ(own.temperature, 0.0);
  EXPECT_DOUBLE_EQ(own.top_p, 1.0);
  EXPECT_EQ(own.top_k, 0);
}

}  // namespace
}  // namespace crl::server
