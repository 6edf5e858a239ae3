#include "trainer/multi_turn.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>

#include "engine/engine_loop.h"
#include "text/chat_trajectory.h"
#include "text/tokenizer.h"

namespace crl::trainer {
namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// One episode in flight.
struct Live {
  // kPending: not started (the in-flight cap); kReady: waits for the turn's barrier.
  enum class Phase { kPending, kEnv, kEngine, kReady, kDone };
  Phase phase = Phase::kPending;
  std::unique_ptr<text::ChatTrajectory> traj;
  ojson messages = ojson::array();
  Episode ep;
  std::future<EnvReply> env;
  bool env_is_reset = true;
  ojson errors_after = ojson::array();  // error observations to append after the env's messages
  std::shared_ptr<engine::RequestChannel> channel;
  uint64_t seen = 0;
  int64_t held = 0;  // ids of the last request's prompt and reply: what the engine has seen
  Clock::time_point submitted;
};

ojson error_observation(const std::string& why) {
  return {{"role", "tool"}, {"content", "error: " + why}};
}

}  // namespace

int64_t Episode::env_tokens() const {
  auto first = std::find(mask.begin(), mask.end(), uint8_t{1});
  return std::count(first, mask.end(), uint8_t{0});
}

int64_t Episode::model_tokens() const { return std::count(mask.begin(), mask.end(), uint8_t{1}); }

EpisodeRunner::EpisodeRunner(engine::EngineLoop& loop, Environment& env,
                             const text::ChatTemplate& chat, const text::Tokenizer& tokenizer,
                             std::vector<int32_t> prefix, text::ToolCallFormat format,
                             MultiTurnOptions options)
    : loop_(loop),
      env_(env),
      chat_(chat),
      tokenizer_(tokenizer),
      prefix_(std::move(prefix)),
      format_(format),
      markers_(text::special_tool_call_markers(tokenizer, format)),
      o_(options) {
  if (o_.max_turns < 1 || o_.max_tokens_per_turn < 1 || o_.max_episode_tokens < 1) {
    throw std::invalid_argument("--max-turns, --max-tokens and --max-episode-tokens must be >= 1");
  }
  if (o_.max_in_flight < 0) throw std::invalid_argument("episodes in flight must be >= 0 (0: all)");
  episode_cap_ = std::min<int64_t>(o_.max_episode_tokens, loop_.engine().max_model_len());
}

// One run(): every episode's state machine. An episode goes kPending -> kEnv (its reset) ->
// kEngine (a turn) -> kEnv (a tool step) -> kEngine ... -> kDone; with turn_synchronous, a turn
// waits in kReady for the barrier.
class EpisodeRunner::Play {
 public:
  Play(EpisodeRunner& runner, const std::vector<EpisodeSpec>& specs,
       const std::function<void(size_t, Episode&)>& on_finished)
      : r_(runner),
        specs_(specs),
        on_finished_(on_finished),
        live_(specs.size()),
        cap_(runner.o_.max_in_flight > 0 ? static_cast<size_t>(runner.o_.max_in_flight)
                                         : specs.size()) {}

  bool done() const { return finished_ == specs_.size(); }
  // Up to the cap: an episode starts as soon as one ends, or, turn-synchronously, a wave of `cap`
  // starts once the last one has ended.
  void start_more();
  // Looks at every live episode once: a reply of the environment or the engine moves it on.
  // True when any moved.
  bool poll();
  // Turn-synchronous: once nobody generates or waits for a tool, every ready episode's turn is
  // submitted.
  void barrier();
  // After a failure (the run throws): every live episode's engine request aborted, the
  // environment told to close it, and the environment calls in flight awaited together, within
  // `wait` (each is bounded by the environment's own timeout too). Returns how many were still
  // running at the deadline (their futures then block the Play's destruction).
  size_t abandon(std::chrono::milliseconds wait);

 private:
  void start(size_t i);
  void finish(size_t i, const std::string& end, bool env_ended = false);
  void submit(size_t i);
  // Appends `add` to the conversation (rendered, mask 0) and asks for the next assistant turn.
  void continue_with(size_t i, const ojson& add);
  void on_env(size_t i, EnvReply r);
  void step_env(size_t i, const ojson& message);
  void on_turn(size_t i, const engine::RequestOutput& out);

  EpisodeRunner& r_;
  const std::vector<EpisodeSpec>& specs_;
  const std::function<void(size_t, Episode&)>& on_finished_;
  std::vector<Live> live_;
  const size_t cap_;
  size_t finished_ = 0, started_ = 0;
};

void EpisodeRunner::run(const std::vector<EpisodeSpec>& specs,
                        const std::function<void(size_t, Episode&)>& on_finished,
                        const std::function<void()>& between) {
  Play play(*this, specs, on_finished);
  try {
    play.start_more();
    while (!play.done()) {
      const bool progress = play.poll();
      if (o_.turn_synchronous) play.barrier();
      if (between) between();
      if (!progress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (...) {
    const size_t pending = play.abandon(std::chrono::milliseconds(30000));
    if (pending > 0) {
      spdlog::warn("episodes abandoned after a failure: {} environment call(s) still running",
                   pending);
    }
    throw;
  }
}

size_t EpisodeRunner::Play::abandon(std::chrono::milliseconds wait) {
  // Nothing here may throw over the error being handled: each call's failure is logged.
  auto close = [this](size_t i) {
    try {
      r_.env_.close(specs_[i].id);  // queued behind a step in flight; a pool forgets it
    } catch (const std::exception& e) {
      spdlog::warn("episode {}: close after a failure: {}", specs_[i].id, e.what());
    }
  };
  std::vector<std::string> requests;
  std::vector<size_t> resetting;  // closed once their reset is back (before, it may not know them)
  for (size_t i = 0; i < live_.size(); ++i) {
    Live& l = live_[i];
    if (l.phase == Live::Phase::kPending || l.phase == Live::Phase::kDone) continue;
    if (l.phase == Live::Phase::kEngine) {
      requests.push_back(fmt::format("{}-t{}", specs_[i].id, l.ep.turns));
    }
    if (l.phase == Live::Phase::kEnv && l.env_is_reset) {
      resetting.push_back(i);
    } else {
      close(i);
    }
  }
  try {
    if (!requests.empty()) r_.loop_.abort(requests);
  } catch (const std::exception& e) {
    spdlog::warn("aborting the episodes' requests after a failure: {}", e.what());
  }
  const auto deadline = Clock::now() + wait;
  size_t pending = 0;
  for (Live& l : live_) {  // they run concurrently: the wait is the longest, not the sum
    if (l.env.valid() && l.env.wait_until(deadline) != std::future_status::ready) ++pending;
  }
  for (size_t i : resetting) close(i);
  return pending;
}

void EpisodeRunner::Play::start(size_t i) {
  Live& l = live_[i];
  l.phase = Live::Phase::kEnv;
  Environment* env = &r_.env_;
  const EpisodeSpec s = specs_[i];
  l.env = std::async(std::launch::async,
                     [env, s] { return env->reset(s.id, s.split, s.index, s.task); });
  ++started_;
}

void EpisodeRunner::Play::start_more() {
  if (r_.o_.turn_synchronous && finished_ < started_) return;
  while (started_ < specs_.size() && started_ - finished_ < cap_) start(started_);
}

void EpisodeRunner::Play::finish(size_t i, const std::string& end, bool env_ended) {
  Live& l = live_[i];
  if (l.traj) {
    l.ep.ids = l.traj->ids();
    l.ep.mask = l.traj->mask();
    l.ep.segments = l.traj->segment_starts();
  }
  l.ep.end = end;
  // Ended here, not by the environment: it forgets the episode (an external program's state, a
  // pool's count of its process's open episodes).
  if (end == "turn_cap" || end == "token_cap" || (end == "env_error" && !env_ended))
    r_.env_.close(specs_[i].id);
  l.phase = Live::Phase::kDone;
  l.channel.reset();
  ++finished_;
  on_finished_(i, l.ep);
  start_more();
}

void EpisodeRunner::Play::submit(size_t i) {
  Live& l = live_[i];
  if (r_.o_.turn_synchronous && l.phase != Live::Phase::kReady) {
    l.phase = Live::Phase::kReady;  // submitted at the barrier
    return;
  }
  const int64_t used = static_cast<int64_t>(l.traj->ids().size());
  // (An environment's reply may have filled the context: the episode ends here, as at the cap.)
  if (used >= r_.episode_cap_) return finish(i, "token_cap");
  engine::GenerateRequest q;
  q.request_id = fmt::format("{}-t{}", specs_[i].id, l.ep.turns);
  q.prompt_token_ids = l.traj->prompt();
  q.params.n = 1;
  q.params.temperature = specs_[i].temperature;
  q.params.max_tokens =
      static_cast<int32_t>(std::min<int64_t>(r_.o_.max_tokens_per_turn, r_.episode_cap_ - used));
  q.params.seed = specs_[i].seed + static_cast<uint64_t>(l.ep.turns) * 1000003ULL;
  q.params.stop = text::tool_call_stop_strings(r_.format_);
  // A "</tool_call>" that is a special token never shows in the stop check's text: its id stops.
  if (r_.markers_.close_id) q.params.stop_token_ids.push_back(*r_.markers_.close_id);
  std::vector<engine::GenerateRequest> one;
  one.push_back(std::move(q));
  l.channel = r_.loop_.submit(std::move(one));
  l.seen = 0;
  l.submitted = Clock::now();
  l.phase = Live::Phase::kEngine;
}

void EpisodeRunner::Play::continue_with(size_t i, const ojson& add) {
  Live& l = live_[i];
  for (const auto& m : add) l.messages.push_back(m);
  const size_t before = l.traj->ids().size();
  try {
    l.traj->extend(l.messages);
  } catch (const std::exception& e) {
    l.ep.env_error = std::string("env_malformed: the conversation does not render: ") + e.what();
    return finish(i, "env_error");
  }
  const size_t added = l.traj->ids().size() - before;
  l.ep.logprobs.insert(l.ep.logprobs.end(), added, 0.0f);
  l.ep.versions.insert(l.ep.versions.end(), added, -1);
  submit(i);
}

void EpisodeRunner::Play::on_env(size_t i, EnvReply r) {
  Live& l = live_[i];
  if (!r.error.empty()) {
    l.ep.env_error = r.error;
    return finish(i, "env_error", /*env_ended=*/true);
  }
  if (l.env_is_reset) {
    text::ChatRenderOptions ro;
    ro.tools = r.tools;
    l.traj = std::make_unique<text::ChatTrajectory>(r_.chat_, r_.tokenizer_, r_.prefix_, ro);
    return continue_with(i, r.messages);
  }
  if (r.done) {
    l.ep.reward = r.reward;
    l.ep.correct = r.correct;
    return finish(i, "answer");
  }
  if (l.ep.turns >= r_.o_.max_turns) return finish(i, "turn_cap");  // it wants more: no room
  ojson add = r.messages;
  for (const auto& m : l.errors_after) add.push_back(m);
  l.errors_after = ojson::array();
  continue_with(i, add);
}

void EpisodeRunner::Play::step_env(size_t i, const ojson& message) {
  Live& l = live_[i];
  l.env_is_reset = false;
  l.phase = Live::Phase::kEnv;
  Environment* env = &r_.env_;
  std::string id = specs_[i].id;
  l.env = std::async(std::launch::async, [env, id, message] { return env->step(id, message); });
}

void EpisodeRunner::Play::on_turn(size_t i, const engine::RequestOutput& out) {
  Live& l = live_[i];
  if (!out.error.empty()) {
    throw std::runtime_error("episode " + specs_[i].id + ": request " + out.request_id +
                             " failed: " + out.error);
  }
  const engine::CompletionOutput& c = out.outputs.at(0);
  const int64_t prompt = static_cast<int64_t>(out.prompt_token_ids.size());
  if (l.ep.turns > 0) {
    l.ep.later_prompt_tokens += prompt;
    l.ep.later_cached_tokens += out.num_cached_tokens;
    l.ep.later_held_tokens += std::min(l.held, prompt);
  }
  l.held = prompt + static_cast<int64_t>(c.token_ids.size());
  const text::ParsedReply parsed = text::parse_tool_calls(
      r_.format_, text::decode_reply(r_.tokenizer_, r_.markers_, c.token_ids));
  const ojson message = parsed.message();
  l.traj->append_completion(c.token_ids, message);
  l.messages.push_back(message);
  const std::vector<float>& logprobs = c.sampled_logprobs(specs_[i].temperature);
  l.ep.logprobs.insert(l.ep.logprobs.end(), logprobs.begin(), logprobs.end());
  l.ep.versions.insert(l.ep.versions.end(), c.token_versions.begin(), c.token_versions.end());
  ++l.ep.turns;
  l.ep.tool_calls += static_cast<int32_t>(parsed.calls.size());
  l.ep.tool_errors += static_cast<int32_t>(parsed.errors.size());
  if (parsed.calls.empty() && parsed.errors.empty()) return step_env(i, message);  // the answer
  if (l.ep.turns >= r_.o_.max_turns) return finish(i, "turn_cap");
  ojson errors = ojson::array();
  for (const auto& e : parsed.errors) errors.push_back(error_observation(e));
  if (parsed.calls.empty()) return continue_with(i, errors);  // nothing for the environment
  l.errors_after = errors;
  step_env(i, message);
}

bool EpisodeRunner::Play::poll() {
  bool progress = false;
  for (size_t i = 0; i < live_.size(); ++i) {
    Live& l = live_[i];
    if (l.phase == Live::Phase::kEnv &&
        l.env.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      progress = true;
      on_env(i, l.env.get());
    } else if (l.phase == Live::Phase::kEngine) {
      auto snap = l.channel->wait(l.seen, std::chrono::milliseconds(0));
      l.seen = snap.version;
      if (snap.outputs[0] && snap.outputs[0]->finished) {
        progress = true;
        on_turn(i, *snap.outputs[0]);
      } else if (Clock::now() - l.submitted > r_.o_.timeout) {
        throw std::runtime_error(fmt::format("episode {}: turn {} unfinished after {} s",
                                             specs_[i].id, l.ep.turns + 1,
                                             r_.o_.timeout.count() / 1000));
      }
    }
  }
  return progress;
}

void EpisodeRunner::Play::barrier() {
  for (const Live& l : live_) {
    if (l.phase == Live::Phase::kEnv || l.phase == Live::Phase::kEngine) return;
  }
  for (size_t i = 0; i < live_.size(); ++i) {
    if (live_[i].phase == Live::Phase::kReady) submit(i);
  }
}

std::vector<Sample> episode_samples(const Episode& ep, double advantage) {
  std::vector<Sample> out;
  if (ep.ids.size() != ep.mask.size() || ep.ids.size() != ep.logprobs.size() ||
      ep.ids.size() != ep.versions.size()) {
    throw std::invalid_argument(
        fmt::format("episode_samples: {} ids, {} mask entries, {} log-probs, {} versions",
                    ep.ids.size(), ep.mask.size(), ep.logprobs.size(), ep.versions.size()));
  }
  for (size_t k = 0; k < ep.segments.size(); ++k) {
    const size_t b = ep.segments[k];
    const size_t e = k + 1 < ep.segments.size() ? ep.segments[k + 1] : ep.ids.size();
    size_t first = b;
    while (first < e && ep.mask[first] == 0) ++first;
    if (first == e || first == b) continue;  // no model token (or no prompt: never, see extend)
    size_t last = e;
    while (ep.mask[last - 1] == 0) --last;
    Sample s;
    s.prompt_ids.assign(ep.ids.begin() + b, ep.ids.begin() + first);
    s.completion_ids.assign(ep.ids.begin() + first, ep.ids.begin() + last);
    s.loss_mask.assign(ep.mask.begin() + first, ep.mask.begin() + last);
    s.logprobs.assign(ep.logprobs.begin() + first, ep.logprobs.begin() + last);
    s.versions.assign(ep.versions.begin() + first, ep.versions.begin() + last);
    s.reward = ep.reward;
    s.advantage = advantage;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Sample> group_episode_samples(const std::vector<Episode>& episodes) {
  std::vector<const Episode*> scored;
  std::vector<SampleGroup> rewards(1);
  for (const Episode& e : episodes) {
    if (e.end == "env_error") continue;
    scored.push_back(&e);
    Sample s;
    s.reward = e.reward;
    rewards[0].samples.push_back(s);
  }
  compute_group_advantages(rewards);
  std::vector<Sample> out;
  for (size_t k = 0; k < scored.size(); ++k) {
    for (Sample& s : episode_samples(*scored[k], rewards[0].samples[k].advantage))
      out.push_back(std::move(s));
  }
  return out;
}

Sample demonstration_sample(const ojson& messages, const ojson& tools,
                            const text::ChatTemplate& chat, const text::Tokenizer& tokenizer,
                            const std::vector<int32_t>& prefix, text::ToolCallFormat format,
                            int32_t eos) {
  if (!messages.is_array() || messages.empty()) {
    throw std::invalid_argument("a demonstration must be a non-empty list of messages");
  }
  text::ChatRenderOptions ro;
  ro.tools = tools;
  text::ChatTrajectory traj(chat, tokenizer, prefix, ro);
  ojson held = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      throw std::invalid_argument("demonstration message " + std::to_string(i) +
                                  " is not an object with a string \"role\"");
    }
    if (m["role"].get<std::string>() != "assistant") {
      held.push_back(m);
      continue;
    }
    traj.extend(held);
    std::string text =
        m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
    bool calls = false;
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (const auto& c : m["tool_calls"]) {
        const ojson* f = c.is_object() && c.contains("function") ? &c["function"] : nullptr;
        if (f == nullptr || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string() ||
            !f->contains("arguments")) {
          throw std::invalid_argument(
              "demonstration message " + std::to_string(i) +
              ": a tool call must be {\"function\": "
              "{\"name\": string, \"arguments\": object or string}}, not " +
              c.dump(-1, ' ', false, ojson::error_handler_t::replace).substr(0, 120));
        }
        text::ToolCall call;
        call.name = (*f)["name"].get<std::string>();
        call.arguments = (*f)["arguments"];
        text += (text.empty() ? "" : "\n") + text::format_tool_call(format, call);
        calls = true;
      }
    }
    std::vector<int32_t> ids = tokenizer.encode(text);
    // A Hermes call turn ends at its stop string; every other turn at the end of turn.
    if (!(calls && format == text::ToolCallFormat::kHermes)) ids.push_back(eos);
    traj.append_completion(ids, m);
    held.push_back(m);
  }
  Episode ep;
  ep.ids = traj.ids();
  ep.mask = traj.mask();
  ep.segments = traj.segment_starts();
  ep.logprobs.assign(ep.ids.size(), 0.0f);
  ep.versions.assign(ep.ids.size(), -1);
  auto samples = episode_samples(ep, 0.0);
  if (samples.size() != 1) {
    throw std::invalid_argument(
        fmt::format("a demonstration must render as one segment with a reply (got {} samples)",
                    samples.size()));
  }
  return std::move(samples[0]);
}

}  // namespace crl::trainer
