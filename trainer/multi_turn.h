// Multi-turn episodes on the engine (issue 28; docs/design.md §4, §5).
//
// EpisodeRunner plays episodes between the model (an EngineLoop) and an Environment:
//   reset -> the opening messages, rendered by the model's chat template into a
//   text::ChatTrajectory; then per turn: the engine samples the assistant's turn from the
//   trajectory's ids (prompt = the current segment: earlier turns come from the prefix cache);
//   the turn ends at the tool-call syntax (text::tool_call_stop_strings) or at the end of turn;
//   its text is parsed for tool calls (text::parse_tool_calls); the sampled ids are appended as
//   they are (never re-encoded; loss mask 1, with their sampled log-probs and weight versions); the
//   environment answers and its messages are appended as the template renders them (mask 0).
//   A call that does not parse is answered by the runner with an error tool message (counted in
//   tool_errors), without the environment.
// An episode ends at a final answer (an assistant turn without calls: the environment scores
// it), at the turn cap, at the token cap (its ids, all segments) or at an environment error
// (reward 0, the error named). Episodes run concurrently: the environment is called on threads
// of its own, so while one episode waits for its tool the engine decodes the others.
//
// episode_samples() turns an episode into training samples: one per segment (a template that
// rewrites earlier turns starts a new one, see ChatTrajectory), its prompt the segment's leading
// mask-0 ids, its completion the rest with the per-token loss mask (environment tokens weight 0).
//
// Thread safety: run() is called by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "text/tool_calls.h"
#include "trainer/environment.h"
#include "trainer/micro_batch.h"

namespace crl::engine {
class EngineLoop;
}  // namespace crl::engine
namespace crl::text {
class ChatTemplate;
class Tokenizer;
}  // namespace crl::text

namespace crl::trainer {

struct MultiTurnOptions {
  // Assistant turns per episode (the turn cap).
  int32_t max_turns = 4;
  // Generated tokens per assistant turn.
  int32_t max_tokens_per_turn = 48;
  // Ids per episode, all segments (the token cap). The engine's context bounds it too: a turn
  // never asks for more than the context has room for, and an episode whose conversation fills the
  // context ends with the token cap (not a failed request).
  int32_t max_episode_tokens = 384;
  // The longest an episode's engine request may run before the runner fails.
  std::chrono::milliseconds timeout{1800000};
  // The baseline of `bench multi-turn`: episodes advance in lockstep, turn k + 1 of any episode
  // starts once every live episode has finished turn k and heard from its environment (each turn
  // waits for the slowest tool call). Off: an episode's next turn starts as soon as its own
  // environment answered.
  bool turn_synchronous = false;
  // Episodes in flight at most (environment instances, sandboxes); 0: every episode at once. The
  // next episode starts as one ends; turn-synchronously, a wave of this many starts once the last
  // wave has ended.
  int32_t max_in_flight = 0;
};

// Where an episode is played: its id (unique in the job), task and sampling.
struct EpisodeSpec {
  std::string id;
  EnvSplit split = EnvSplit::kTrain;
  int64_t index = 0;
  double temperature = 1.0;
  uint64_t seed = 0;
  nlohmann::ordered_json task = nullptr;  // the --data row (env_task), for the environment's reset
};

struct Episode {
  std::vector<int32_t> ids;       // every segment, in order
  std::vector<uint8_t> mask;      // 1: sampled by the model; 0: prompt, tool and environment text
  std::vector<float> logprobs;    // the engine's log-prob on sampled ids (sampled_logprobs), else 0
  std::vector<int64_t> versions;  // the weights that sampled each id, -1 elsewhere
  std::vector<size_t> segments;   // where each segment starts in ids
  double reward = 0;
  bool correct = false;
  int32_t turns = 0;        // assistant turns
  int32_t tool_calls = 0;   // calls that parsed
  int32_t tool_errors = 0;  // calls that did not parse
  std::string end;          // "answer", "turn_cap", "token_cap" or "env_error"
  std::string env_error;    // with end "env_error": the environment's named error
  // The prompts of its engine requests after the first turn, summed, and how many of those
  // tokens the engine's prefix cache served.
  int64_t later_prompt_tokens = 0;
  int64_t later_cached_tokens = 0;
  // Of those prompts, the ids the engine had already seen: the previous turn's prompt and reply
  // (the rest is what the turn adds: the tool's answer and the template's text).
  int64_t later_held_tokens = 0;
  int64_t env_tokens() const;    // mask-0 ids after the first segment's opening prompt
  int64_t model_tokens() const;  // mask-1 ids
};

class EpisodeRunner {
 public:
  // REQUIRES: every argument outlives the runner.
  EpisodeRunner(engine::EngineLoop& loop, Environment& env, const text::ChatTemplate& chat,
                const text::Tokenizer& tokenizer, std::vector<int32_t> prefix,
                text::ToolCallFormat format, MultiTurnOptions options);

  // Plays the episodes concurrently and calls on_finished(i, episode) as each ends; `between`
  // (may be empty) runs between two polls (the producer follows weight updates there). Throws
  // when an engine request fails or outlives the timeout.
  void run(const std::vector<EpisodeSpec>& specs,
           const std::function<void(size_t, Episode&)>& on_finished,
           const std::function<void()>& between = {});

  text::ToolCallFormat format() const { return format_; }

 private:
  class Play;  // one run's episodes (multi_turn.cpp)

  engine::EngineLoop& loop_;
  Environment& env_;
  const text::ChatTemplate& chat_;
  const text::Tokenizer& tokenizer_;
  std::vector<int32_t> prefix_;
  text::ToolCallFormat format_;
  text::ToolCallMarkers markers_;  // the format's markers that are special tokens, if any
  MultiTurnOptions o_;
  int64_t episode_cap_;  // min(max_episode_tokens, the engine's context)
};

// The training samples of `episode` (one per segment with a model token), with `advantage`.
// The trailing environment ids after the last model id carry no loss and are left out.
std::vector<Sample> episode_samples(const Episode& episode, double advantage);

// One prompt's finished episodes (a GRPO group) as training samples: advantages
// (compute_group_advantages) over the rewards of the episodes that did not end with an
// environment error, then episode_samples of each of those. An episode the environment failed
// (end "env_error") is not trained on: its reward 0 says nothing about the model's tokens, and
// counted in the group it would shift the other episodes' advantages.
std::vector<Sample> group_episode_samples(const std::vector<Episode>& episodes);

// A demonstration conversation (Environment::demonstration) as an SFT sample: the assistant
// turns are encoded from their text (tool calls written in `format`; the final answer followed by
// `eos`), everything else as the template renders it, with mask 0. log-probs 0.
Sample demonstration_sample(const nlohmann::ordered_json& messages,
                            const nlohmann::ordered_json& tools, const text::ChatTemplate& chat,
                            const text::Tokenizer& tokenizer, const std::vector<int32_t>& prefix,
                            text::ToolCallFormat format, int32_t eos);

}  // namespace crl::trainer
