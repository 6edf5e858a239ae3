// `colocated-rl bench train`: the trainer alone over ZeRO stages, train-rank counts, activation
// checkpointing and optimizer offload, in one run (issue 14's benchmark).
//
// Each cell runs T train ranks as threads of this process over Gloo (one intra-op thread each when
// the cores allow), SFT steps on random packed sequences of --seq-tokens tokens, --micro-batches
// micro-batches per rank per step. Reported per cell: training-state bytes of rank 0 by kind
// (parameters, gradients, optimizer) beside the stage-2 ideal for its dtypes, activations and
// transients (process peak RSS during the steps minus the resident size before them, / T),
// trained tokens/s (median step), the ratio to stage 0 at the same T, and the share of the
// measured matmul throughput (6 x params x tokens / time against a GEMM of the model's own shapes
// timed in the same run). With --cpu-kernels project,libtorch every cell runs on both linear
// paths, back to back, and the ratio of their tokens/s follows the table. With --lora-rank R every
// cell runs again training a rank-R adapter on the frozen base, and its state bytes and tokens/s
// against full fine-tuning's follow the table. With --logits-chunk-tokens A,B every cell runs at
// each chunk size of the loss's logits.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace crl::bench {

struct TrainBenchOptions {
  std::string shape = "smollm2-135m";
  std::string zero = "0,1,2";
  std::string train_ranks = "1,2";
  bool activation_checkpointing = false;  // add checkpointing cells
  bool offload_optimizer = false;         // add offload cells
  bool zero3_no_prefetch = false;         // every stage-3 cell again without the gather prefetch
  std::string dtype = "float32";          // compute dtype
  std::string cpu_kernels = "libtorch";   // TrainerOptions::cpu_kernels values, comma-separated
  int64_t seq_tokens = 512;
  int micro_batches = 2;
  int steps = 3;  // timed steps per cell (after one warm-up)
  int64_t bucket_mb = 64;
  std::string results;    // JSONL rows
  int64_t lora_rank = 0;  // > 0: every cell again training an all-linear LoRA
                          // adapter of this rank (issue 29), compared after
  // TrainerOptions::logits_chunk_tokens values, comma-separated: with more than one, every cell
  // runs at each (issue 55), and the activations and tokens/s of each against the first follow
  // the table.
  std::string logits_chunk_tokens = "0";
};

void add_train_bench_flags(CLI::App& cmd, TrainBenchOptions& o);
int run_train_bench(const TrainBenchOptions& o);

}  // namespace crl::bench
