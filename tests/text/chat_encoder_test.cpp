#include "text/chat_encoder.h"

#include <gtest/gtest.h>

#include "tests/engine/test_model.h"
#include "text/tokenizer.h"

namespace crl::text {
namespace {

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(ChatEncoderTest, SpecialPiecesWrittenAsTextBecomeTheirIds) {
  const text::Tokenizer tok(test::test_model_dir("llama") + "/tokenizer.model");
  ASSERT_GE(tok.bos_id(), 0);
  ASSERT_GE(tok.eos_id(), 0);
  const ChatEncoder enc(tok);
  EXPECT_EQ(
      enc.encode("<s>user: hi</s>assistant: ho"),
      concat(
          {{tok.bos_id()}, tok.encode("user: hi"), {tok.eos_id()}, tok.encode("assistant: ho")}));
  // Adjacent specials, one at the end, and a <tag> that is no special piece stays text.
  EXPECT_EQ(enc.encode("<s></s>a <b> c</s>"),
            concat({{tok.bos_id(), tok.eos_id()}, tok.encode("a <b> c"), {tok.eos_id()}}));
  EXPECT_EQ(enc.encode(""), std::vector<int32_t>());
}

TEST(ChatEncoderTest, PrefixComesFirst) {
  const text::Tokenizer tok(test::test_model_dir("llama") + "/tokenizer.model");
  const ChatEncoder enc(tok, {tok.bos_id()});
  EXPECT_EQ(enc.encode("x</s>"), concat({{tok.bos_id()}, tok.encode("x"), {tok.eos_id()}}));
}

}  // namespace
}  // namespace crl::text
