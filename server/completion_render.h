// CompletionRenderer: turns the engine outputs of one API request into OpenAI JSON, either one
// response or a stream of SSE chunks whose text deltas concatenate to the final text.
//
// Choice i * n + k is sample k of prompt i. Streaming text is decoded from the cumulative token
// ids at every update; text is held back while it ends in an incomplete UTF-8 character, and by
// (longest stop string - 1) bytes while stop strings are set, so no delta is ever taken back.
//
// Thread safety: none; one handler thread owns it. The tokenizer is only read.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "server/api_types.h"
#include "text/tokenizer.h"

namespace crl::server {

class CompletionRenderer {
 public:
  // `echo_texts`: per prompt, the text to put before the completion (empty strings unless echo).
  CompletionRenderer(const CompletionJob& job, std::string id, std::string model, int64_t created,
                     const text::Tokenizer* tokenizer, std::vector<std::string> echo_texts);

  // SSE events ("data: {...}\n\n") for everything new in `snap` since the last call. An output
  // that carries an engine error becomes an error event.
  std::string stream_update(const engine::RequestChannel::Snapshot& snap);
  // The closing events: the usage chunk when stream_options.include_usage, then [DONE].
  std::string stream_end(const engine::RequestChannel::Snapshot& snap) const;

  // The whole (non-streaming) response. REQUIRES: snap.all_finished. Throws ApiError(500) when
  // the engine failed a request.
  nlohmann::json response(const engine::RequestChannel::Snapshot& snap) const;

  nlohmann::json usage(const engine::RequestChannel::Snapshot& snap) const;
  // The newest weight version among the outputs (-1 when there are none yet).
  static int64_t weight_version(const engine::RequestChannel::Snapshot& snap);
  // The oldest weight version that produced a token of the response (an update may land while a
  // request runs; weight_version() is the newest).
  static int64_t first_weight_version(const engine::RequestChannel::Snapshot& snap);

 private:
  struct ChoiceState {
    std::string text_sent;
    size_t tokens_sent = 0;
    int64_t text_offset = 0;  // completions logprobs: text length before the next token
    bool started = false;     // first chunk (role / echo) sent
    bool finished = false;
  };

  struct TokenRepr {
    std::string text;   // as UTF-8; an incomplete character is U+FFFD
    std::string bytes;  // exact
  };
  // Token `id` as a log-prob entry shows it when it stands at position `pos` of `ids` (the
  // completion's tokens; the ones before `pos` are its context).
  TokenRepr token_repr(const std::vector<int32_t>& ids, size_t pos, int32_t id) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  // Log-probs of tokens [from, to) of a completion, in the endpoint's format.
  nlohmann::json logprobs_json(const engine::CompletionOutput& c, size_t from, size_t to,
                               int64_t* text_offset) const;
  nlohmann::json chunk(size_t choice, nlohmann::json body_fields, int64_t weight_version) const;

  CompletionJob job_;
  std::string id_;
  std::string model_;
  int64_t created_;
  const text::Tokenizer* tokenizer_;
  std::vector<std::string> echo_texts_;
  std::vector<ChoiceState> choices_;
  size_t max_stop_len_ = 0;
  bool error_sent_ = false;
};

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump_json(const nlohmann::json& j);

}  // namespace crl::server
