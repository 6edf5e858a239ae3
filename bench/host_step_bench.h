// `colocated-rl bench host-step`: the engine's host work of one decode step, without a model: what
// a GPU step waits for between two forwards unless it is overlapped (issue 47's target: <= 0.3 ms
// at 256 sequences on the development machine's CPU).
//
// Real engine parts on the workload of the rollout benchmark (S sequences, prompts uniform in
// --prompt-len, EOS ignored): the Scheduler (continuous batching, prefix caching, block
// allocation), the step's inputs as a decode CUDA graph takes them (engine/step_inputs: token ids,
// positions, slots, block tables of --max-model-len / block-size columns) and the postprocess
// (append the sampled tokens, stop checks, prefix-cache registration). The sampled tokens are drawn
// on the host; the forward, the sampler and every device copy are left out (the GPU benchmark's
// profile times those: `bench rollout --step-trace`). Phases are timed per step; the table gives
// median and p90 microseconds a step over --steps decode steps, after the prompts are prefilled.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace crl::bench {

struct HostStepBenchOptions {
  int32_t seqs = 256;
  std::string prompt_len = "100..1024";
  int32_t steps = 256;
  int32_t block_size = 16;
  int64_t max_model_len = 32768;  // Qwen2-0.5B's: the decode graphs' block-table width
  uint64_t seed = 7;
  std::string json_out;
  bool json = false;  // --json: the JSON line on stdout too
};

void add_host_step_bench_flags(CLI::App& cmd, HostStepBenchOptions& opts);
int run_host_step_bench(const HostStepBenchOptions& opts);

}  // namespace crl::bench
