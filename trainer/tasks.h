// Tasks: prompt/answer rows (from --data FILE.jsonl or the built-in default task), a held-out
// eval split, and verifiable rewards.
//
// Data file: one JSON object per line, {"prompt": string, "answer": string or number}, or
// {"messages": [{"role": ..., "content": ...}, ...], "answer": ...}: a chat, rendered by the
// model's chat template with add_generation_prompt (the prompt then ends where the assistant's
// reply begins). verl's row fields are read too: "prompt" as a list of chat messages is a chat,
// "reward_model": {"ground_truth": ...} is the answer when "answer" is absent, and "data_source"
// (a string) and "extra_info" (any JSON) are kept for a reward program (reward_program.h). An
// optional "demonstration" string is what the SFT warm-up trains on instead of the answer (say a
// worked solution; the rewards judge the answer). Other keys are ignored and blank lines skipped.
// Every bad row (invalid JSON, missing field, wrong type, empty prompt, both or neither of prompt
// and messages, a chat the template rejects, and for the chosen reward an answer it cannot use: a
// bad regex, a non-number) is reported as FILE:LINE: reason, and loading fails: a run never starts
// on garbage. A Parquet file (verl's format) is refused with the command that converts it.
//
// The built-in rewards score the *answer part* of a completion, which RewardOptions::extract
// takes out of it (AnswerExtract: by default the text up to the first newline), trimmed:
//   exact    1 if it equals the answer (both trimmed);
//   numeric  1 if its first number equals the answer's number (|a - b| <= 1e-6 * max(1, |b|));
//            thousands separators ("1,234") and a leading '$' are read as GSM8K writes them;
//   regex    1 if the whole answer part matches the row's answer as an ECMAScript regex;
//   format   1 if it matches RewardOptions::format_regex (no correctness check).
// format_weight > 0 adds that much for a well-formed answer to the exact/numeric/regex reward.
// A completion without an answer part (no marker for after:STR, no \boxed{...}) scores 0 and is
// not well formed. A reward program (--reward COMMAND) judges the whole completion instead.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace crl::trainer {

// How a row's prompt text becomes token ids (PromptEncoder).
enum class PromptKind {
  kText,         // a "prompt" row: the model's BOS when it adds one, then the tokenizer's ids
  kChat,         // a "messages" row rendered by the model's template, which writes its own BOS:
                 // the special tokens it writes as text become their ids, nothing is added
  kBuiltinChat,  // a "messages" row rendered by a built-in format (the model has no template):
                 // as kChat, after the model's BOS (as the server's chat endpoint does)
};

struct TaskRow {
  std::string prompt;  // the prompt text; for a "messages" row, its chat-template render
  std::string answer;
  // What the SFT warm-up trains the model to write for this prompt; empty: the answer. The
  // built-in task's demonstrations show the format only (see default_task_rows).
  std::string demonstration;
  int64_t line = 0;  // 1-based line in the data file (0 for generated rows)
  PromptKind kind = PromptKind::kText;
  // Untrusted data (--split-special-tokens): special-token literals in the prompt text and the
  // answer are text; in a chat, `literal_spans` are where those of the messages are in `prompt`
  // (the template's own special tokens stay tokens).
  bool split_special_tokens = false;
  std::vector<std::pair<size_t, size_t>> literal_spans;
  // For a reward program: verl's "data_source", and the JSON text of "extra_info" and of the
  // ground truth as the file gives it (empty: none; the ground truth is then `answer`).
  std::string data_source;
  std::string extra_info_json;
  std::string ground_truth_json;
  std::string messages_json;  // a chat row's messages as the file gives them (for an --env)
};

enum class RewardKind { kExact, kNumeric, kRegex, kFormat };

// "exact" | "numeric" | "regex" | "format"; throws std::invalid_argument listing them.
RewardKind parse_reward_kind(const std::string& name);
std::string reward_kind_name(RewardKind kind);

// Which part of a completion the built-in rewards judge (--answer-extract).
enum class AnswerFrom {
  kFirstLine,  // "first-line": up to the first newline
  kLastLine,   // "last-line": the last line with anything but whitespace on it
  kAfter,      // "after:STR": after the last STR, to the end of its line (GSM8K: "after:####")
  kBoxed,      // "boxed": the contents of the last \boxed{...} or \fbox{...} (braces balanced)
  kFull,       // "full": the whole completion
};
struct AnswerExtract {
  AnswerFrom from = AnswerFrom::kFirstLine;
  std::string marker;  // kAfter's STR (not empty)
};
// Throws std::invalid_argument listing the forms.
AnswerExtract parse_answer_extract(const std::string& spec);
std::string answer_extract_name(const AnswerExtract& extract);

struct RewardOptions {
  // How correctness is judged.
  RewardKind kind = RewardKind::kExact;
  AnswerExtract extract;
  // A well-formed answer part matches this whole (ECMAScript).
  std::string format_regex = R"(\S(.*\S)?)";
  // Bonus for a well-formed answer part, added to exact/numeric/regex rewards (0 = off).
  double format_weight = 0.0;
  // A reward program's command line (--reward COMMAND; reward_program.h): it scores instead of
  // `kind`, and rows' answers may be any JSON. Empty: the built-in `kind`.
  std::string program;
  std::chrono::milliseconds program_timeout{30000};  // its longest wait for one reply
};

struct RewardResult {
  double reward = 0;
  bool correct = false;  // the accuracy criterion (format for kFormat)
  bool well_formed = false;
};

// How the reward judges, for people: "exact on the first line", "numeric on what follows the last
// '####'", "program 'python3 gsm8k.py'".
std::string describe_reward(const RewardOptions& options);

// The completion's answer part (see AnswerExtract), with surrounding whitespace removed; nullopt
// when it has none.
std::optional<std::string> extract_answer(const std::string& completion,
                                          const AnswerExtract& extract = {});

// Scores one completion against a row's answer. Throws std::invalid_argument on a bad regex.
RewardResult score_completion(const RewardOptions& options, const std::string& completion,
                              const std::string& answer);

// Reads a JSONL task file. "messages" rows are rendered with the chat template of `model_dir`
// (text::ChatTemplate::from_model_dir, loaded at the first such row). With
// `split_special_tokens` every row is untrusted text (TaskRow::split_special_tokens; a chat's
// messages are masked for the template with the literals of `model_dir`'s tokenizer). Throws
// std::invalid_argument whose message lists every bad row as "path:line: reason" (the first 20,
// then a count), or names the file when it cannot be read or has no rows, or the model directory
// when its chat template does not load.
std::vector<TaskRow> load_task_jsonl(const std::string& path, const RewardOptions& reward = {},
                                     const std::string& model_dir = "",
                                     bool split_special_tokens = false);

struct TaskSplit {
  std::vector<TaskRow> train;
  std::vector<TaskRow> eval;       // held out: never trained on, nor any row with the same prompt
  int64_t dropped_train_rows = 0;  // rows left out of training: their prompt is a held-out one
};

// The held-out count used when none is given: a fifth of the rows, at least one (from two rows
// on), at most 128.
int64_t default_eval_rows(int64_t num_rows);

// Shuffles (seeded) and holds out `eval_rows` rows (at most half the rows; negative = the
// default above). A remaining row whose prompt is also a held-out row's is not trained on either
// (TaskSplit::dropped_train_rows): a held-out score measures prompts the model never saw.
TaskSplit split_task(std::vector<TaskRow> rows, int64_t eval_rows, uint64_t seed);

// The built-in default task for the embedded default model: copy a short list of words.
//   prompt: "Copy: red tree big. Answer:"   answer: "red tree big"
// 2 or 3 words out of 16 that the default tokenizer (trained on the project's corpus, see
// engine/model/model_writer.cpp) keeps as single pieces, so an answer of k words is k tokens and
// the completion is k tokens + EOS. Its digits, by contrast, are split ("12" -> "▁", "1", "2").
// Held-out rows are unseen word combinations: the model has to learn to copy, not memorise.
// Each row's demonstration (the SFT warm-up's target) is its words in a random order: the
// warm-up teaches the format (the prompt's words, as many, then EOS) but not the order, so a
// model after it answers right only when the order it picks happens to be the prompt's (1 in k!
// for k distinct words), and GRPO has to learn the order from the exact-match reward alone.
// Deterministic in `seed`. Exact-match reward.
std::vector<TaskRow> default_task_rows(int64_t count, uint64_t seed);

// Cycles through a seeded permutation of [0, n), reshuffling at each epoch: which train row comes
// next. Every rank of a job builds the same one and draws in the same order, so they agree on the
// prompts of a step without exchanging them; drawn() is the data cursor a checkpoint keeps.
class RowSampler {
 public:
  RowSampler(int64_t n, uint64_t seed);
  int64_t next();
  int64_t drawn() const { return drawn_; }

 private:
  void shuffle();
  std::vector<int64_t> order_;
  std::mt19937_64 rng_;
  int64_t pos_ = 0;
  int64_t drawn_ = 0;
};

}  // namespace crl::trainer
