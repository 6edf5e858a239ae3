// ChatTrajectory against a from-scratch render + encode of the same conversation, with real chat
// templates (tests/fixtures/chat_templates) and the real tokenizers of their model families.
#include "text/chat_trajectory.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>

#include "tests/test_utils.h"
#include "text/tokenizer.h"

namespace crl::text {
namespace {

using ojson = nlohmann::ordered_json;

// 2025-01-15 12:00 UTC, as the template fixtures: templates that print today's date agree.
constexpr std::time_t kNow = 1736942400;

const ojson& templates() {
  static const ojson t = [] {
    std::ifstream in(std::string(CRL_FIXTURES_DIR) + "/chat_templates/templates.json");
    return ojson::parse(in);
  }();
  return t;
}

ChatTemplate load_template(const std::string& name) {
  for (const auto& t : templates()) {
    if (t["name"] == name) {
      ojson config = {{"chat_template", t["template"]},
                      {"bos_token", t["bos_token"]},
                      {"eos_token", t["eos_token"]}};
      return ChatTemplate::from_tokenizer_config(config, name);
    }
  }
  throw std::runtime_error("no template " + name);
}

const text::Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<text::Tokenizer>> cache;
  auto& t = cache[name];
  if (!t) {
    if (!test::tokenizer_fixtures_error().empty())
      throw std::runtime_error(test::tokenizer_fixtures_error());
    t = std::make_unique<text::Tokenizer>(test::tokenizer_fixtures_dir() + "/" + name +
                                          "/tokenizer.json");
  }
  return *t;
}

ChatRenderOptions options_with_now() {
  ChatRenderOptions o;
  o.now = kNow;
  return o;
}

const char* const kCalcTool = R"([{"type": "function", "function": {"name": "calc",
  "description": "Evaluates an arithmetic expression.", "parameters": {"type": "object",
  "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}])";

struct Pair {
  const char* chat_template;
  const char* tokenizer;
  bool tools;              // the template knows tool calls and the tool role
  bool prefix_preserving;  // as probe_prefix_preserving must find
};

// Each template with the tokenizer of its family (chatml templates share Qwen's).
const Pair kPairs[] = {
    {"Qwen2.5-7B-Instruct", "qwen3", true, true},
    {"SmolLM2-Instruct", "qwen3", false, true},
    {"Hermes-2-Pro-Llama-3-8B", "qwen3", true, true},
    {"Llama-3.1-8B-Instruct", "llama3_1", true, true},
    {"Gemma-3", "gemma3", false, true},
    {"DeepSeek-V3", "deepseek_v3", false, true},
    {"Mistral-7B-Instruct-v0.1", "llama2", false, true},
    {"Qwen3", "qwen3", true, false},
    // Drops the reasoning of every reply, the last included, so a later turn never rewrites an
    // earlier one: the session keeps the sampled reasoning (README, multi-turn sessions).
    {"DeepSeek-R1", "deepseek_v3", false, true},
};

void PrintTo(const Pair& p, std::ostream* os) { *os << p.chat_template << " + " << p.tokenizer; }

// Random text: words, digits, punctuation, non-ASCII, inner newlines and spaces.
std::string random_text(std::mt19937& rng) {
  static const char* kWords[] = {
      "the",       "tool",  "answer", "is",         "42",         "3.14",     "x",    "(a+b)",
      "naïve",     "über",  "日本語", "emoji 🙂", "{\"k\": 1}", "  spaced", "end.", "line\nbreak",
      "tab\there", "<tag>", "A",      "Zürich",     "-7",         "why?"};
  std::uniform_int_distribution<int> len(1, 12), pick(0, std::size(kWords) - 1);
  std::string s;
  for (int i = 0, n = len(rng); i < n; ++i) {
    if (i) s += ' ';
    s += kWords[pick(rng)];
  }
  return s;
}

// The reply a model that samples the template's own tokenization would give: the ids of the
// render with the reply closed, after the prompt, through the first special token (the stop).
// nullopt where the encoding of the whole merges the prompt's last token with the reply's first
// ("[/INST]" + "<tag>" -> "]<"): no model sampling after the prompt's ids could give those ids,
// which is why a session keeps the ids it has instead of re-encoding.
std::optional<std::vector<int32_t>> simulated_reply(const ChatTemplate& chat,
                                                    const text::Tokenizer& tok,
                                                    const ChatRenderOptions& options,
                                                    const ojson& messages, const ojson& reply,
                                                    const std::vector<int32_t>& prompt,
                                                    bool rewrites = false) {
  ojson with = messages;
  with.push_back(reply);
  ChatRenderOptions o = options;
  o.add_generation_prompt = false;
  const std::string whole = chat.render(with, o);
  std::vector<int32_t> full = ChatEncoder(tok).encode(whole);
  size_t from = prompt.size();
  if (full.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), full.begin())) {
    // A session that keeps earlier replies the template drops (Qwen3's reasoning) is no prefix
    // of the fresh render: the reply is then the text the template writes for it, encoded.
    ChatRenderOptions gen = options;
    gen.add_generation_prompt = true;
    const std::string before = chat.render(messages, gen);
    if (!rewrites || whole.compare(0, before.size(), before) != 0) return std::nullopt;
    full = ChatEncoder(tok).encode(whole.substr(before.size()));
    from = 0;
  }
  std::vector<int32_t> out;
  for (size_t i = from; i < full.size(); ++i) {
    out.push_back(full[i]);
    if (tok.is_special(full[i])) return out;
  }
  ADD_FAILURE() << "the template closes a reply with no special token";
  return out;
}

class ChatTrajectoryRealTest : public ::testing::TestWithParam<Pair> {};

TEST_P(ChatTrajectoryRealTest, ProbeFindsWhetherTheTemplateIsPrefixPreserving) {
  const Pair& p = GetParam();
  const ChatTemplate chat = load_template(p.chat_template);
  ChatRenderOptions options = options_with_now();
  if (p.tools) options.tools = ojson::parse(kCalcTool);
  const auto why = probe_prefix_preserving(chat, options);
  EXPECT_EQ(!why.has_value(), p.prefix_preserving) << why.value_or("(prefix-preserving)");
}

// Every <think>...</think> block of `text` (with the blank line after it) removed.
std::string without_reasoning(std::string text) {
  for (size_t at; (at = text.find("<think>")) != std::string::npos;) {
    size_t end = text.find("</think>", at);
    if (end == std::string::npos) break;
    end += 8;
    while (end < text.size() && text[end] == '\n') ++end;
    text.erase(at, end - at);
  }
  return text;
}

// The target of issue 28: every turn's prompt equals a from-scratch render + encode of the
// conversation, over 1,000 random multi-turn conversations (with tool calls where the template
// has them). A template that is not prefix-preserving (Qwen3: it drops the reasoning of earlier
// replies) stays one trajectory too (issue 52): its prompt is the from-scratch render but for the
// earlier replies' reasoning, which the session keeps as sampled.
TEST_P(ChatTrajectoryRealTest, EveryTurnsPromptIsTheFromScratchEncodingOverRandomConversations) {
  const Pair& p = GetParam();
  const ChatTemplate chat = load_template(p.chat_template);
  const text::Tokenizer& tok = tokenizer(p.tokenizer);
  const ChatEncoder encoder(tok);
  ChatRenderOptions options = options_with_now();
  if (p.tools) options.tools = ojson::parse(kCalcTool);
  std::mt19937 rng(1234);
  int64_t turns = 0, mismatches = 0, new_segments = 0, rebased = 0, merged = 0;
  for (int conversation = 0; conversation < 1000; ++conversation) {
    ChatTrajectory traj(chat, tok, {}, options);
    ojson messages = ojson::array();
    if (p.tools && rng() % 2)
      messages.push_back({{"role", "system"}, {"content", random_text(rng)}});
    messages.push_back({{"role", "user"}, {"content", random_text(rng)}});
    const int n_turns = 1 + static_cast<int>(rng() % 5);
    for (int t = 0; t < n_turns; ++t) {
      ChatTrajectory::Turn turn = traj.extend(messages);
      new_segments += turn.new_segment;
      rebased += turn.rebased;
      const std::vector<int32_t> expected = encoder.encode(chat.render(messages, options));
      ++turns;
      const bool same = p.prefix_preserving ? traj.prompt() == expected
                                            : without_reasoning(tok.decode(traj.prompt(), false)) ==
                                                  without_reasoning(tok.decode(expected, false));
      if (!same) {
        if (++mismatches <= 3) {
          ADD_FAILURE() << "conversation " << conversation << " turn " << t << ": "
                        << messages.dump() << "\nprompt:   " << tok.decode(traj.prompt(), false)
                        << "\nexpected: " << tok.decode(expected, false);
        }
      }
      // The model's reply: text (with reasoning for the templates that drop it), or a tool call
      // answered by the tool.
      ojson reply = {{"role", "assistant"}, {"content", random_text(rng)}};
      const bool call = p.tools && rng() % 3 == 0;
      if (!p.prefix_preserving && rng() % 2) {
        reply["content"] = "<think>\n" + random_text(rng) + "\n</think>\n\n" + random_text(rng);
      }
      if (call) {
        reply["tool_calls"] = ojson::array(
            {{{"id", "call_" + std::to_string(t)},
              {"type", "function"},
              {"function", {{"name", "calc"}, {"arguments", {{"expr", random_text(rng)}}}}}}});
      }
      auto sampled =
          simulated_reply(chat, tok, options, messages, reply, traj.prompt(), !p.prefix_preserving);
      if (!sampled) {
        ++merged;
        break;
      }
      traj.append_completion(*sampled, reply);
      messages.push_back(reply);
      if (call) {
        messages.push_back({{"role", "tool"},
                            {"tool_call_id", "call_" + std::to_string(t)},
                            {"name", "calc"},
                            {"content", random_text(rng)}});
      } else {
        messages.push_back({{"role", "user"}, {"content", random_text(rng)}});
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << turns << " turns";
  // Llama 2's sentencepiece merges Mistral v0.1's "[/INST]" with a reply's first letters in about a
  // third of the conversations; the other pairs never merge across the prompt.
  EXPECT_LT(merged, p.tokenizer == std::string("llama2") ? 500 : 10)
      << "conversations cut where the whole's encoding merges across the prompt";
  std::cout << p.chat_template << ": " << turns << " turns, " << mismatches << " mismatches, "
            << new_segments << " new segments, " << rebased << " rebased turns, " << merged
            << " conversations cut at a merge\n";
  EXPECT_EQ(new_segments, 0);  // every conversation is one trajectory
  if (p.prefix_preserving) {
    EXPECT_EQ(rebased, 0);
  } else {
    EXPECT_GT(rebased, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Real, ChatTrajectoryRealTest, ::testing::ValuesIn(kPairs),
                         [](const ::testing::TestParamInfo<Pair>& info) {
                           std::string name = info.param.chat_template;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

class ChatTrajectoryTest : public ::testing::Test {
 protected:
  ChatTemplate chat_ = load_template("Qwen2.5-7B-Instruct");
  const text::Tokenizer& tok_ = tokenizer("qwen3");
  ChatEncoder encoder_{tok_};

  std::vector<int32_t> encode(const ojson& messages) const {
    return encoder_.encode(chat_.render(messages, options_with_now()));
  }
  int32_t id(const std::string& text) const {
    auto ids = encoder_.encode(text);
    EXPECT_EQ(ids.size(), 1u) << text;
    return ids.at(0);
  }
  // A turn of `m` answered with the one-id `reply` and the end of turn.
  void answered(ChatTrajectory& traj, const ojson& m, const std::string& reply) const {
    traj.extend(m);
    traj.append_completion({id(reply), id("<|im_end|>")},
                           {{"role", "assistant"}, {"content", reply}});
  }
};

ojson msg(const char* role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

TEST_F(ChatTrajectoryTest, KeepsTheSampledIdsAndMasksOnlyThem) {
  ChatTrajectory traj(chat_, tok_, {}, options_with_now());
  ojson m = ojson::array({msg("user", "hi")});
  auto first = traj.extend(m);
  EXPECT_EQ(first.appended, encode(m));
  // A non-canonical split of "Hello": the trajectory keeps it as sampled.
  std::vector<int32_t> reply = encoder_.encode("Hel");
  for (int32_t i : encoder_.encode("lo")) reply.push_back(i);
  reply.push_back(id("<|im_end|>"));
  traj.append_completion(reply, msg("assistant", "Hello"));
  m.push_back(msg("assistant", "Hello"));
  m.push_back(msg("user", "again"));
  auto second = traj.extend(m);
  EXPECT_FALSE(second.new_segment);
  std::vector<int32_t> expected = encode(ojson::array({msg("user", "hi")}));
  expected.insert(expected.end(), reply.begin(), reply.end());
  // After the sampled <|im_end|>, the rest of the closer ("\n") and the new turn.
  for (int32_t i :
       encoder_.encode("\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")) {
    expected.push_back(i);
  }
  EXPECT_EQ(traj.ids(), expected);
  ASSERT_EQ(traj.mask().size(), traj.ids().size());
  const size_t start = encode(ojson::array({msg("user", "hi")})).size();
  for (size_t i = 0; i < traj.mask().size(); ++i) {
    EXPECT_EQ(traj.mask()[i], i >= start && i < start + reply.size() ? 1 : 0) << i;
  }
}

TEST_F(ChatTrajectoryTest, AReplyCutByLengthGetsTheWholeCloser) {
  ChatTrajectory traj(chat_, tok_, {}, options_with_now());
  ojson m = ojson::array({msg("user", "count")});
  traj.extend(m);
  traj.append_completion(encoder_.encode("1 2 3"), msg("assistant", "1 2 3"));  // no <|im_end|>
  m.push_back(msg("assistant", "1 2 3"));
  m.push_back(msg("user", "more"));
  traj.extend(m);
  EXPECT_EQ(traj.prompt(), encode(m));
}

TEST_F(ChatTrajectoryTest, AnEditedEarlierMessageIsRefusedNamingItAndChangesNothing) {
  ChatTrajectory traj(chat_, tok_, {}, options_with_now());
  ojson m = ojson::array({msg("system", "be brief"), msg("user", "hi")});
  traj.extend(m);
  traj.append_completion({id("ok"), id("<|im_end|>")}, msg("assistant", "ok"));
  m.push_back(msg("assistant", "ok"));
  m.push_back(msg("user", "and?"));
  traj.extend(m);
  traj.append_completion({id("yes"), id("<|im_end|>")}, msg("assistant", "yes"));
  m.push_back(msg("assistant", "yes"));
  const auto ids = traj.ids();
  // Message 0 edited, and the first reply replaced: both before the last turn, so no retry.
  for (size_t at : {size_t{0}, size_t{2}}) {
    ojson edited = m;
    edited[at]["content"] = "something else";
    edited.push_back(msg("user", "next"));
    try {
      traj.extend(edited);
      ADD_FAILURE() << "an edited message " << at << " was accepted";
    } catch (const NotAnExtension& e) {
      EXPECT_EQ(e.index(), at);
      EXPECT_NE(std::string(e.what()).find("message " + std::to_string(at) + " differs"),
                std::string::npos)
          << e.what();
    }
  }
  // Dropped messages and a conversation that adds nothing are refused too.
  EXPECT_THROW(traj.extend(ojson::array({msg("system", "be brief")})), NotAnExtension);
  EXPECT_THROW(traj.extend(m), NotAnExtension);
  EXPECT_EQ(traj.ids(), ids);
  EXPECT_EQ(traj.num_messages(), 5u);
  // The replies sent back with the fields clients add (a null refusal, empty tool_calls) extend.
  m[4] = {{"role", "assistant"},
          {"content", "yes"},
          {"refusal", nullptr},
          {"tool_calls", ojson::array()}};
  m.push_back(msg("user", "next"));
  auto turn = traj.extend(m);
  EXPECT_FALSE(turn.rewound);
  EXPECT_EQ(traj.num_messages(), 6u);
  EXPECT_EQ(traj.prompt(), encode(m));
}

TEST_F(ChatTrajectoryTest, ARetryOfTheLastTurnRewindsIt) {
  ChatTrajectory traj(chat_, tok_, {}, options_with_now());
  ojson m = ojson::array({msg("user", "hi")});
  answered(traj, m, "ok");
  m.push_back(msg("assistant", "ok"));
  m.push_back(msg("user", "first try"));
  answered(traj, m, "no");
  // The client takes the last turn back and asks differently.
  m[2] = msg("user", "second try");
  auto turn = traj.extend(m);
  EXPECT_TRUE(turn.rewound);
  EXPECT_FALSE(turn.new_segment);
  std::vector<int32_t> expected = encode(ojson::array({msg("user", "hi")}));
  expected.push_back(id("ok"));
  expected.push_back(id("<|im_end|>"));
  for (int32_t i :
       encoder_.encode("\n<|im_start|>user\nsecond try<|im_end|>\n<|im_start|>assistant\n")) {
    expected.push_back(i);
  }
  EXPECT_EQ(traj.ids(), expected);
  EXPECT_EQ(traj.num_messages(), 3u);
  // A turn whose reply never came is taken back the same way.
  m.push_back(msg("user", "and a third message"));
  EXPECT_TRUE(traj.extend(m).rewound);
  EXPECT_EQ(traj.prompt(), encode(m));
}

// The engine's reply edited and sent back is an edit, not a retry of its turn: refused naming it,
// never re-encoded (also after the first turn, where the retried turn starts at message 0).
TEST_F(ChatTrajectoryTest, AnEditedReplyIsRefusedNotTakenForARetry) {
  ChatTrajectory traj(chat_, tok_, {}, options_with_now());
  ojson m = ojson::array({msg("user", "hi")});
  answered(traj, m, "ok");
  const auto ids = traj.ids();
  for (const ojson& edited :
       {ojson::array({msg("user", "hi"), msg("assistant", "not ok"), msg("user", "next")}),
        ojson::array({msg("user", "hello"), msg("assistant", "ok"), msg("user", "next")})}) {
    try {
      traj.extend(edited);
      ADD_FAILURE() << "accepted: " << edited.dump();
    } catch (const NotAnExtension& e) {
      EXPECT_EQ(e.index(), edited[0]["content"] == "hi" ? 1u : 0u) << e.what();
    }
    EXPECT_EQ(traj.ids(), ids);
  }
  // The turn asked anew (no reply in it) is still a retry.
  EXPECT_TRUE(traj.extend(ojson::array({msg("user", "hello")})).rewound);
}

// abort_turn takes an extend back whole: a new turn, and a retry (the rewound turn's ids, reply
// and retry point come back, so the same retry works afterwards).
TEST_F(ChatTrajectoryTest, AnAbortedTurnLeavesTheSessionAsItWas) {
  ChatTrajectory traj(chat_, tok_, {}, options_with_now());
  ojson m = ojson::array({msg("user", "hi")});
  answered(traj, m, "ok");
  m.push_back(msg("assistant", "ok"));
  m.push_back(msg("user", "and?"));
  answered(traj, m, "yes");
  const auto ids = traj.ids();
  const auto mask = traj.mask();
  const auto segments = traj.segment_starts();
  ojson next = m;
  next.push_back(msg("assistant", "yes"));
  next.push_back(msg("user", "more"));
  ojson retry = m;
  retry.back() = msg("user", "or?");
  for (const ojson& turn : {next, retry}) {
    traj.extend(turn);
    EXPECT_TRUE(traj.turn_open());
    traj.abort_turn();
    EXPECT_FALSE(traj.turn_open());
    EXPECT_EQ(traj.ids(), ids);
    EXPECT_EQ(traj.mask(), mask);
    EXPECT_EQ(traj.segment_starts(), segments);
    EXPECT_EQ(traj.num_messages(), 4u);
  }
  EXPECT_TRUE(traj.extend(retry).rewound);
  EXPECT_EQ(traj.prompt(), encode(retry));
  EXPECT_THROW(ChatTrajectory(chat_, tok_, {}, options_with_now()).abort_turn(), std::logic_error);
}

TEST(ChatTrajectoryQwen3Test, AReplyWithReasoningIsKeptAndTheSessionStaysOneSegment) {
  const ChatTemplate chat = load_template("Qwen3");
  const text::Tokenizer& tok = tokenizer("qwen3");
  const ChatEncoder encoder(tok);
  ChatTrajectory traj(chat, tok, {}, options_with_now());
  ojson m = ojson::array({msg("user", "2+2?")});
  traj.extend(m);
  const std::string reply = "<think>\nadd\n</think>\n\n4";
  std::vector<int32_t> sampled = encoder.encode(reply + "<|im_end|>");
  traj.append_completion(sampled, msg("assistant", reply));
  m.push_back(msg("assistant", reply));
  m.push_back(msg("user", "3+3?"));
  auto turn = traj.extend(m);
  EXPECT_FALSE(turn.new_segment);
  EXPECT_TRUE(turn.rebased);
  ASSERT_EQ(traj.segment_starts().size(), 1u);
  // The prompt: the first turn, the reply as sampled (reasoning included), the template's closer
  // and the new user turn as the template writes it.
  const std::string want = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n" + reply +
                           "<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(tok.decode(traj.prompt(), false), want);
  // The from-scratch render drops the reasoning: that is the only difference.
  EXPECT_EQ(chat.render(m, options_with_now()),
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n");
  // The sampled ids are in the trajectory as they were, masked as the model's.
  const auto at = std::search(traj.ids().begin(), traj.ids().end(), sampled.begin(), sampled.end());
  ASSERT_NE(at, traj.ids().end());
  EXPECT_EQ(traj.mask()[static_cast<size_t>(at - traj.ids().begin())], 1);
}

}  // namespace
}  // namespace crl::text
