#include "bench/host_step_bench.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_set>

#include "bench/stats.h"
#include "engine/kernels/cpu_isa.h"
#include "engine/scheduler.h"
#include "engine/step_inputs.h"
#include "engine/stop_checker.h"

namespace crl::bench {

namespace {

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

// One token for every scheduled sequence that samples (the sampler's output, drawn on the host).
std::vector<engine::SeqSamples> draw(const engine::SchedulerOutput& batch, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok(4, 150000);
  std::vector<engine::SeqSamples> out;
  out.reserve(batch.seqs.size());
  for (const engine::ScheduledSeq& s : batch.seqs) {
    if (!s.sample) continue;
    engine::SeqSamples ss;
    ss.seq = s.seq;
    engine::SampleResult r;
    r.token = tok(rng);
    r.raw_logprob = -1.0f;
    r.processed_logprob = -1.0f;
    ss.samples.push_back(r);
    out.push_back(std::move(ss));
  }
  return out;
}

}  // namespace

void add_host_step_bench_flags(CLI::App& cmd, HostStepBenchOptions& o) {
  cmd.add_option("--seqs", o.seqs, "sequences decoding together")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  cmd.add_option("--prompt-len", o.prompt_len, "prompt tokens, L or A..B (uniform)")
      ->capture_default_str();
  cmd.add_option("--steps", o.steps, "timed decode steps")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd.add_option("--block-size", o.block_size, "tokens per KV block")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd.add_option("--max-model-len", o.max_model_len,
                 "context length: the decode graphs' block-table width is this / block size")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  cmd.add_option("--seed", o.seed, "workload seed")->capture_default_str();
  cmd.add_option("--json-out", o.json_out, "also append the JSON line to this file");
  cmd.add_flag("--json", o.json, "print the JSON result line after the table");
}

int run_host_step_bench(const HostStepBenchOptions& o) {
  engine::kernels::active_cpu_isa();  // chooses the path (CRL_CPU_ISA) before it is reported
  int64_t pa = 0, pb = 0;
  {
    const auto dots = o.prompt_len.find("..");
    try {
      pa = std::stoll(o.prompt_len.substr(0, dots));
      pb = dots == std::string::npos ? pa : std::stoll(o.prompt_len.substr(dots + 2));
    } catch (const std::exception&) {
      throw std::invalid_argument("--prompt-len '" + o.prompt_len + "': use L or A..B");
    }
    if (pa < 1 || pb < pa || pb + o.steps + 1 > o.max_model_len) {
      throw std::invalid_argument("--prompt-len " + o.prompt_len + " plus --steps " +
                                  std::to_string(o.steps) + " must fit in --max-model-len " +
                                  std::to_string(o.max_model_len));
    }
  }
  engine::SchedulerConfig sc;
  sc.block_size = o.block_size;
  sc.max_seqs = o.seqs;
  sc.max_batched_tokens = 8192;
  const int64_t per_seq = (pb + o.steps + 2 + o.block_size - 1) / o.block_size;
  sc.num_blocks = static_cast<int32_t>(per_seq * o.seqs + 16);
  engine::Scheduler sched(sc);
  engine::StopChecker stop(nullptr, {2}, o.max_model_len);

  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::uniform_int_distribution<int64_t> plen(pa, pb);
  std::uniform_int_distribution<int32_t> tok(4, 150000);
  std::vector<std::unique_ptr<engine::Request>> requests;
  for (int32_t i = 0; i < o.seqs; ++i) {
    auto req = std::make_unique<engine::Request>();
    req->id = "r" + std::to_string(i);
    req->arrival = i;
    req->params.max_tokens = static_cast<int32_t>(o.max_model_len);  // never the stop here
    req->params.ignore_eos = true;
    req->params.temperature = 1.0;
    const int64_t n = plen(rng);
    for (int64_t j = 0; j < n; ++j) req->prompt.push_back(tok(rng));
    auto seq = std::make_unique<engine::Sequence>();
    seq->seq_id = sched.new_seq_id();
    seq->request = req.get();
    seq->tokens = req->prompt;
    sched.add(seq.get());
    req->seqs.push_back(std::move(seq));
    requests.push_back(std::move(req));
  }
  // Prefill every prompt (untimed), until a step is all decodes.
  std::unordered_set<engine::Request*> touched;
  for (int guard = 0;; ++guard) {
    engine::SchedulerOutput batch = sched.schedule(0);
    const bool decode = batch.num_tokens == static_cast<int64_t>(batch.seqs.size()) &&
                        static_cast<int32_t>(batch.seqs.size()) == o.seqs;
    if (decode || guard > 100000) {
      if (!decode) throw std::runtime_error("host-step bench: the prompts never finished prefill");
      sched.postprocess(batch, draw(batch, rng), 0, stop, touched);
      break;
    }
    sched.postprocess(batch, draw(batch, rng), 0, stop, touched);
  }

  // The decode graph's layout: the batch padded to its bucket (here the batch itself), its block
  // table --max-model-len / block-size columns wide on the device; the step fills the columns its
  // longest sequence uses (ModelRunner::execute_graph). The baseline fills the whole width, as
  // before that change, timed in the same steps.
  const int64_t width = (o.max_model_len + o.block_size - 1) / o.block_size;
  const engine::StepLayout layout(o.seqs, o.seqs, 0, 0, width);
  std::vector<double> t_sched, t_inputs, t_full, t_post, t_total, in_bytes;
  for (int32_t step = 0; step < o.steps; ++step) {
    touched.clear();
    const auto t0 = Clock::now();
    engine::SchedulerOutput batch = sched.schedule(0);
    const double a = micros_since(t0);
    const auto t1 = Clock::now();
    int64_t used = 1;
    for (const engine::ScheduledSeq& s : batch.seqs) {
      used = std::max<int64_t>(used, static_cast<int64_t>(s.seq->block_table.size()));
    }
    const engine::StepLayout compact(o.seqs, o.seqs, 0, 0, used);
    at::Tensor buf = engine::step_host_buffer(compact, at::kCPU);
    engine::fill_step(batch, o.block_size, compact, buf);
    const double b = micros_since(t1);
    const auto t1b = Clock::now();
    at::Tensor full = engine::step_host_buffer(layout, at::kCPU);
    engine::fill_step(batch, o.block_size, layout, full);
    t_full.push_back(micros_since(t1b));
    in_bytes.push_back(static_cast<double>(compact.bytes));
    std::vector<engine::SeqSamples> sampled = draw(batch, rng);
    const auto t2 = Clock::now();
    sched.postprocess(batch, sampled, 0, stop, touched);
    const double c = micros_since(t2);
    if (static_cast<int32_t>(batch.seqs.size()) != o.seqs) {
      throw std::runtime_error("host-step bench: step " + std::to_string(step) + " scheduled " +
                               std::to_string(batch.seqs.size()) + " sequences, expected " +
                               std::to_string(o.seqs));
    }
    t_sched.push_back(a);
    t_inputs.push_back(b);
    t_post.push_back(c);
    t_total.push_back(a + b + c);
  }
  nlohmann::json result = {{"bench", "host-step"},
                           {"cpu", engine::kernels::describe_cpu()},
                           {"seqs", o.seqs},
                           {"prompt_len", o.prompt_len},
                           {"steps", o.steps},
                           {"block_size", o.block_size},
                           {"max_model_len", o.max_model_len},
                           {"input_bytes_full_width", layout.bytes},
                           {"input_bytes", median(in_bytes)}};
  std::cout << fmt::format(
      "host-step bench: {} sequences decoding, prompts {} tokens, {} steps; step inputs {:.0f} "
      "KiB (the used block-table columns; {} KiB at the graph's full width of {} columns)\n"
      "cpu: {}\n",
      o.seqs, o.prompt_len, o.steps, median(in_bytes) / 1024, layout.bytes / 1024, width,
      engine::kernels::describe_cpu());
  std::cout << fmt::format("{:<18} {:>10} {:>10}\n", "phase", "median_us", "p90_us");
  const std::pair<const char*, const std::vector<double>*> phases[] = {
      {"schedule", &t_sched},
      {"inputs", &t_inputs},
      {"postprocess", &t_post},
      {"total", &t_total},
      {"inputs_full_width", &t_full}};
  for (const auto& [name, v] : phases) {
    const double med = median(*v), p90 = percentile(*v, 0.9);
    result[name] = {{"median_us", med}, {"p90_us", p90}};
    std::cout << fmt::format("{:<18} {:>10.1f} {:>10.1f}\n", name, med, p90);
  }
  std::cout << fmt::format(
      "host work a decode step: {:.3f} ms (target 0.3 ms at 256 sequences); inputs at the full "
      "width (before): {:.1f} us, {:.1f}x the used columns\n",
      median(t_total) / 1000, median(t_full), median(t_full) / std::max(median(t_inputs), 1e-9));
  if (o.json) std::cout << result.dump() << "\n";
  if (!o.json_out.empty()) std::ofstream(o.json_out, std::ios::app) << result.dump() << "\n";
  return 0;
}

}  // namespace crl::bench
