#include "bench/rollout_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "bench/stats.h"
#include "bench/step_profile.h"
#include "common/units.h"
#include "engine/kernels/cpu_isa.h"
#include "engine/llm_engine.h"
#include "engine/model/lora.h"
#include "engine/model/model_cache.h"
#include "kv/paged_attention.h"

namespace crl::bench {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::pair<int64_t, int64_t> parse_range(const std::string& text) {
  auto dots = text.find("..");
  try {
    if (dots == std::string::npos) {
      int64_t v = std::stoll(text);
      return {v, v};
    }
    return {std::stoll(text.substr(0, dots)), std::stoll(text.substr(dots + 2))};
  } catch (const std::exception&) {
    throw std::invalid_argument("invalid length '" + text + "': use L or A..B");
  }
}

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> output_lens;
};

Workload make_workload(const RolloutBenchOptions& o, int64_t vocab) {
  if (!o.workload_in.empty()) {
    std::ifstream in(o.workload_in);
    if (!in) throw std::invalid_argument("--workload-in: cannot read " + o.workload_in);
    const nlohmann::json j = nlohmann::json::parse(in);
    Workload w;
    w.prompts = j.at("prompts").get<std::vector<std::vector<int32_t>>>();
    w.output_lens = j.at("output_lens").get<std::vector<int32_t>>();
    if (w.prompts.size() != w.output_lens.size() || w.prompts.empty()) {
      throw std::invalid_argument("--workload-in " + o.workload_in +
                                  ": 'prompts' and 'output_lens' "
                                  "must be non-empty and of one length");
    }
    for (const auto& p : w.prompts) {
      for (int32_t t : p) {
        if (t < 0 || t >= vocab) {
          throw std::invalid_argument("--workload-in " + o.workload_in + ": token id " +
                                      std::to_string(t) + " outside the model's vocabulary");
        }
      }
    }
    return w;
  }
  std::mt19937_64 rng(o.seed);
  auto [pa, pb] = parse_range(o.prompt_len);
  auto [oa, ob] = parse_range(o.output_len);
  std::uniform_int_distribution<int64_t> plen(pa, pb), olen(oa, ob), tok(4, vocab - 1);
  Workload w;
  for (int32_t i = 0; i < o.prompts; ++i) {
    std::vector<int32_t> p(plen(rng));
    for (auto& t : p) t = static_cast<int32_t>(tok(rng));
    w.prompts.push_back(std::move(p));
    w.output_lens.push_back(static_cast<int32_t>(olen(rng)));
  }
  return w;
}

engine::EngineConfig engine_config(const RolloutBenchOptions& o, const std::string& model_dir) {
  engine::EngineConfig c;
  c.model_dir = model_dir;
  c.dtype = o.dtype;
  c.kv_memory_bytes = parse_bytes(o.kv_memory);
  c.max_seqs = o.max_seqs;
  c.max_batched_tokens = o.max_batched_tokens;
  c.seed = o.seed;
  c.device = o.device;
  return c;
}

// The requests of one mode: shared prompts (n per request) or n independent requests.
std::vector<engine::GenerateRequest> make_requests(const Workload& w, int32_t n, bool share,
                                                   int32_t output_scale_div = 1) {
  std::vector<engine::GenerateRequest> reqs;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    engine::GenerateRequest r;
    r.prompt_token_ids = w.prompts[i];
    r.params.temperature = 1.0;
    r.params.ignore_eos = true;
    r.params.max_tokens = std::max(1, w.output_lens[i] / output_scale_div);
    r.params.seed = 1000 + i;
    if (share) {
      r.params.n = n;
      reqs.push_back(r);
    } else {
      for (int32_t k = 0; k < n; ++k) {
        r.params.seed = 1000 + i * 1000 + k;
        reqs.push_back(r);
      }
    }
  }
  return reqs;
}

struct RunStats {
  double seconds = 0, gen_tok_s = 0, total_tok_s = 0, samples_s = 0, kv_util = 0;
  int64_t generated = 0, prompt_computed = 0, preemptions = 0, steps = 0;
  double d2h_per_step = 0;  // device->host bytes per engine step (0 on the CPU)
  double schedule_s = 0, forward_s = 0, sample_s = 0, finish_s = 0;  // host time per phase
};

RunStats run_batch(engine::LlmEngine& eng, std::vector<engine::GenerateRequest> reqs) {
  const engine::EngineStats before = eng.stats();
  const int32_t total_blocks = eng.runner().num_blocks();
  int64_t samples = 0;
  for (const auto& r : reqs) samples += r.params.n;
  auto t0 = Clock::now();
  eng.generate(std::move(reqs));
  RunStats s;
  s.seconds = since(t0);
  const engine::EngineStats& after = eng.stats();
  s.generated = after.generated_tokens - before.generated_tokens;
  s.prompt_computed = after.prompt_tokens_computed - before.prompt_tokens_computed;
  s.preemptions = after.preemptions - before.preemptions;
  s.gen_tok_s = s.generated / s.seconds;
  s.total_tok_s = (s.generated + s.prompt_computed) / s.seconds;
  s.samples_s = samples / s.seconds;
  s.kv_util = static_cast<double>(after.max_used_blocks) / total_blocks;
  s.steps = after.steps - before.steps;
  s.d2h_per_step =
      s.steps > 0 ? static_cast<double>(after.d2h_bytes - before.d2h_bytes) / s.steps : 0;
  s.schedule_s = after.schedule_seconds - before.schedule_seconds;
  s.forward_s = after.forward_seconds - before.forward_seconds;
  s.sample_s = after.sample_seconds - before.sample_seconds;
  s.finish_s = after.finish_seconds - before.finish_seconds;
  return s;
}

// Device copy bandwidth (GB/s, bytes read + written) of a `bytes`-byte device-to-device copy,
// median of 10 after a warm-up; synchronised by reading one element back.
double measure_device_copy_gbs(const at::Device& device, int64_t bytes) {
  const auto opts = at::TensorOptions().dtype(at::kByte).device(device);
  at::Tensor src = at::randint(0, 255, {bytes}, opts);
  at::Tensor dst = at::empty({bytes}, opts);
  std::vector<double> gbs;
  for (int i = 0; i < 11; ++i) {
    dst[0].item<uint8_t>();
    const auto t0 = Clock::now();
    dst.copy_(src);
    dst[bytes - 1].item<uint8_t>();
    if (i > 0) gbs.push_back(2.0 * static_cast<double>(bytes) / since(t0) / 1e9);
  }
  return median(gbs);
}

// The fewest bytes one run of the workload must read from device memory: the weights once per
// engine step, and every decode step's KV of the tokens before it (each sequence: prompt p, then
// o outputs read p + 1 .. p + o tokens of K and V).
double workload_floor_bytes(const Workload& w, int32_t n, const engine::ModelConfig& mc,
                            at::ScalarType dtype, int64_t steps, double weight_params) {
  const double elt = static_cast<double>(c10::elementSize(dtype));
  const double kv_per_token = 2.0 * mc.num_layers * mc.num_kv_heads * mc.head_dim * elt;
  double kv_tokens = 0;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    const double p = static_cast<double>(w.prompts[i].size()), o = w.output_lens[i];
    kv_tokens += n * (o * p + o * (o + 1) / 2);
  }
  return static_cast<double>(steps) * weight_params * elt + kv_tokens * kv_per_token;
}

// The parameters one rank of `eng` reads a step: a tensor-parallel shard's config counts its own
// heads and MLP columns, and every vocabulary row unless the group splits them.
double rank_params(const engine::LlmEngine& eng) {
  const engine::ModelConfig& mc = eng.model_config();
  const int tp = eng.config().tensor_parallel_size;
  double p = static_cast<double>(mc.num_params());
  if (engine::tp_splits_vocab(mc.vocab_size, tp)) {
    p -= (1.0 - 1.0 / tp) * static_cast<double>(mc.vocab_size) * mc.hidden_size *
         (mc.tie_word_embeddings ? 1 : 2);
  }
  return p;
}

// Matmul GFLOP/s over the model's linear shapes at `rows` rows (what decode at that batch runs).
double measure_matmul_gflops(const engine::ModelConfig& c, at::ScalarType dtype, int64_t rows) {
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  std::vector<std::pair<int64_t, int64_t>> shapes = {{q, h},
                                                     {kv, h},
                                                     {kv, h},
                                                     {h, q},
                                                     {c.intermediate_size, h},
                                                     {c.intermediate_size, h},
                                                     {h, c.intermediate_size}};
  std::vector<at::Tensor> ws, xs;
  double flops = 0;
  for (auto [out, in] : shapes) {
    ws.push_back(at::randn({out, in}).to(dtype));
    xs.push_back(at::randn({rows, in}).to(dtype));
    flops += 2.0 * rows * out * in;
  }
  std::vector<double> times;
  for (int it = 0; it < 12; ++it) {
    auto t0 = Clock::now();
    for (size_t i = 0; i < ws.size(); ++i) at::linear(xs[i], ws[i]);
    if (it >= 2) times.push_back(since(t0));
  }
  return flops / median(times) / 1e9;
}

// Streaming read bandwidth in GB/s: a sum over a buffer of `bytes` (at least 256 MiB, far larger
// than the caches), read the way a decode step reads its weights.
double measure_bandwidth_gbs(double bytes) {
  const int64_t n = std::max<int64_t>(static_cast<int64_t>(bytes / 4), int64_t{64} << 20);
  auto buf = at::ones({n}, at::kFloat);
  std::vector<double> times;
  for (int it = 0; it < 5; ++it) {
    auto t0 = Clock::now();
    volatile float s = buf.sum().item<float>();
    (void)s;
    if (it >= 1) times.push_back(since(t0));
  }
  return buf.numel() * 4.0 / median(times) / 1e9;
}

// Median decode step time with exactly `batch` running sequences of context ~ctx.
double measure_decode_step(engine::LlmEngine& eng, int32_t batch, int32_t ctx, int64_t vocab) {
  std::mt19937_64 rng(99);
  std::uniform_int_distribution<int64_t> tok(4, vocab - 1);
  for (int32_t i = 0; i < batch; ++i) {
    engine::GenerateRequest r;
    r.prompt_token_ids.resize(ctx);
    for (auto& t : r.prompt_token_ids) t = static_cast<int32_t>(tok(rng));
    r.params.max_tokens = 40;
    r.params.ignore_eos = true;
    r.params.seed = i;
    eng.add_request(std::move(r));
  }
  std::vector<double> times;
  while (eng.has_unfinished()) {
    const int64_t before = eng.stats().prompt_tokens_computed;
    auto t0 = Clock::now();
    eng.step();
    const double dt = since(t0);
    const bool pure_decode = eng.stats().prompt_tokens_computed == before;
    if (pure_decode && static_cast<int32_t>(eng.scheduler().num_running()) == batch)
      times.push_back(dt);
  }
  return median(times);
}

}  // namespace

void add_rollout_flags(CLI::App& cmd, RolloutBenchOptions& o) {
  cmd.add_option("--model", o.model_dir, "model directory (default: --shape from the cache)");
  cmd.add_option("--shape", o.shape, "default, smollm2-135m, qwen2-0.5b")->capture_default_str();
  cmd.add_option("--dtype", o.dtype, "float32 or bfloat16")->capture_default_str();
  cmd.add_option("--prompts", o.prompts, "prompts per batch")->capture_default_str();
  cmd.add_option("--n", o.n, "samples per prompt")->capture_default_str();
  cmd.add_option("--prompt-len", o.prompt_len, "L or A..B (uniform)")->capture_default_str();
  cmd.add_option("--output-len", o.output_len, "L or A..B (uniform)")->capture_default_str();
  cmd.add_option("--repeats", o.repeats, "timed repeats per mode (median)")->capture_default_str();
  cmd.add_option("--threads", o.threads, "intra-op threads")->capture_default_str();
  cmd.add_option("--max-seqs", o.max_seqs, "engine sequence cap")->capture_default_str();
  cmd.add_option("--max-batched-tokens", o.max_batched_tokens, "engine token budget")
      ->capture_default_str();
  cmd.add_option("--kv-memory", o.kv_memory, "KV pool size")->capture_default_str();
  cmd.add_option(
         "--modes", o.modes,
         "comma-separated: continuous, static, no-share, deterministic, libtorch (continuous "
         "with ATen's ops), host-sampler, eager, lora-1 and lora-4 (continuous with 1 or 4 "
         "LoRA adapters of --lora-rank, requests taking them in turn), tp2 and tp4 (continuous "
         "with the model split over 2 or 4 tensor-parallel ranks: threads, on GPUs "
         "--device..+N-1), merged (continuous with q/k/v and gate/up as one product each)")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("--lora-rank", o.lora_rank, "rank of the lora-k modes' adapters (all-linear)")
      ->capture_default_str();
  cmd.add_flag("!--no-probes", o.probes, "skip the decode/prefill probes");
  cmd.add_option("--decode-batch", o.decode_batch, "concurrency of the decode probe")
      ->capture_default_str();
  cmd.add_option("--seed", o.seed, "workload seed")->capture_default_str();
  cmd.add_option("--json-out", o.json_out, "append the JSON result line to this file");
  cmd.add_flag("--json", o.json, "print the JSON result line after the table");
  cmd.add_option("--device", o.device, "cpu or cuda (the probes run on the CPU only)")
      ->capture_default_str();
  cmd.add_option(
      "--workload-in", o.workload_in,
      "read the workload from JSON (as --workload-out writes it, or bench/hf_generate.py "
      "--make-workload) instead of drawing one; --prompts and the lengths are ignored");
  cmd.add_option("--step-trace", o.step_trace,
                 "write a JSON line per engine step (shape, host time per phase, wall time) of the "
                 "first mode's first timed repeat");
  cmd.add_option("--profile", o.profile,
                 "Kineto traces (Chrome JSON, every kernel on a GPU) of the steps --profile-steps "
                 "names in the first mode's first timed repeat: PREFIX.FIRST.json");
  cmd.add_option("--profile-steps", o.profile_steps, "FIRST:COUNT[,FIRST:COUNT...] (1-based steps)")
      ->capture_default_str();
  cmd.add_option(
      "--workload-out", o.workload_out,
      "write the workload (prompt ids, output lengths, n) as JSON for bench/hf_generate.py");
}

int run_rollout_bench(const RolloutBenchOptions& o) {
  at::set_num_threads(o.threads);
  const std::string model_dir =
      o.model_dir.empty() ? engine::ensure_preset_model(o.shape, "float32") : o.model_dir;
  nlohmann::json result = {
      {"bench", "rollout"},         {"model", o.model_dir.empty() ? o.shape : o.model_dir},
      {"dtype", o.dtype},           {"threads", o.threads},
      {"prompts", o.prompts},       {"n", o.n},
      {"prompt_len", o.prompt_len}, {"output_len", o.output_len},
      {"repeats", o.repeats},       {"device", o.device}};
  std::cout << fmt::format(
      "rollout bench: {} ({}), {} prompts x {} samples, prompt {} tokens, "
      "output {} tokens, {} threads, {} repeats (medians)\n",
      o.model_dir.empty() ? o.shape : o.model_dir, o.dtype, o.prompts, o.n, o.prompt_len,
      o.output_len, o.threads, o.repeats);
  engine::kernels::active_cpu_isa();  // chooses the path (CRL_CPU_ISA) before it is reported
  std::cout << "cpu: " << engine::kernels::describe_cpu() << "\n";
  result["cpu"] = engine::kernels::describe_cpu();
  if (o.device != "cpu") {
    result["attention_kernel"] = kv::cuda_attention_kernel_name(kv::cuda_attention_kernel());
    result["flashinfer_split_waves"] = kv::flashinfer_split_waves();
    std::cout << "attention kernel: " << result["attention_kernel"].get<std::string>()
              << " (FlashInfer split-KV waves " << kv::flashinfer_split_waves() << ")\n";
  }
  // One engine per mode, all alive, and the repeats interleaved (mode A, mode B, ..., then again)
  // so that every mode sees the same machine state; ratios are medians of per-repeat ratios.
  struct ModeRun {
    std::string mode;
    std::unique_ptr<engine::LlmEngine> eng;
    Workload w;
    std::vector<RunStats> runs;
    int32_t adapters = 0;  // lora-k: requests take adapters a0..a{k-1} in turn
  };
  std::vector<ModeRun> mode_runs;
  auto requests_for = [&](const ModeRun& m, int32_t n, bool share, int32_t div) {
    auto reqs = make_requests(m.w, n, share, div);
    for (size_t i = 0; m.adapters > 0 && i < reqs.size(); ++i)
      reqs[i].lora = "a" + std::to_string(i % m.adapters);
    return reqs;
  };
  for (const auto& mode : o.modes) {
    if (mode != "continuous" && mode != "static" && mode != "no-share" && mode != "deterministic" &&
        mode != "libtorch" && mode != "host-sampler" && mode != "eager" && mode != "lora-1" &&
        mode != "lora-4" && mode != "tp2" && mode != "tp4" && mode != "merged") {
      throw std::invalid_argument(
          "unknown bench mode '" + mode +
          "' (expected continuous, static, no-share, deterministic, libtorch, "
          "host-sampler, eager, lora-1, lora-4, tp2, tp4 or merged)");
    }
    engine::EngineConfig c = engine_config(o, model_dir);
    if (mode == "libtorch") {  // continuous, with at::linear and ATen's ops everywhere
      c.cpu_kernels = "libtorch";
      c.gpu_kernels = "libtorch";
    }
    if (mode == "host-sampler") c.sampler = "cpu";  // continuous, logits copied to the host
    if (mode == "eager") c.cuda_graphs = "off";     // continuous without CUDA graphs
    if (mode == "merged" || mode == "unmerged") {   // q/k/v and gate/up as one product each, or not
      c.merge_projections = mode == "merged" ? "on" : "off";
    }
    if (mode == "tp2" || mode == "tp4") c.tensor_parallel_size = mode == "tp2" ? 2 : 4;
    c.static_batching = mode == "static";
    c.deterministic = mode == "deterministic";
    c.enable_prefix_caching = mode != "no-share";
    const int32_t adapters = mode == "lora-1" ? 1 : mode == "lora-4" ? 4 : 0;
    if (adapters > 0) {
      c.max_loras = adapters;
      c.max_lora_rank = o.lora_rank;
    }
    ModeRun m{mode, std::make_unique<engine::LlmEngine>(c), {}, {}};
    for (int32_t a = 0; a < adapters; ++a) {  // random B: a real adapter's arithmetic
      m.eng->loras().add(
          "a" + std::to_string(a),
          engine::make_lora_adapter(m.eng->model_config(), o.lora_rank, 2.0 * o.lora_rank,
                                    engine::parse_lora_targets("all-linear"), 100 + a, true));
    }
    m.adapters = adapters;
    m.w = make_workload(o, m.eng->model_config().vocab_size);
    if (!o.workload_out.empty() && mode_runs.empty()) {
      std::ofstream(o.workload_out) << nlohmann::json{
          {"prompts", m.w.prompts},
          {"output_lens", m.w.output_lens},
          {"n", o.n}}.dump();
    }
    run_batch(*m.eng, requests_for(m, 1, true, 8));  // warmup
    std::cout << fmt::format("{}: engine built and warmed up\n", mode);
    mode_runs.push_back(std::move(m));
  }
  for (int32_t r = 0; r < o.repeats; ++r) {
    for (ModeRun& m : mode_runs) {
      m.eng->apply_weight_update(m.eng->weight_version() +
                                 1);  // no prefix-cache carry-over between repeats
      std::unique_ptr<StepProfiler> profiler;
      if (r == 0 && &m == &mode_runs.front() && (!o.step_trace.empty() || !o.profile.empty())) {
        profiler = std::make_unique<StepProfiler>(o.profile, o.profile_steps, o.step_trace);
        m.eng->set_step_observer(
            [p = profiler.get()](const engine::StepRecord& rec) { p->after_step(rec); });
        profiler->arm();
      }
      m.runs.push_back(run_batch(*m.eng, requests_for(m, o.n, m.mode != "no-share", 1)));
      std::cout << fmt::format("repeat {}/{} {:<13} {:.2f} s, {:.1f} generated tok/s\n", r + 1,
                               o.repeats, m.mode, m.runs.back().seconds, m.runs.back().gen_tok_s);
      if (profiler) {
        profiler->disarm();
        m.eng->set_step_observer({});
      }
    }
  }
  nlohmann::json modes = nlohmann::json::object();
  std::cout << fmt::format("{:<13} {:>9} {:>11} {:>11} {:>10} {:>9} {:>9} {:>8}\n", "mode",
                           "time_s", "gen_tok/s", "total_tok/s", "samples/s", "prefill", "kv_util",
                           "preempt");
  for (const ModeRun& mr : mode_runs) {
    auto med = [&](auto field) {
      std::vector<double> v;
      for (const auto& s : mr.runs) v.push_back(static_cast<double>(s.*field));
      return median(v);
    };
    nlohmann::json m = {{"seconds", med(&RunStats::seconds)},
                        {"gen_tok_s", med(&RunStats::gen_tok_s)},
                        {"total_tok_s", med(&RunStats::total_tok_s)},
                        {"samples_s", med(&RunStats::samples_s)},
                        {"prefill_tokens", med(&RunStats::prompt_computed)},
                        {"generated_tokens", med(&RunStats::generated)},
                        {"kv_util", med(&RunStats::kv_util)},
                        {"preemptions", med(&RunStats::preemptions)},
                        {"steps", med(&RunStats::steps)},
                        {"d2h_bytes_per_step", med(&RunStats::d2h_per_step)},
                        {"host_phase_s",
                         {{"schedule", med(&RunStats::schedule_s)},
                          {"forward", med(&RunStats::forward_s)},
                          {"sample", med(&RunStats::sample_s)},
                          {"finish", med(&RunStats::finish_s)}}},
                        {"max_step_d2h_bytes", mr.eng->stats().max_step_d2h_bytes}};
    modes[mr.mode] = m;
    std::cout << fmt::format(
        "{:<13} {:>9.2f} {:>11.1f} {:>11.1f} {:>10.2f} {:>9.0f} {:>9.2f} {:>8.0f}\n", mr.mode,
        m["seconds"].get<double>(), m["gen_tok_s"].get<double>(), m["total_tok_s"].get<double>(),
        m["samples_s"].get<double>(), m["prefill_tokens"].get<double>(), m["kv_util"].get<double>(),
        m["preemptions"].get<double>());
  }
  // Median over repeats of (time of `a`) / (time of `b`), the two run back to back.
  auto paired_ratio = [&](const std::string& a, const std::string& b) -> std::optional<double> {
    const ModeRun* ra = nullptr;
    const ModeRun* rb = nullptr;
    for (const ModeRun& m : mode_runs) {
      if (m.mode == a) ra = &m;
      if (m.mode == b) rb = &m;
    }
    if (ra == nullptr || rb == nullptr) return std::nullopt;
    std::vector<double> v;
    for (size_t i = 0; i < ra->runs.size(); ++i)
      v.push_back(ra->runs[i].seconds / rb->runs[i].seconds);
    return median(v);
  };
  result["modes"] = modes;
  const std::pair<const char*, std::pair<const char*, const char*>> ratios[] = {
      {"deterministic_cost", {"deterministic", "continuous"}},
      {"static_vs_continuous", {"static", "continuous"}},
      {"no_share_vs_continuous", {"no-share", "continuous"}},
      {"libtorch_vs_continuous", {"libtorch", "continuous"}},
      {"host_sampler_vs_continuous", {"host-sampler", "continuous"}},
      {"eager_vs_continuous", {"eager", "continuous"}},
      {"lora_1_vs_continuous", {"lora-1", "continuous"}},
      {"lora_4_vs_continuous", {"lora-4", "continuous"}},
      {"tp2_vs_continuous", {"tp2", "continuous"}},
      {"tp4_vs_continuous", {"tp4", "continuous"}},
      {"merged_vs_continuous", {"merged", "continuous"}}};
  for (const auto& [key, pair] : ratios) {
    if (auto r = paired_ratio(pair.first, pair.second)) {
      result[key] = *r;
      std::cout << fmt::format(
          "{}: time of {} / time of {} = {:.3f} (median of {} paired repeats)\n", key, pair.first,
          pair.second, *r, o.repeats);
    }
  }

  if (o.device != "cpu") {
    // The device's roofline: the run's fewest bytes (weights each step, each decode step's KV)
    // over the device's own copy bandwidth, against the measured time.
    const ModeRun& m = mode_runs.front();
    const auto& mc = m.eng->model_config();
    const at::ScalarType dt = engine::parse_dtype(o.dtype);
    const double copy_gbs = measure_device_copy_gbs(at::Device(o.device), int64_t{1} << 31);
    std::vector<double> shares;
    for (const RunStats& r : m.runs) {
      const double floor_s =
          workload_floor_bytes(m.w, o.n, mc, dt, r.steps, rank_params(*m.eng)) / (copy_gbs * 1e9);
      shares.push_back(floor_s / r.seconds);
    }
    const double steps = median([&] {
      std::vector<double> v;
      for (const RunStats& r : m.runs) v.push_back(static_cast<double>(r.steps));
      return v;
    }());
    result["roofline"] = {
        {"mode", m.mode},
        {"device_copy_gbs", copy_gbs},
        {"floor_bytes",
         workload_floor_bytes(m.w, o.n, mc, dt, static_cast<int64_t>(steps), rank_params(*m.eng))},
        {"share_of_roofline", median(shares)}};
    std::cout << fmt::format(
        "{}: {:.1f}% of the memory roofline (device copy {:.0f} GB/s; weights "
        "once a step plus each decode step's KV), {:.0f} device->host bytes a step\n",
        m.mode, 100 * median(shares), copy_gbs, modes[m.mode]["d2h_bytes_per_step"].get<double>());
    if (o.probes) std::cout << "(probes skipped: they measure the CPU)\n";
  } else if (o.probes) {
    engine::EngineConfig c = engine_config(o, model_dir);
    c.max_seqs = std::max(o.decode_batch, 1);
    engine::LlmEngine eng(c);
    const auto& mc = eng.model_config();
    const at::ScalarType dt = engine::parse_dtype(o.dtype);
    const int64_t h = mc.hidden_size, q = mc.num_heads * mc.head_dim,
                  kv = mc.num_kv_heads * mc.head_dim;
    const double linear_params = static_cast<double>(mc.num_layers) *
                                     (h * q * 2 + h * kv * 2 + 3.0 * h * mc.intermediate_size) +
                                 static_cast<double>(mc.vocab_size) * h;
    const double weight_bytes = static_cast<double>(mc.num_params()) * c10::elementSize(dt);
    const double step_b = measure_decode_step(eng, o.decode_batch, 128, mc.vocab_size);
    const double step_1 = measure_decode_step(eng, 1, 128, mc.vocab_size);
    const double mm_b = measure_matmul_gflops(mc, dt, o.decode_batch);
    const double bw = measure_bandwidth_gbs(weight_bytes);
    const double decode_gflops = 2.0 * linear_params * o.decode_batch / step_b / 1e9;
    // Prefill probe: 8 prompts of 512 tokens, one output token each.
    std::vector<engine::GenerateRequest> pre;
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int64_t> tok(4, mc.vocab_size - 1);
    for (int i = 0; i < 8; ++i) {
      engine::GenerateRequest r;
      r.prompt_token_ids.resize(512);
      for (auto& t : r.prompt_token_ids) t = static_cast<int32_t>(tok(rng));
      r.params.max_tokens = 1;
      pre.push_back(std::move(r));
    }
    eng.apply_weight_update(eng.weight_version() + 1);
    auto t0 = Clock::now();
    eng.generate(pre);
    const double prefill_tok_s = 8 * 512 / since(t0);
    const double bound_1 = weight_bytes / (bw * 1e9);
    nlohmann::json p = {{"decode_batch", o.decode_batch},
                        {"decode_step_s", step_b},
                        {"decode_tok_s", o.decode_batch / step_b},
                        {"decode_gflops", decode_gflops},
                        {"matmul_gflops_same_shapes", mm_b},
                        {"decode_vs_matmul", decode_gflops / mm_b},
                        {"batch1_step_s", step_1},
                        {"batch1_tok_s", 1.0 / step_1},
                        {"weight_bytes", weight_bytes},
                        {"bandwidth_gbs", bw},
                        {"batch1_bandwidth_bound_s", bound_1},
                        {"batch1_vs_bound", step_1 / bound_1},
                        {"prefill_tok_s", prefill_tok_s}};
    result["probes"] = p;
    std::cout << fmt::format(
        "decode @{} seqs: {:.1f} ms/step, {:.1f} tok/s, {:.1f} GFLOP/s = {:.0f}% of measured "
        "matmul ({:.1f} GFLOP/s)\n",
        o.decode_batch, step_b * 1e3, o.decode_batch / step_b, decode_gflops,
        100 * decode_gflops / mm_b, mm_b);
    std::cout << fmt::format(
        "decode @1 seq: {:.1f} ms/step ({:.1f} tok/s); bandwidth bound {:.1f} ms ({:.2f} GB "
        "weights at {:.1f} GB/s) -> {:.2f}x the bound\n",
        step_1 * 1e3, 1 / step_1, bound_1 * 1e3, weight_bytes / 1e9, bw, step_1 / bound_1);
    std::cout << fmt::format("prefill: {:.0f} tok/s (8 x 512-token prompts)\n", prefill_tok_s);
  }
  result["peak_rss_bytes"] = peak_rss_bytes();
  if (o.json) std::cout << result.dump() << "\n";
  if (!o.json_out.empty()) {
    std::ofstream(o.json_out, std::ios::app) << result.dump() << "\n";
  }
  return 0;
}

}  // namespace crl::bench
