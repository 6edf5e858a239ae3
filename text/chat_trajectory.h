// ChatTrajectory: the token ids of a multi-turn conversation, grown by appending and never by
// re-encoding what is already there (issue 28: token-exact sessions).
//
// Each turn the caller gives the whole conversation so far (OpenAI's stateless form: the earlier
// messages, the assistant replies as it received them, then the new user or tool messages).
// The trajectory checks that it extends the messages it holds, renders it with the model's
// template, and appends the ids of only the text the template adds for the new messages:
//
//   H = render(held messages), A = render(all messages, generation prompt open)
//   appended = encode(rest of the closer + A[|H|..])   when A starts with H
//
// The assistant turns are the model's own sampled ids (append_completion), never the template's
// render of the reply: a reply that decodes and re-encodes differently, or whose tool calls the
// template prints in another format, keeps the tokens the log-probs belong to. The closer is the
// text the template writes after an assistant reply ("<|im_end|>\n"); the part of it the model
// did not sample (all of it after a length stop, "\n" after a sampled <|im_end|>) is appended
// before the new messages.
//
// A template that rewrites earlier turns when the conversation grows (Qwen3 drops the <think>
// part of earlier replies) is not prefix-preserving: A does not start with H. The trajectory then
// keeps the earlier turns as they are (the replies as sampled, reasoning included: what the model
// wrote is what it reads, and what it is trained on) and appends what the template writes for
// the new messages alone, rendered against a fixed base conversation (SkyRL's approach):
//
//   appended = encode(rest of the closer + render(base + new, open)[|render(base)|..])
//
// with base one user message, so the session stays one trajectory (Turn::rebased), when that text
// is also how the fresh render of the whole conversation ends. Only where that fails too (new
// messages with an assistant among them, a template that refuses the base or writes the new
// messages differently after it) does it start a new segment: the turn's prompt is then the fresh
// render of the whole conversation, and the ids so far stay as an earlier segment (one training
// sample each). probe_prefix_preserving() says up front whether a template rewrites earlier turns.
//
// Not thread-safe; one trajectory per session. REQUIRES: `chat` and `tokenizer` outlive it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "text/chat_encoder.h"
#include "text/chat_template.h"

namespace crl::text {

class Tokenizer;

// The conversation does not extend the trajectory: message `index` differs from the one held
// (or is missing). The server answers 409 with what().
class NotAnExtension : public std::invalid_argument {
 public:
  NotAnExtension(size_t index, const std::string& why);
  size_t index() const { return index_; }

 private:
  size_t index_;
};

class ChatTrajectory {
 public:
  // `prefix`: what ChatEncoder puts before a render (the BOS of a built-in format, else nothing).
  // `options` are the template options of every turn (tools, kwargs); the generation prompt is
  // always open.
  ChatTrajectory(const ChatTemplate& chat, const text::Tokenizer& tokenizer,
                 std::vector<int32_t> prefix = {}, ChatRenderOptions options = {});

  struct Turn {
    std::vector<int32_t> appended;  // the ids this turn added (what the engine prefills)
    bool new_segment = false;       // a fresh render of the whole conversation (see above)
    bool rebased = false;           // the template rewrites earlier turns: the new messages
                                    // rendered against the fixed base
    bool rewound = false;           // a retry: the last turn was taken back first
  };
  // Appends the new messages of `messages` (the whole conversation so far; it must extend the
  // held messages by at least one). A conversation that extends the held messages as they were
  // before the last turn is a retry of that turn: the turn (its prompt and reply) is taken back
  // first (an assistant message where the engine's reply stood is an edit, not a retry). Throws
  // NotAnExtension naming the first message that differs, std::invalid_argument or
  // jinja::TemplateError when the template refuses the conversation (nothing is changed then).
  Turn extend(const nlohmann::ordered_json& messages);

  // Takes the open turn back as if its extend never ran (a request refused or never started
  // after the turn was made: the session, its retry point included, is as before). REQUIRES: a
  // turn is open.
  void abort_turn();
  // The model's reply to the open turn: its sampled ids (the stop token included when it stopped
  // on one) and the assistant message the caller handed out for them. REQUIRES: a turn is open.
  void append_completion(const std::vector<int32_t>& ids, const nlohmann::ordered_json& message);

  // All ids so far, segment after segment, and a mask (1: sampled by the model, 0: prompt, tool
  // and environment text).
  const std::vector<int32_t>& ids() const { return ids_; }
  const std::vector<uint8_t>& mask() const { return mask_; }
  // Where each segment starts in ids() (the first is 0). The engine's prompt is the last segment.
  const std::vector<size_t>& segment_starts() const { return segments_; }
  std::vector<int32_t> prompt() const;
  size_t num_messages() const { return messages_.size(); }
  bool turn_open() const { return open_; }

 private:
  struct Mark {  // the state before a turn: what a retry rewinds to
    size_t messages, ids, segments;
    std::string closer_rest;
  };
  void rewind(const Mark& m);
  struct Undo {  // the state before the open turn's extend (abort_turn)
    nlohmann::ordered_json messages;
    size_t ids_kept;  // ids_ up to here stayed; a rewound turn's ids follow
    std::vector<int32_t> ids_tail;
    std::vector<uint8_t> mask_tail;
    std::vector<size_t> segments;
    std::string closer_rest;
    std::optional<Mark> last_turn;
    bool open;
  };

  const ChatTemplate& chat_;
  const text::Tokenizer& tokenizer_;
  ChatEncoder encoder_;  // no prefix: it encodes appended text
  std::vector<int32_t> prefix_;
  ChatRenderOptions options_;
  std::optional<std::string> closer_;  // after an assistant reply; unset: the template hides it

  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
  std::vector<int32_t> ids_;
  std::vector<uint8_t> mask_;
  std::vector<size_t> segments_;
  std::string closer_rest_;  // the closer's text not yet in ids_ (after the last reply)
  bool open_ = false;        // a prompt is appended and its reply is not
  std::optional<Mark> last_turn_;
  std::optional<Undo> undo_;  // while a turn is open
};

// Why the template is not prefix-preserving (it rewrites an earlier turn when the conversation
// grows, shown on a probe conversation with reasoning and a tool call), or nullopt when it is.
std::optional<std::string> probe_prefix_preserving(const ChatTemplate& chat,
                                                   const ChatRenderOptions& options = {});

}  // namespace crl::text
