#include "text/chat_trajectory.h"

#include <utility>

#include "text/tokenizer.h"

namespace crl::text {
namespace {

using ojson = nlohmann::ordered_json;

// A message as compared between turns: keys with null values and an empty tool_calls list are
// what clients add or drop when they send a reply back, not edits.
nlohmann::json comparable(const ojson& m) {
  nlohmann::json out = nlohmann::json::parse(m.dump());
  if (!out.is_object()) return out;
  for (auto it = out.begin(); it != out.end();) {
    if (it->is_null() || (it.key() == "tool_calls" && it->is_array() && it->empty())) {
      it = out.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

// The first index where `messages` and `held[0..count)` differ (count when they agree).
size_t first_difference(const ojson& messages, const ojson& held, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (i >= messages.size() || comparable(messages[i]) != comparable(held[i])) return i;
  }
  return count;
}

// `s` as a JSON string (escaped; a character cut in two becomes U+FFFD).
std::string quoted(const std::string& s) {
  return ojson(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ChatRenderOptions closed(ChatRenderOptions o) {
  o.add_generation_prompt = false;
  o.continue_final_message = false;
  return o;
}

ChatRenderOptions open(ChatRenderOptions o) {
  o.add_generation_prompt = true;
  o.continue_final_message = false;
  return o;
}

// Whether message `i` exists and is the assistant's.
bool is_assistant(const ojson& messages, size_t i) {
  return i < messages.size() && messages[i].is_object() &&
         messages[i].value("role", "") == "assistant";
}

ojson head(const ojson& messages, size_t count) {
  ojson out = ojson::array();
  for (size_t i = 0; i < count; ++i) out.push_back(messages[i]);
  return out;
}

ojson tail(const ojson& messages, size_t from) {
  ojson out = ojson::array();
  for (size_t i = from; i < messages.size(); ++i) out.push_back(messages[i]);
  return out;
}

// The text the template writes after an assistant reply: the render of a reply whose content is a
// marker, after the marker. nullopt when the template does not show the content as given.
std::optional<std::string> reply_closer(const ChatTemplate& chat, const ChatRenderOptions& o) {
  const std::string marker = "crlReplyMarker7f3a";  // no space: templates trim contents
  ojson messages = ojson::array(
      {{{"role", "user"}, {"content", "u"}}, {{"role", "assistant"}, {"content", marker}}});
  std::string text;
  try {
    text = chat.render(messages, closed(o));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  size_t at = text.rfind(marker);
  if (at == std::string::npos) return std::nullopt;
  return text.substr(at + marker.size());
}

// The text the template writes for `added` (no assistant among them) after a conversation, with
// the generation prompt open, rendered against a fixed base conversation that ends with a user
// message: render(base + added, open) after render(base, closed). nullopt when the template
// refuses that or rewrites the base (then the caller starts a new segment).
std::optional<std::string> rendered_against_base(const ChatTemplate& chat, const ojson& added,
                                                 const ChatRenderOptions& o) {
  for (const ojson& m : added) {
    if (!m.is_object() || m.value("role", "") == "assistant") return std::nullopt;
  }
  const ojson base = ojson::array({{{"role", "user"}, {"content", "crlBaseTurn"}}});
  ojson with = base;
  for (const ojson& m : added) with.push_back(m);
  try {
    const std::string before = chat.render(base, closed(o));
    const std::string after = chat.render(with, open(o));
    if (after.compare(0, before.size(), before) != 0) return std::nullopt;
    return after.substr(before.size());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

NotAnExtension::NotAnExtension(size_t index, const std::string& why)
    : std::invalid_argument(why), index_(index) {}

ChatTrajectory::ChatTrajectory(const ChatTemplate& chat, const text::Tokenizer& tokenizer,
                               std::vector<int32_t> prefix, ChatRenderOptions options)
    : chat_(chat),
      tokenizer_(tokenizer),
      encoder_(tokenizer),
      prefix_(std::move(prefix)),
      options_(std::move(options)),
      closer_(reply_closer(chat_, options_)) {}

ChatTrajectory::Turn ChatTrajectory::extend(const ojson& messages) {
  if (!messages.is_array()) throw std::invalid_argument("messages must be a list");
  Turn turn;
  // Where this turn starts: after the held messages, or (a retry, or a turn whose reply never
  // came) where the last turn started.
  std::optional<Mark> base;
  const size_t held = messages_.size();
  const size_t d = first_difference(messages, messages_, held);
  if (d == held && messages.size() > held && !open_) {
    // extends everything held
  } else if (d == held && messages.size() == held && !open_) {
    throw NotAnExtension(
        d, "the conversation adds no message to the session's " + std::to_string(held));
  } else if (last_turn_ && messages.size() > last_turn_->messages &&
             first_difference(messages, messages_, last_turn_->messages) == last_turn_->messages &&
             !(!open_ && is_assistant(messages, held - 1))) {
    // A retry resends what came before the last turn and asks anew; an assistant message where
    // the engine's reply stood would be a reply it did not sample (an edit: refused below).
    base = last_turn_;
    turn.rewound = true;
  } else if (d >= messages.size()) {
    throw NotAnExtension(d, "the conversation has " + std::to_string(messages.size()) +
                                " messages, the session " + std::to_string(held) +
                                ": a session only grows");
  } else {
    throw NotAnExtension(d, "message " + std::to_string(d) +
                                " differs from the session's (a session only grows: send the "
                                "earlier messages as they were, the assistant's replies as "
                                "returned)");
  }
  const size_t base_messages = base ? base->messages : held;
  const std::string& rest = base ? base->closer_rest : closer_rest_;

  const std::string all = chat_.render(messages, open(options_));
  std::string history;
  if (base_messages > 0 && closer_)
    history = chat_.render(head(messages, base_messages), closed(options_));
  std::optional<std::string> rebased;
  if (base_messages > 0 && closer_ && all.compare(0, history.size(), history) != 0 &&
      is_assistant(messages, base_messages - 1)) {
    rebased = rendered_against_base(chat_, tail(messages, base_messages), options_);
    // The new messages must read as the fresh render of the whole conversation writes them: a
    // template whose markup depends on what came before (turn state, role alternation) would
    // give other text against the base, and then starts a new segment instead.
    if (rebased && (rebased->size() > all.size() ||
                    all.compare(all.size() - rebased->size(), rebased->size(), *rebased) != 0)) {
      rebased.reset();
    }
  }
  if (base_messages > 0 && closer_ && all.compare(0, history.size(), history) == 0) {
    turn.appended = encoder_.encode(rest + all.substr(history.size()));
  } else if (rebased) {
    // The template rewrites earlier turns (Qwen3 drops their reasoning): the session keeps them
    // as sampled and appends what the template writes for the new messages alone.
    turn.appended = encoder_.encode(rest + *rebased);
    turn.rebased = true;
  } else {
    turn.new_segment = base_messages > 0;
    turn.appended = prefix_;
    std::vector<int32_t> ids = encoder_.encode(all);
    turn.appended.insert(turn.appended.end(), ids.begin(), ids.end());
  }

  // What abort_turn puts back: the held state, including a rewound turn's ids.
  const size_t kept = base ? base->ids : ids_.size();
  undo_ = Undo{messages_,
               kept,
               std::vector<int32_t>(ids_.begin() + static_cast<std::ptrdiff_t>(kept), ids_.end()),
               std::vector<uint8_t>(mask_.begin() + static_cast<std::ptrdiff_t>(kept), mask_.end()),
               segments_,
               closer_rest_,
               last_turn_,
               open_};
  if (base) rewind(*base);
  last_turn_ = Mark{messages_.size(), ids_.size(), segments_.size(), closer_rest_};
  if (segments_.empty() || turn.new_segment) segments_.push_back(ids_.size());
  ids_.insert(ids_.end(), turn.appended.begin(), turn.appended.end());
  mask_.insert(mask_.end(), turn.appended.size(), 0);
  messages_ = messages;
  closer_rest_.clear();
  open_ = true;
  return turn;
}

void ChatTrajectory::abort_turn() {
  if (!open_ || !undo_) throw std::logic_error("abort_turn: no turn is open");
  Undo& u = *undo_;
  ids_.resize(u.ids_kept);
  mask_.resize(u.ids_kept);
  ids_.insert(ids_.end(), u.ids_tail.begin(), u.ids_tail.end());
  mask_.insert(mask_.end(), u.mask_tail.begin(), u.mask_tail.end());
  segments_ = std::move(u.segments);
  messages_ = std::move(u.messages);
  closer_rest_ = std::move(u.closer_rest);
  last_turn_ = u.last_turn;
  open_ = u.open;
  undo_.reset();
}

void ChatTrajectory::append_completion(const std::vector<int32_t>& ids, const ojson& message) {
  if (!open_) throw std::logic_error("append_completion: no turn is open");
  undo_.reset();
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  mask_.insert(mask_.end(), ids.size(), 1);
  messages_.push_back(message);
  open_ = false;
  // The closer's text not sampled: all of it, less the stop token the model ended on.
  closer_rest_ = closer_.value_or("");
  if (!ids.empty() && tokenizer_.is_special(ids.back())) {
    const std::string stop = tokenizer_.decode({ids.back()}, /*skip_special_tokens=*/false);
    if (!stop.empty() && closer_rest_.compare(0, stop.size(), stop) == 0) {
      closer_rest_ = closer_rest_.substr(stop.size());
    }
  }
}

std::vector<int32_t> ChatTrajectory::prompt() const {
  if (segments_.empty()) return {};
  return std::vector<int32_t>(ids_.begin() + static_cast<std::ptrdiff_t>(segments_.back()),
                              ids_.end());
}

void ChatTrajectory::rewind(const Mark& m) {
  messages_ = head(messages_, m.messages);
  ids_.resize(m.ids);
  mask_.resize(m.ids);
  segments_.resize(m.segments);
  closer_rest_ = m.closer_rest;
  open_ = false;
  last_turn_.reset();
}

std::optional<std::string> probe_prefix_preserving(const ChatTemplate& chat,
                                                   const ChatRenderOptions& options) {
  // With reasoning and a tool call first; templates that know no tool role get the plain one.
  const ojson with_tools = ojson::parse(R"([
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "<think>\nUse the tool.\n</think>\n\n",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "add", "arguments": {"a": 12, "b": 30}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "42"},
    {"role": "assistant", "content": "<think>\nThe tool says 42.\n</think>\n\n12 + 30 = 42."},
    {"role": "user", "content": "And 42 + 1?"}])");
  const ojson plain = ojson::parse(R"([
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "<think>\nAdd the tens.\n</think>\n\n12 + 30 = 42."},
    {"role": "user", "content": "And 42 + 1?"},
    {"role": "assistant", "content": "<think>\nOne more.\n</think>\n\n43."},
    {"role": "user", "content": "Thanks."}])");
  std::string last_error;
  for (const ojson* probe : {&with_tools, &plain}) {
    try {
      for (size_t k = 1; k < probe->size(); ++k) {
        if ((*probe)[k - 1]["role"] != "assistant") continue;
        const std::string history = chat.render(head(*probe, k), closed(options));
        const std::string all = chat.render(head(*probe, k + 1), open(options));
        if (all.compare(0, history.size(), history) != 0) {
          size_t at = 0;
          while (at < history.size() && at < all.size() && history[at] == all[at]) ++at;
          return "adding message " + std::to_string(k) + " (" +
                 (*probe)[k]["role"].get<std::string>() +
                 ") rewrites the render of the messages before it at byte " + std::to_string(at) +
                 ": " + quoted(history.substr(at, 40)) + " becomes " + quoted(all.substr(at, 40));
        }
      }
      return std::nullopt;
    } catch (const std::exception& e) {
      last_error = e.what();
    }
  }
  return "the probe conversations do not render: " + last_error;
}

}  // namespace crl::text
