// Trainer -> engine weight-sync jobs, one rank's side: `colocated-rl sync-check` (correctness on
// the embedded default; sync_check.cpp) and `colocated-rl bench sync` (bucket vs per-tensor vs raw
// broadcast; sync_bench.cpp). Their reports and the trainers' checksums go through a
// sync::Coordinator.
//
// Train ranks hold fp32 master weights and change them before every sync (a seeded stand-in for
// an optimizer step, the same on every train rank, as data-parallel replicas are); infer ranks run
// a real LlmEngine whose weights live in the sync buckets and keep generating until the update is
// ready, then receive it in place between two steps and apply it (LlmEngine::apply_weight_update).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine_config.h"
#include "sync/dist_env.h"
#include "sync/weight_sync.h"

namespace crl::bench {

struct SyncJobOptions {
  engine::EngineConfig engine;  // resolved (model_dir set)
  int infer_per_node = 1;
  int train_per_node = 1;
  int64_t bucket_bytes = int64_t{256} << 20;
  sync::WeightSyncOptions sync;
  std::chrono::milliseconds timeout{60000};
  std::string comm_backend = "auto";
  std::string colocate = "auto";  // sync/placement.h: paired or fan-out weight sync
  int syncs = 3;
  // Test-only fault injection: "never-join:R", "die-mid-sync:R", "layout-mismatch:R" (world rank
  // R).
  std::string fault;
  bool json = false;
};

// sync-check: runs `syncs` syncs and checks after each that every engine weight is bit-identical to
// the trainer's (per-tensor checksums through the store) and, after the last, that the engine's
// greedy output equals the trainer model's. World rank 0 prints the table. Returns 0 when all hold.
int run_sync_check_rank(const sync::RankEnv& env, const SyncJobOptions& options);

struct SyncBenchOptions {
  std::string shape = "default";  // preset (engine/model/model_cache)
  std::string engine_dtype = "float32";
  // "cuda": rank r on GPU r mod the device count; a GPU per rank syncs over NCCL, ranks sharing
  // a GPU over CUDA IPC (then the per-tensor and raw baselines give way to a plain device copy of
  // the same bytes on each receiver, the "copy" row).
  std::string device = "cpu";
  int infer_per_node = 1;
  int train_per_node = 1;
  int64_t bucket_bytes = int64_t{256} << 20;
  int repeats = 5;
  std::chrono::milliseconds timeout{120000};
  std::string results_file;  // JSONL rows appended by world rank 0
  // > 0: a "lora-rR" row too: an all-linear adapter of this rank synced alone (LoRA RL's update,
  // issue 29) into the engine's LoRA receive buffers and loaded into its slot, in the same run as
  // the whole model's bucket sync.
  int64_t lora_rank = 0;
  // > 1 (CPU): every engine a tensor-parallel group of this many ranks, and the rows are its two
  // ways to take an update: "staged" (the whole model's buckets on the leader, every rank copying
  // its slices) and "lanes" (each rank's slices over a sync lane of its own); MB is what the
  // engine rank receiving the most received.
  int infer_tp = 1;
};

// One (shape, dtype, topology) cell: bucket mode, per-tensor baseline and one raw broadcast of the
// same byte count (with CUDA IPC: bucket mode and a device copy), `repeats` times each, medians.
// World rank 0 appends one JSON row per mode.
int run_sync_bench_rank(const sync::RankEnv& env, const SyncBenchOptions& options);

// Renders the rows of a results file as the benchmark's table.
std::string format_sync_bench_table(const std::string& results_file);

}  // namespace crl::bench
