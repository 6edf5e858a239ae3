#include "text/builtin_chat_template.h"

#include <gtest/gtest.h>

namespace crl::text {
namespace {

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "2+2?"}};

TEST(BuiltinChatTemplateTest, RecognisesFamiliesByPattern) {
  // Excerpts of the real templates are enough: detection looks for the family's markers.
  auto qwen = BuiltinChatTemplate::detect(
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

  auto llama3 = BuiltinChatTemplate::detect(
      "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}");
  EXPECT_EQ(llama3.format(), ChatFormat::kLlama3);
  EXPECT_EQ(llama3.render({{"user", " Hi "}}),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  auto llama2 = BuiltinChatTemplate::detect("{{ bos_token + '[INST] ' + '<<SYS>>\\n' + content }}");
  EXPECT_EQ(llama2.format(), ChatFormat::kLlama2);
  EXPECT_EQ(llama2.render(kChat),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] 2+2? [/INST]");

  auto mistral = BuiltinChatTemplate::detect("{{ '[INST] ' + message['content'] + ' [/INST]' }}");
  EXPECT_EQ(mistral.format(), ChatFormat::kMistral);
  EXPECT_EQ(mistral.render(kChat), "[INST] Be brief.\n\nHi [/INST]Hello</s>[INST] 2+2? [/INST]");

  auto plain = BuiltinChatTemplate::detect("{{ something else }}");
  EXPECT_EQ(plain.format(), ChatFormat::kPlain);
  EXPECT_EQ(plain.render(kChat),
            "System: Be brief.\nUser: Hi\nAssistant: Hello\nUser: 2+2?\nAssistant:");
  EXPECT_THROW(plain.render({{"wizard", "x"}}), std::invalid_argument);
  EXPECT_THROW(plain.render({}), std::invalid_argument);
}

TEST(BuiltinChatTemplateTest, WithoutAGenerationPromptTheAssistantsTurnStaysClosed) {
  const std::vector<ChatMessage> replied = {{"user", "Hi"}, {"assistant", "Hello"}};
  BuiltinChatTemplate plain;
  EXPECT_EQ(plain.render(replied, false), "User: Hi\nAssistant: Hello\n");
  auto chatml = BuiltinChatTemplate::detect("{{'<|im_start|>' + message['role'] + '\n'}}");
  EXPECT_EQ(chatml.render(replied, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n");
  auto llama3 = BuiltinChatTemplate::detect("{{ '<|start_header_id|>' + message['role'] }}");
  EXPECT_EQ(llama3.render(replied, false),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>");
  // Each render of a longer conversation starts with the shorter one's: multi-turn sessions
  // (ChatTrajectory) append to it.
  std::vector<ChatMessage> longer = replied;
  longer.push_back({"user", "2+2?"});
  for (const auto& t : {plain, chatml, llama3}) {
    const std::string a = t.render(longer), h = t.render(replied, false);
    EXPECT_EQ(a.compare(0, h.size(), h), 0) << t.name();
  }
}

}  // namespace
}  // namespace crl::text
