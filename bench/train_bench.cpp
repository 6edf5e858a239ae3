#include "bench/train_bench.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "common/check.h"
#include "engine/kernels/cpu_isa.h"
#include "engine/model/config.h"
#include "engine/model/model_cache.h"
#include "sync/local_ranks.h"
#include "trainer/memory_plan.h"
#include "trainer/micro_batch.h"
#include "trainer/trainer.h"

namespace crl::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> int_list(const std::string& csv, const char* flag) {
  std::vector<int> out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      out.push_back(std::stoi(item));
    } catch (const std::exception&) {
      CRL_INVALID("bench train: ", flag, " wants comma-separated integers, got '", csv, "'");
    }
  }
  return out;
}

// /proc/self/status field in bytes (VmRSS, VmHWM).
int64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// Resets the process's peak RSS to the current RSS (Linux clear_refs 5).
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// GFLOP/s of the model's own matmuls (q, k, v, o, gate, up, down, lm_head) at `m` rows.
double model_gemm_gflops(const engine::ModelConfig& c, int64_t m, at::ScalarType dt) {
  const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  std::vector<std::pair<int64_t, int64_t>> shapes = {{c.hidden_size, q},
                                                     {c.hidden_size, kv},
                                                     {c.hidden_size, kv},
                                                     {q, c.hidden_size},
                                                     {c.hidden_size, c.intermediate_size},
                                                     {c.hidden_size, c.intermediate_size},
                                                     {c.intermediate_size, c.hidden_size},
                                                     {c.hidden_size, c.vocab_size}};
  double flops = 0, best = 1e30;
  std::vector<std::pair<at::Tensor, at::Tensor>> ops;
  for (auto [k, n] : shapes) {
    ops.emplace_back(at::randn({m, k}).to(dt), at::randn({k, n}).to(dt));
    flops += 2.0 * m * k * n;
  }
  for (int rep = 0; rep < 4; ++rep) {
    auto t0 = Clock::now();
    for (auto& [a, b] : ops) (void)at::mm(a, b);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return flops / best / 1e9;
}

struct Cell {
  int ranks = 1, stage = 0;
  bool ac = false, offload = false;
  std::string kernels = "libtorch";
  int64_t lora = 0;  // LoRA rank (0: full fine-tuning)
  int64_t logits_chunk = 0;
  bool prefetch = true;  // stage 3: the next layer's gather while this one computes
};

// The zero column: the stage, "3np" for stage 3 without the gather prefetch.
std::string zero_label(const Cell& c) {
  return c.stage == 3 && !c.prefetch ? "3np" : std::to_string(c.stage);
}

}  // namespace

void add_train_bench_flags(CLI::App& cmd, TrainBenchOptions& o) {
  cmd.add_option("--shape", o.shape, "model preset (random weights)")->capture_default_str();
  cmd.add_option("--zero", o.zero, "ZeRO stages, comma-separated")->capture_default_str();
  cmd.add_option("--train-ranks", o.train_ranks, "train rank counts, comma-separated")
      ->capture_default_str();
  cmd.add_flag("--activation-checkpointing", o.activation_checkpointing,
               "add activation-checkpointing cells (one rank, and the most ranks at stage 2)");
  cmd.add_flag("--offload-optimizer", o.offload_optimizer,
               "add optimizer-offload cells (the most ranks at stage 2)");
  cmd.add_flag("--zero3-no-prefetch", o.zero3_no_prefetch,
               "run every stage-3 cell again without the next layer's gather prefetch (zero "
               "column 3np)");
  cmd.add_option("--dtype", o.dtype, "compute dtype: float32 or bfloat16")->capture_default_str();
  cmd.add_option("--seq-tokens", o.seq_tokens, "tokens per micro-batch (one packed sequence)")
      ->capture_default_str();
  cmd.add_option("--micro-batches", o.micro_batches, "micro-batches per rank per step")
      ->capture_default_str();
  cmd.add_option("--steps", o.steps, "timed steps per cell (after one warm-up)")
      ->capture_default_str();
  cmd.add_option("--bucket-mb", o.bucket_mb, "bucket cap in MiB")->capture_default_str();
  cmd.add_option("--results", o.results, "JSONL file the rows go to")->capture_default_str();
  cmd.add_option(
         "--cpu-kernels", o.cpu_kernels,
         "trainer CPU linear paths, comma-separated: project (the project's kernels), libtorch")
      ->capture_default_str();
  cmd.add_option(
         "--lora-rank", o.lora_rank,
         "also run every cell training an all-linear LoRA adapter of this rank on the frozen "
         "base (0 = full fine-tuning only)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--logits-chunk-tokens", o.logits_chunk_tokens,
                 "the trainer's logits chunk sizes in loss rows, comma-separated (0: automatic); "
                 "with several, every cell runs at each and is compared with the first")
      ->capture_default_str();
}

int run_train_bench(const TrainBenchOptions& o) {
  const std::string dir = engine::ensure_preset_model(o.shape);
  const engine::ModelConfig cfg = engine::load_model_config(dir);
  const at::ScalarType dt = engine::parse_dtype(o.dtype);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<Cell> cells;
  const auto ranks = int_list(o.train_ranks, "--train-ranks");
  const auto stages = int_list(o.zero, "--zero");
  const int most = *std::max_element(ranks.begin(), ranks.end());
  for (int t : ranks) {
    for (int z : stages) {
      if (t == 1 && z > 0) continue;  // one rank: every stage is stage 0
      cells.push_back({t, z});
    }
  }
  if (o.activation_checkpointing) {
    cells.push_back({1, 0, true, false});
    if (most > 1) cells.push_back({most, 2, true, false});
  }
  if (o.offload_optimizer) cells.push_back({most, most > 1 ? 2 : 0, false, true});
  if (o.zero3_no_prefetch) {
    const size_t n = cells.size();
    for (size_t i = 0; i < n; ++i) {
      if (cells[i].stage != 3) continue;
      Cell c = cells[i];
      c.prefetch = false;
      cells.push_back(c);
    }
  }
  {
    const auto chunks = int_list(o.logits_chunk_tokens, "--logits-chunk-tokens");
    std::vector<Cell> each;
    for (const Cell& c : cells) {
      for (int chunk : chunks) {
        if (chunk < 0) CRL_INVALID("bench train: --logits-chunk-tokens ", chunk, " is below 0");
        each.push_back(c);
        each.back().logits_chunk = chunk;
      }
    }
    cells = std::move(each);
  }
  {
    std::vector<std::string> kernels;
    std::stringstream ss(o.cpu_kernels);
    for (std::string k; std::getline(ss, k, ',');) {
      if (k != "project" && k != "libtorch") {
        throw std::invalid_argument("--cpu-kernels: '" + k + "' is not project or libtorch");
      }
      kernels.push_back(k);
    }
    std::vector<Cell> each;
    for (const Cell& c : cells) {
      for (const std::string& k : kernels) {
        each.push_back(c);
        each.back().kernels = k;
      }
    }
    cells = std::move(each);
  }
  if (o.lora_rank > 0) {
    std::vector<Cell> both;
    for (const Cell& c : cells) {
      both.push_back(c);
      if (c.stage == 3) continue;  // the trainer refuses LoRA at ZeRO-3 (its base stays whole)
      both.push_back(c);
      both.back().lora = o.lora_rank;
    }
    cells = std::move(both);
  }

  at::set_num_threads(cores);
  const double gemm = model_gemm_gflops(cfg, o.seq_tokens, dt);
  int64_t params = 0;
  for (const auto& s : engine::model_param_specs(cfg)) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    params += n;
  }
  fmt::print(
      "bench train | {} ({:.1f} M params, {}) | {} tokens x {} micro-batches per rank | "
      "{} cores | model GEMM {:.1f} GFLOP/s\n",
      o.shape, params / 1e6, o.dtype, o.seq_tokens, o.micro_batches, cores, gemm);
  fmt::print("CPU: {}\n", engine::kernels::describe_cpu());
  fmt::print(
      "{:>8} {:>4} {:>5} {:>4} {:>3} {:>7} {:>6} | {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} | {:>9} | "
      "{:>8} {:>7} {:>6}\n",
      "kernels", "lora", "ranks", "zero", "ac", "offload", "chunk", "params", "grads", "optim",
      "state", "ideal-z2", "ratio", "activ", "planned", "tok/s", "vs z0", "mm %");
  std::ofstream jsonl;
  if (!o.results.empty()) jsonl.open(o.results, std::ios::app);
  std::map<std::pair<int, std::string>, double> z0_tps;
  std::vector<std::pair<std::string, double>> project_over_libtorch;  // per cell with both paths
  double project_tps = 0;
  struct ChunkBase {
    int64_t chunk = 0;
    double activ = 0, tps = 0;
  };
  std::map<std::string, ChunkBase> first_chunk;  // per cell: the first --logits-chunk-tokens value
  std::vector<std::string> chunk_lines;
  std::vector<std::string> lora_lines;  // per cell: LoRA against the same cell's full fine-tuning
  double full_tps = 0;
  int64_t full_state = 0;
  for (const Cell& c : cells) {
    at::set_num_threads(std::max(1, cores / c.ranks));
    std::vector<double> step_s;
    trainer::StateBytes bytes;
    int64_t rss_before = 0, bucket_bytes = 0;
    std::mutex mu;
    std::vector<int64_t> rss_samples;
    auto errors = sync::run_local_ranks(
        c.ranks, std::chrono::milliseconds(600000), [&](int r, auto& comm, const sync::StorePtr&) {
          trainer::TrainerOptions to;
          to.dtype = o.dtype;
          to.group = comm.get();
          to.zero_stage = c.stage;
          to.zero3_prefetch = c.prefetch;
          to.activation_checkpointing = c.ac;
          to.offload_optimizer = c.offload;
          to.cpu_kernels = c.kernels;
          to.grad_bucket_bytes = o.bucket_mb << 20;
          to.micro_batch_tokens = o.seq_tokens;
          to.schedule.lr = 1e-5;
          to.lora.rank = c.lora;
          to.logits_chunk_tokens = c.logits_chunk;
          trainer::Trainer tr(dir, to);
          std::mt19937 rng(1234 + r);
          std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(cfg.vocab_size) - 1);
          std::vector<trainer::MicroBatch> mbs;
          for (int i = 0; i < o.micro_batches; ++i) {
            std::vector<int32_t> prompt(o.seq_tokens / 2),
                answer(o.seq_tokens - o.seq_tokens / 2 - 1);
            for (auto& x : prompt) x = tok(rng);
            for (auto& x : answer) x = tok(rng);
            mbs.push_back(trainer::pack_micro_batches({trainer::sft_group(prompt, answer, 2)},
                                                      o.seq_tokens)[0]);
          }
          tr.train_step(mbs, trainer::LossKind::kSft);  // warm-up: allocations, pools
          comm->barrier();
          if (r == 0) {
            // The warm-up step's freed memory stays mapped (app/main.cpp's malloc settings keep up
            // to 1 GiB): returned first, so the steps' activations fault in fresh pages and the
            // peak counts them instead of reusing what the baseline already holds.
            malloc_trim(0);
            reset_peak_rss();
            rss_before = proc_status_bytes("VmRSS");
          }
          comm->barrier();
          for (int s = 0; s < o.steps; ++s) {
            comm->barrier();
            auto t0 = Clock::now();
            tr.train_step(mbs, trainer::LossKind::kSft);
            comm->barrier();
            if (r == 0) step_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          }
          if (r == 0) {
            std::lock_guard<std::mutex> lock(mu);
            bytes = tr.state_bytes();
            bucket_bytes = tr.layout().max_bucket_nbytes() / c10::elementSize(dt) * 4;
            rss_samples.push_back(proc_status_bytes("VmHWM"));
          }
        });
    for (size_t r = 0; r < errors.size(); ++r) {
      if (!errors[r].empty())
        throw std::runtime_error(fmt::format("bench train rank {}: {}", r, errors[r]));
    }
    std::sort(step_s.begin(), step_s.end());
    const double med = step_s[step_s.size() / 2];
    const double tokens = static_cast<double>(c.ranks) * o.micro_batches * o.seq_tokens;
    const double tps = tokens / med;
    const std::string zkey =
        c.kernels + (c.lora ? "/lora" : "") + "/chunk" + std::to_string(c.logits_chunk);
    if (c.stage == 0 && !c.ac && !c.offload) z0_tps[{c.ranks, zkey}] = tps;
    const double vs0 = z0_tps.count({c.ranks, zkey}) ? tps / z0_tps[{c.ranks, zkey}] : 0;
    if (c.lora == 0) {
      full_tps = tps;
      full_state = bytes.total();
    } else if (full_tps > 0) {
      lora_lines.push_back(fmt::format(
          "ranks {} zero {} ac {} offload {} ({}): LoRA rank {} state {:.2f} MiB vs full {:.2f} "
          "MiB "
          "({:.2f}%; the frozen base adds {:.1f} MiB in {}), tokens/s {:.0f} vs {:.0f} ({:.2f}x)",
          c.ranks, zero_label(c), c.ac ? "on" : "off", c.offload ? "on" : "off", c.kernels, c.lora,
          bytes.total() / 1048576.0, full_state / 1048576.0, 100.0 * bytes.total() / full_state,
          params * static_cast<double>(c10::elementSize(dt)) / 1048576.0, o.dtype, tps, full_tps,
          tps / full_tps));
    }
    const double activ = static_cast<double>(rss_samples.at(0) - rss_before) / c.ranks;
    // The memory plan's estimate of the same (trainer/memory_plan.h): one sequence of
    // --seq-tokens a micro-batch.
    trainer::TrainerOptions planned_to;
    planned_to.dtype = o.dtype;
    planned_to.activation_checkpointing = c.ac;
    planned_to.micro_batch_tokens = o.seq_tokens;
    planned_to.lora.rank = c.lora;
    planned_to.logits_chunk_tokens = c.logits_chunk;
    const int64_t planned = trainer::activation_bytes(cfg, planned_to, o.seq_tokens);
    {
      const std::string key =
          fmt::format("ranks {} zero {} ac {} offload {} ({}, lora {})", c.ranks, zero_label(c),
                      c.ac ? "on" : "off", c.offload ? "on" : "off", c.kernels, c.lora);
      auto first = first_chunk.find(key);
      if (first == first_chunk.end()) {
        first_chunk[key] = {c.logits_chunk, activ, tps};
      } else {
        chunk_lines.push_back(fmt::format(
            "{}: logits chunk {} against {}: activations {:.1f} MiB vs {:.1f} MiB, tokens/s {:.0f} "
            "vs {:.0f} ({:.3f}x)",
            key, c.logits_chunk, first->second.chunk, activ / 1048576.0,
            first->second.activ / 1048576.0, tps, first->second.tps, tps / first->second.tps));
      }
    }
    if (c.kernels == "project" && c.lora == 0) project_tps = tps;
    if (c.kernels == "libtorch" && c.lora == 0 && project_tps > 0) {
      project_over_libtorch.emplace_back(
          fmt::format("ranks {} zero {} ac {} offload {}", c.ranks, zero_label(c),
                      c.ac ? "on" : "off", c.offload ? "on" : "off"),
          project_tps / tps);
      project_tps = 0;
    }
    const double mm_share = 6.0 * params * tps / 1e9 / gemm;
    const double esize = static_cast<double>(c10::elementSize(dt));
    // Stage-2 ideal: full compute-dtype parameters + fp32 master, m, v and gradient slices of P / T
    // + one fp32 gradient bucket in flight.
    const double ideal = params * esize + 16.0 * params / c.ranks + bucket_bytes;
    auto mib = [](double b) { return fmt::format("{:.1f}M", b / (1 << 20)); };
    fmt::print(
        "{:>8} {:>4} {:>5} {:>4} {:>3} {:>7} {:>6} | {:>9} {:>9} {:>9} {:>9} {:>9} {:>6.3f} | "
        "{:>9} {:>9} "
        "| {:>8.0f} {:>6.2f}x {:>5.1f}%\n",
        c.kernels, c.lora, c.ranks, zero_label(c), c.ac ? "on" : "off", c.offload ? "on" : "off",
        c.logits_chunk == 0 ? std::string("auto") : std::to_string(c.logits_chunk),
        mib(bytes.parameters), mib(bytes.gradients), mib(bytes.optimizer), mib(bytes.total()),
        mib(ideal), bytes.total() / ideal, mib(activ), mib(static_cast<double>(planned)), tps, vs0,
        100 * mm_share);
    if (jsonl) {
      nlohmann::json row = {{"shape", o.shape},
                            {"dtype", o.dtype},
                            {"cpu_kernels", c.kernels},
                            {"cpu", engine::kernels::cpu_model_name()},
                            {"ranks", c.ranks},
                            {"zero", c.stage},
                            {"zero3_prefetch", c.stage == 3 && c.prefetch},
                            {"lora_rank", c.lora},
                            {"activation_checkpointing", c.ac},
                            {"offload_optimizer", c.offload},
                            {"logits_chunk_tokens", c.logits_chunk},
                            {"param_bytes", bytes.parameters},
                            {"grad_bytes", bytes.gradients},
                            {"optimizer_bytes", bytes.optimizer},
                            {"stage2_ideal_bytes", ideal},
                            {"activation_bytes", activ},
                            {"planned_activation_bytes", planned},
                            {"tokens_per_s", tps},
                            {"vs_stage0", vs0},
                            {"matmul_share", mm_share},
                            {"gemm_gflops", gemm},
                            {"step_s", step_s}};
      jsonl << row.dump() << "\n";
    }
  }
  for (const auto& line : lora_lines) fmt::print("{}\n", line);
  for (const auto& line : chunk_lines) fmt::print("{}\n", line);
  for (const auto& [cell, ratio] : project_over_libtorch) {
    fmt::print("{}: tokens/s project / libtorch = {:.3f}\n", cell, ratio);
  }
  return 0;
}

}  // namespace crl::bench
