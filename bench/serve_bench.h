// `colocated-rl bench serve`: the HTTP API under load, measured from a separate client process.
//
// Starts `colocated-rl serve --port 0` as a child process (or uses --url), then for each
// concurrency level runs that many clients, each sending streaming /v1/completions requests
// back to back (random prompt token ids, ignore_eos, fixed output length) for --seconds.
// Reports requests/s, output tokens/s, and p50/p90/p99 of time to first token (TTFT) and of
// inter-token latency (ITL: gap between two streamed tokens), as a table plus one JSON line.
//
// --multi-turn T: chat episodes of T turns instead (each client runs --episodes of them, one
// after another), once with a session per episode (server/sessions.h) and once without (the
// baseline: the client resends the conversation and the server renders and encodes it afresh),
// in one run. Reports, for the turns after the first, the share of prompt tokens the prefix cache
// served (usage.prompt_tokens_details.cached_tokens), the prompt tokens prefilled per turn, and
// the median turn latency.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace crl::bench {

struct ServeBenchOptions {
  std::string url;                   // empty: start a server child process
  std::string model_dir;             // child server: --model (empty: embedded default)
  int32_t threads = 2;               // child server: --threads
  int32_t max_seqs = 64;             // child server: --max-seqs
  std::string kv_memory = "256MiB";  // child server: --kv-memory
  std::vector<int32_t> concurrency = {1, 16, 64};
  double seconds = 15;  // per concurrency level
  int32_t prompt_len = 32;
  int32_t max_tokens = 64;
  uint64_t seed = 7;
  std::string json_out;    // also append the JSON line to this file
  bool json = false;       // --json: the JSON line on stdout too
  std::string api_key;     // sent as a bearer token; the child server requires it
  int32_t multi_turn = 0;  // > 0: chat episodes of this many turns (see above)
  int32_t episodes = 4;    // per client, --multi-turn
};

void add_serve_bench_flags(CLI::App& cmd, ServeBenchOptions& opts);
int run_serve_bench(const ServeBenchOptions& opts);

}  // namespace crl::bench
