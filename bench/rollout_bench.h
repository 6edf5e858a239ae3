// `colocated-rl bench rollout`: rollout throughput of the engine against its baselines, in one run.
//
// Workload: P prompts x n samples, prompt and output lengths fixed or uniform in a range, random
// prompt token ids, temperature 1, ignore_eos (outputs run to their drawn length). Modes:
//   continuous — the engine as shipped (continuous batching, prompt blocks shared by the n
//   samples); static     — baseline: waves of requests, every sequence decodes until its wave's
//   slowest; no-share   — baseline: the n samples as n independent requests, prefix caching off;
//   deterministic — continuous with batch-invariant logits (measures what that mode costs);
//   libtorch   — continuous with at::linear everywhere (--cpu-kernels libtorch);
//   host-sampler — baseline on a device: continuous with each step's logits copied to the host
//                  and sampled there (--sampler cpu), as before the tensor sampler;
//   eager      — baseline on a device: continuous without CUDA graphs (--cuda-graphs off);
//   lora-1, lora-4 — continuous with 1 or 4 LoRA adapters (rank --lora-rank, all linear layers),
//                  unmerged, the requests taking them in turn: what serving adapters costs.
// Every mode reports its host time per engine phase (schedule, forward, sample, finish; on a
// device the sample phase waits for the device) and its device->host bytes per engine step; on a
// device the run also reports its share of the memory roofline (the weights read once a step plus
// every decode step's KV, over the device's own measured copy bandwidth). Probes: decode step time
// at fixed concurrency (1 and --decode-batch sequences) against the machine's measured matmul
// throughput and memory bandwidth, and prefill throughput. Prints a table and one JSON line;
// medians over --repeats after a warmup. --workload-out writes the drawn workload so that
// bench/hf_generate.py runs Hugging Face generate on the same requests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace crl::bench {

struct RolloutBenchOptions {
  std::string model_dir;          // empty: generate --shape into the cache
  std::string shape = "default";  // preset used when model_dir is empty
  std::string dtype = "float32";
  int32_t prompts = 32;
  int32_t n = 4;
  std::string prompt_len = "32..128";  // "L" or "A..B"
  std::string output_len = "16..256";
  int32_t repeats = 3;
  int32_t threads = 2;
  int32_t max_seqs = 128;
  int64_t max_batched_tokens = 1024;
  std::string kv_memory = "2GiB";
  std::vector<std::string> modes = {"continuous", "static", "no-share", "deterministic"};
  bool probes = true;  // decode/prefill probes and machine roofline
  int32_t decode_batch = 64;
  uint64_t seed = 7;
  std::string json_out;        // also append the JSON line to this file
  bool json = false;           // --json: the JSON line on stdout too
  std::string device = "cpu";  // cpu or cuda (the probes are CPU-only)
  std::string workload_out;    // write the workload (prompt ids, output lengths) as JSON
  std::string workload_in;     // read the workload from such a JSON instead of drawing it
  // The first mode's first timed repeat, step by step (bench/step_profile.h): a JSON line per step,
  // and Kineto traces PREFIX.A.json of the steps in `profile_steps` ("A:N[,B:M]").
  std::string step_trace;
  std::string profile;
  std::string profile_steps = "20:3";
  int32_t lora_rank = 32;  // the lora-1 / lora-4 modes' adapters
};

void add_rollout_flags(CLI::App& cmd, RolloutBenchOptions& opts);
int run_rollout_bench(const RolloutBenchOptions& opts);

}  // namespace crl::bench
