// JSON forms of engine requests and outputs for the CLI (--jsonl input, --json output).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/llm_engine.h"

namespace crl::app {

// Reads one request per non-empty line. Each row: "prompt" (string) or "prompt_token_ids"
// (array of ints), optional "id", and optional sampling fields (n, max_tokens, min_tokens,
// temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos, logprobs,
// prompt_logprobs) overriding `defaults`. Throws std::invalid_argument naming file:line.
std::vector<engine::GenerateRequest> read_requests_jsonl(const std::string& path,
                                                         const engine::SamplingParams& defaults);

nlohmann::json request_output_to_json(const engine::RequestOutput& out,
                                      const text::Tokenizer* tokenizer);

}  // namespace crl::app
