#include "engine/llm_engine.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_set>

#include "common/check.h"
#include "common/units.h"
#include "engine/engine_shards.h"
#include "engine/sampler.h"
#include "engine/stop_checker.h"
#include "engine/tensor_sampler.h"

namespace crl::engine {
namespace {

// Adds the seconds from its construction to its destruction to *sink: a step phase's host time.
class PhaseTimer {
 public:
  explicit PhaseTimer(double* sink) : sink_(sink), t0_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() { *sink_ += seconds_since(t0_); }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double* sink_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

struct LlmEngine::Inbox {
  std::mutex mu;
  std::deque<GenerateRequest> adds;          // guarded by mu
  std::vector<std::string> aborts;           // guarded by mu
  std::unordered_set<std::string> live_ids;  // guarded by mu
  int64_t next_id = 0;                       // guarded by mu
};

LlmEngine::LlmEngine(const EngineConfig& config, sync::TpGroup* tp)
    : config_(config), inbox_(std::make_unique<Inbox>()) {
  config_.validate();
  if (config_.tensor_parallel_size > 1) {
    if (tp != nullptr) CRL_INVALID("tensor_parallel_size > 1 and a tensor-parallel group given");
    local_tp_ = LocalTpFollowers::start(config_);
    tp = &local_tp_->group();
  }
  if (tensor_parallel(tp)) {
    if (tp->rank() != 0) {
      throw std::logic_error("a tensor-parallel engine is built on group rank 0; rank " +
                             std::to_string(tp->rank()) + " runs LlmEngine::follow");
    }
  }
  if (config_.num_threads > 0) at::set_num_threads(config_.num_threads);
  const TransformerOptions opts = engine_model_options(config_);
  // Everything a rank of a tensor-parallel group builds before the group agrees it can start.
  std::exception_ptr failed;
  try {
    if (tensor_parallel(tp)) refuse_for_tensor_parallel(config_);
    model_ = load_engine_model(config_, opts, tp);
    const ModelConfig& mc = model_->config();

    if (text::Tokenizer::dir_has_tokenizer(config_.model_dir))
      tokenizer_ = std::make_unique<text::Tokenizer>(config_.model_dir);
    for (int64_t id : mc.eos_token_ids) eos_ids_.push_back(static_cast<int32_t>(id));
    if (eos_ids_.empty() && tokenizer_ && tokenizer_->eos_id() >= 0)
      eos_ids_.push_back(tokenizer_->eos_id());

    max_model_len_ = config_.max_model_len > 0 ? config_.max_model_len : mc.max_position_embeddings;
    if (max_model_len_ > mc.max_position_embeddings) {
      throw std::invalid_argument(
          "invalid engine setting 'max_model_len': " + std::to_string(max_model_len_) +
          " (the model supports " + std::to_string(mc.max_position_embeddings) + " positions)");
    }
    const int32_t num_blocks = engine_kv_blocks(config_, mc, opts.dtype);
    stop_ = std::make_unique<StopChecker>(tokenizer_.get(), eos_ids_, max_model_len_);
    config_.max_loras =
        std::max<int32_t>(config_.max_loras, static_cast<int32_t>(config_.lora_modules.size()));
    SchedulerConfig sc;
    sc.block_size = config_.block_size;
    sc.num_blocks = num_blocks;
    sc.max_batched_tokens = config_.max_batched_tokens;
    sc.max_seqs = config_.max_seqs;
    sc.enable_prefix_caching = config_.enable_prefix_caching;
    sc.static_batching = config_.static_batching;
    // Rows of one adapter next to each other: the forward runs each slot's rows as one run
    // (ModelRunner, LoraBatch::runs). Deterministic mode keeps the scheduler's order.
    sc.group_lora_rows = config_.max_loras > 0 && !config_.deterministic;
    scheduler_ = std::make_unique<Scheduler>(sc);
    runner_ = std::make_unique<ModelRunner>(*model_, config_.block_size, num_blocks);
  } catch (...) {
    if (!tensor_parallel(tp)) throw;
    failed = std::current_exception();
  }
  if (tensor_parallel(tp)) {
    agree_on_group(*tp, failed, runner_.get(), config_.model_dir);
    // Only now: the runner stops its followers when destroyed.
    runner_->set_tensor_parallel(tp, load_model_config(config_.model_dir));
  }
  const ModelConfig& mc = model_->config();
  std::unique_ptr<LoraSlots> lora_slots;
  std::vector<LoraAdapter> given;
  if (config_.max_loras > 0) {
    int64_t rank = config_.max_lora_rank;  // large enough for the adapters given at start
    for (const auto& [name, dir] : config_.lora_modules) {
      given.push_back(load_peft_adapter(dir, mc));
      rank = std::max(rank, given.back().rank);
    }
    config_.max_lora_rank = static_cast<int32_t>(rank);
    lora_slots = std::make_unique<LoraSlots>(mc, config_.max_loras, config_.max_lora_rank,
                                             parse_lora_targets(config_.lora_targets), opts.dtype,
                                             opts.device);
    model_->set_lora_slots(lora_slots.get());
    runner_->set_lora_slots(lora_slots.get());
  }
  loras_ = std::make_unique<LoraRegistry>(std::move(lora_slots), mc, opts.dtype, opts.device);
  for (size_t i = 0; i < given.size(); ++i) loras_->add(config_.lora_modules[i].first, given[i]);
  tensor_sampler_ =
      config_.sampler == "tensor" || (config_.sampler == "auto" && !opts.device.is_cpu());
  if (config_.cuda_graphs == "on" ||
      (config_.cuda_graphs == "auto" && opts.device.is_cuda() && !tensor_parallel(tp))) {
    std::vector<int64_t> buckets;
    for (int64_t b = 1; b < config_.max_seqs; b *= 2) buckets.push_back(b);
    buckets.push_back(config_.max_seqs);
    runner_->enable_cuda_graphs(std::move(buckets), max_model_len_);
  }
}

LlmEngine::~LlmEngine() {
  // The followers first (runner_ tells them; local_tp_, destroyed after it, joins their threads).
  if (runner_) {
    try {
      runner_->stop_followers();
    } catch (const std::exception&) {
      // A broken group: local_tp_ closes the channels.
    }
  }
}

std::vector<int32_t> LlmEngine::encode_prompt(const std::string& text,
                                              bool split_special_tokens) const {
  if (!tokenizer_) {
    throw std::invalid_argument(
        "this model has no tokenizer (tokenizer.json or tokenizer.model): send the prompt as token "
        "ids");
  }
  // As vLLM and transformers' tokenizer(text): the model's special tokens (BOS) are added.
  text::EncodeOptions options;
  options.add_special_tokens = true;
  options.split_special_tokens = split_special_tokens;
  // A prompt that cannot fit is refused before it is encoded whole (a megabytes-long prompt took
  // ~225 bytes of memory a byte to encode, only to be refused).
  if (tokenizer_->exceeds_tokens(text, max_model_len_, options)) {
    throw std::invalid_argument("the prompt (" + std::to_string(text.size()) +
                                " bytes) exceeds the context length " +
                                std::to_string(max_model_len_) + " tokens");
  }
  return tokenizer_->encode(text, options);
}

std::vector<int32_t> LlmEngine::prompt_prefix() const {
  return tokenizer_ ? tokenizer_->special_prefix() : std::vector<int32_t>();
}

std::string LlmEngine::add_request(GenerateRequest request) {
  validate_request(request);
  std::lock_guard<std::mutex> lock(inbox_->mu);
  if (request.request_id.empty()) {
    do {  // skip ids a caller chose explicitly
      request.request_id = "req-" + std::to_string(inbox_->next_id++);
    } while (inbox_->live_ids.count(request.request_id));
  }
  if (!inbox_->live_ids.insert(request.request_id).second) {
    throw std::invalid_argument("request id '" + request.request_id + "' is already in use");
  }
  std::string id = request.request_id;
  inbox_->adds.push_back(std::move(request));
  return id;
}

void LlmEngine::validate_request(GenerateRequest& request) const {
  const int64_t vocab = model_->config().vocab_size;
  request.params.validate(vocab);
  if (request.prompt_token_ids.empty()) request.prompt_token_ids = encode_prompt(request.prompt);
  if (request.prompt_token_ids.empty()) throw std::invalid_argument("the prompt is empty");
  if (!request.lora.empty()) loras_->check_known(request.lora);
  for (int32_t id : request.prompt_token_ids) {
    if (id < 0 || id >= vocab) {
      throw std::invalid_argument("prompt token id " + std::to_string(id) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_token_ids.size());
  const int64_t total = prompt_len + request.params.max_tokens;
  if (total > max_model_len_) {
    throw std::invalid_argument("prompt (" + std::to_string(prompt_len) +
                                " tokens) + max_tokens (" +
                                std::to_string(request.params.max_tokens) +
                                ") exceeds the context length " + std::to_string(max_model_len_));
  }
  if (scheduler_->blocks_for(total) > scheduler_->config().num_blocks) {
    throw std::invalid_argument("prompt + max_tokens (" + std::to_string(total) +
                                " tokens) does not fit the KV pool (" +
                                std::to_string(scheduler_->config().num_blocks) + " blocks of " +
                                std::to_string(config_.block_size) + " tokens)");
  }
}

void LlmEngine::abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(inbox_->mu);
  inbox_->aborts.push_back(request_id);
}

bool LlmEngine::has_unfinished() const {
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    if (!inbox_->adds.empty() || !inbox_->aborts.empty()) return true;
  }
  return !requests_.empty();
}

void LlmEngine::admit(GenerateRequest&& r) {
  auto req = std::make_unique<Request>();
  req->id = r.request_id;
  req->arrival = next_arrival_++;
  req->params = std::move(r.params);
  req->prompt = std::move(r.prompt_token_ids);
  const LoraRegistry::Binding lora = loras_->bind(r.lora);  // no name: the RL policy, if any
  req->lora_slot = lora.slot;
  req->lora_uid = lora.uid;
  if (lora.policy) req->policy_version = weight_version_;
  // Requests without a seed get a distinct one derived from the engine seed and arrival order.
  req->seed = req->params.seed
                  ? *req->params.seed
                  : config_.seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(req->arrival) + 1;
  if (req->params.min_tokens > 0) {
    if (!req->params.ignore_eos) req->banned_until_min_tokens = eos_ids_;
    for (int32_t id : req->params.stop_token_ids) req->banned_until_min_tokens.push_back(id);
  }
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = scheduler_->new_seq_id();
  seq->request = req.get();
  seq->tokens = req->prompt;
  scheduler_->add(seq.get());
  req->seqs.push_back(std::move(seq));
  requests_[req->id] = std::move(req);
}

void LlmEngine::abort_now(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  for (auto& s : it->second->seqs) {
    if (!s->is_finished())
      scheduler_->finish(s.get(), FinishReason::kAbort);  // padding keeps its reason
  }
}

void LlmEngine::compute_prompt_logprobs(const ScheduledSeq& s, const ForwardOutput& fwd,
                                        int64_t row) {
  Request* req = s.seq->request;
  const int64_t prompt_len = s.seq->prompt_len();
  // Position p predicts prompt[p + 1]; only prompt positions before the last one have a target.
  const int64_t end = std::min(s.start + s.num_tokens, prompt_len - 1);
  // Positions already recorded (a recompute after preemption) are skipped.
  const int64_t begin =
      std::max<int64_t>(s.start, static_cast<int64_t>(req->prompt_logprobs.size()));
  constexpr int64_t kTile = 64;  // never materialise full-vocabulary logits for a whole prompt
  for (int64_t p = begin; p < end; p += kTile) {
    const int64_t n = std::min(kTile, end - p);
    auto logits = to_host(runner_->row_logits(fwd, row + (p - s.start), n));
    std::vector<int32_t> targets(req->prompt.begin() + p + 1, req->prompt.begin() + p + 1 + n);
    auto lp = token_logprobs(logits.contiguous(), targets, *req->params.prompt_logprobs);
    for (auto& [value, top] : lp) {
      req->prompt_logprobs.push_back(value);
      req->prompt_top_logprobs.push_back(std::move(top));
    }
  }
}

void LlmEngine::fail_batch(const SchedulerOutput& batch, const std::string& what,
                           std::unordered_set<Request*>& touched) {
  for (const ScheduledSeq& s : batch.seqs) {
    Request* req = s.seq->request;
    if (req->error.empty()) req->error = "engine step failed: " + what;
    for (auto& seq : req->seqs) {
      if (!seq->is_finished()) scheduler_->finish(seq.get(), FinishReason::kAbort);
    }
    touched.insert(req);
  }
}

std::vector<RequestOutput> LlmEngine::step() {
  at::NoGradGuard no_grad;
  record_ = StepRecord();
  step_d2h_bytes_ = 0;
  std::unordered_set<Request*> touched;
  SchedulerOutput batch;
  {
    PhaseTimer timer(&record_.schedule_seconds);
    touched = drain_inbox();
    batch = scheduler_->schedule(weight_version_);
  }
  if (!batch.empty()) run_batch(batch, touched);
  std::vector<RequestOutput> outputs = collect_outputs(touched);
  end_step(batch);
  return outputs;
}

void LlmEngine::run_batch(const SchedulerOutput& batch, std::unordered_set<Request*>& touched) {
  try {
    // After a colocated hand-over the pool comes back with the first work (a failure, say no
    // device memory, fails this batch's requests, and the next step tries again).
    restore_kv_cache();
    std::vector<SeqSamples> sampled = sample(run(batch));
    PhaseTimer timer(&record_.finish_seconds);
    scheduler_->postprocess(batch, sampled, weight_version_, *stop_, touched);
  } catch (const std::exception& e) {
    // A failed forward or sampling step fails the requests in this batch, not the engine.
    PhaseTimer timer(&record_.finish_seconds);
    fail_batch(batch, e.what(), touched);
  }
}

void LlmEngine::end_step(const SchedulerOutput& batch) {
  stats_.max_step_d2h_bytes = std::max(stats_.max_step_d2h_bytes, step_d2h_bytes_);
  stats_.schedule_seconds += record_.schedule_seconds;
  stats_.forward_seconds += record_.forward_seconds;
  stats_.sample_seconds += record_.sample_seconds;
  stats_.finish_seconds += record_.finish_seconds;
  if (step_observer_ && !batch.empty()) {
    record_.step = stats_.steps;
    record_.seqs = static_cast<int64_t>(batch.seqs.size());
    record_.tokens = batch.num_tokens;
    step_observer_(record_);
  }
}

LlmEngine::BatchLogits LlmEngine::run(const SchedulerOutput& batch) {
  stats_.steps++;
  stats_.max_used_blocks =
      std::max(stats_.max_used_blocks, scheduler_->allocator().num_used_blocks());
  PhaseTimer timer(&record_.forward_seconds);
  ForwardOutput fwd = runner_->execute(batch);
  stats_.h2d_bytes += fwd.h2d_bytes;
  // Prompt log-probs, and the sequences that sample a next token (fwd.sample_hidden's rows).
  BatchLogits out;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    const int64_t prompt_part =
        std::max<int64_t>(0, std::min(s.start + s.num_tokens, s.seq->prompt_len()) - s.start);
    stats_.prompt_tokens_computed += prompt_part;
    record_.prefill_tokens += prompt_part;
    if (s.seq->request->params.prompt_logprobs && s.start < s.seq->prompt_len() - 1) {
      compute_prompt_logprobs(s, fwd, fwd.row_start[i]);
    }
    if (s.sample) out.seqs.push_back(s.seq);
  }
  if (!out.seqs.empty()) {
    out.logits = runner_->sample_logits(fwd);
    if (!tensor_sampler_) out.logits = to_host(out.logits).contiguous();
  }
  return out;
}

std::vector<SeqSamples> LlmEngine::sample(const BatchLogits& in) {
  if (in.seqs.empty()) return {};
  PhaseTimer timer(&record_.sample_seconds);
  // One sampling row per sample; an unforked parent of an n > 1 request draws all n.
  std::vector<SampleRow> rows;
  std::vector<SeqSamples> out(in.seqs.size());
  // Each sequence's penalty entries (only for requests with penalties), alive until sampled.
  std::vector<std::vector<PenaltyEntry>> penalties(in.seqs.size());
  for (size_t i = 0; i < in.seqs.size(); ++i) {
    Sequence* seq = in.seqs[i];
    Request* req = seq->request;
    const bool fork = !req->forked && req->params.n > 1;
    const int32_t count = fork ? req->params.n : 1;
    penalties[i] = penalty_entries(req->params, seq->tokens, seq->prompt_len());
    for (int32_t k = 0; k < count; ++k) {
      SampleRow r;
      r.logits_row = static_cast<int64_t>(i);
      r.params = &req->params;
      r.seed = req->seed;
      r.sample_index = fork ? k : seq->sample_index;
      r.position = static_cast<int64_t>(seq->tokens.size());
      r.banned =
          seq->num_generated() < req->params.min_tokens ? &req->banned_until_min_tokens : nullptr;
      r.penalties = &penalties[i];
      rows.push_back(r);
    }
    if (observer_) {
      observer_(req->id, seq->sample_index, static_cast<int64_t>(seq->tokens.size()),
                to_host(in.logits[static_cast<int64_t>(i)]));
    }
  }
  std::vector<SampleResult> results;
  if (tensor_sampler_) {
    TensorSamplerStats st;
    results = sample_tokens_tensor(in.logits, rows, &st, /*fused=*/config_.gpu_kernels == "auto");
    stats_.h2d_bytes += st.h2d_bytes;
    stats_.d2h_bytes += st.d2h_bytes;
    step_d2h_bytes_ += st.d2h_bytes;
  } else {
    results = sample_tokens(in.logits, rows);
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    SeqSamples& ss = out[static_cast<size_t>(rows[r].logits_row)];
    ss.seq = in.seqs[static_cast<size_t>(rows[r].logits_row)];
    ss.samples.push_back(std::move(results[r]));
  }
  return out;
}

at::Tensor LlmEngine::to_host(const at::Tensor& t) {
  if (t.device().is_cpu()) return t;
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  stats_.d2h_bytes += bytes;
  step_d2h_bytes_ += bytes;
  return t.to(at::kCPU);
}

std::unordered_set<Request*> LlmEngine::drain_inbox() {
  std::deque<GenerateRequest> adds;
  std::vector<std::string> aborts;
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    adds.swap(inbox_->adds);
    aborts.swap(inbox_->aborts);
  }
  for (auto& r : adds) admit(std::move(r));
  for (const auto& id : aborts) abort_now(id);
  std::unordered_set<Request*> finished;
  for (auto& [id, req] : requests_) {
    if (req->is_finished()) finished.insert(req.get());  // aborted just now
  }
  return finished;
}

std::vector<RequestOutput> LlmEngine::collect_outputs(const std::unordered_set<Request*>& touched) {
  PhaseTimer timer(&record_.finish_seconds);
  stats_.preemptions = scheduler_->num_preemptions();
  stats_.prefix_hit_tokens = scheduler_->num_prefix_hit_tokens();
  stats_.generated_tokens = scheduler_->num_generated_tokens();
  std::vector<RequestOutput> outputs;
  std::vector<std::string> done;
  for (Request* req : touched) {
    // generate() reads only finished outputs: skip copying the running ones' growing token lists.
    if (finished_outputs_only_ && !req->is_finished()) continue;
    outputs.push_back(make_output(*req));
    if (outputs.back().finished) done.push_back(req->id);
  }
  if (!done.empty()) {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    for (const auto& id : done) {
      inbox_->live_ids.erase(id);
      requests_.erase(id);
    }
  }
  return outputs;
}

RequestOutput LlmEngine::make_output(const Request& req) const {
  RequestOutput out;
  out.request_id = req.id;
  out.prompt_token_ids = req.prompt;
  out.prompt_logprobs = req.prompt_logprobs;
  out.prompt_top_logprobs = req.prompt_top_logprobs;
  out.finished = req.is_finished();
  out.error = req.error;
  int64_t first = -1, last = -1;
  for (const auto& s : req.seqs) {
    for (int64_t v : s->token_versions) {
      if (first < 0 || v < first) first = v;
      last = std::max(last, v);
    }
  }
  out.weight_version = last >= 0 ? last : weight_version_;
  out.first_weight_version = first >= 0 ? first : out.weight_version;
  for (const auto& s : req.seqs) {
    CompletionOutput c;
    c.index = s->sample_index;
    const int64_t generated = static_cast<int64_t>(s->raw_logprobs.size());
    c.token_ids.assign(s->tokens.begin() + s->prompt_len(),
                       s->tokens.begin() + s->prompt_len() + generated);
    c.raw_logprobs = s->raw_logprobs;
    c.processed_logprobs = s->processed_logprobs;
    c.top_logprobs = s->top_logprobs;
    c.token_versions = s->token_versions;
    c.finish_reason = s->is_finished() ? s->finish_reason : FinishReason::kNone;
    c.stop_token = s->stop_token;
    c.stop_string = s->stop_string;
    if (s->stop_string) {
      c.text = s->text;
    } else if (tokenizer_ && (s->is_finished() || out.finished)) {
      c.text = stop_->detokenize(c.token_ids, req.params.skip_special_tokens);
    }
    out.num_cached_tokens = std::max(out.num_cached_tokens, s->num_cached_prompt_tokens);
    out.outputs.push_back(std::move(c));
  }
  std::sort(out.outputs.begin(), out.outputs.end(),
            [](const CompletionOutput& a, const CompletionOutput& b) { return a.index < b.index; });
  return out;
}

std::vector<RequestOutput> LlmEngine::generate(std::vector<GenerateRequest> requests) {
  std::vector<std::string> ids;
  ids.reserve(requests.size());
  try {
    for (auto& r : requests) ids.push_back(add_request(std::move(r)));
  } catch (...) {
    for (const auto& id : ids) abort(id);  // all or nothing
    throw;
  }
  const std::unordered_set<std::string> mine(ids.begin(), ids.end());
  std::unordered_map<std::string, RequestOutput> finished;
  finished_outputs_only_ = true;
  struct Restore {
    bool& flag;
    ~Restore() { flag = false; }
  } restore{finished_outputs_only_};
  while (finished.size() < ids.size()) {
    for (auto& out : step()) {
      if (out.finished && mine.count(out.request_id)) finished[out.request_id] = std::move(out);
    }
  }
  std::vector<RequestOutput> outs;
  outs.reserve(ids.size());
  for (const auto& id : ids) outs.push_back(std::move(finished.at(id)));
  return outs;
}

WeightBuffers& LlmEngine::attach_weight_buffers(int64_t bucket_bytes) {
  if (runner_->tensor_parallel()) {
    CRL_INVALID(
        "a tensor-parallel engine's shards are not sync buckets: attach_weight_layout stages "
        "each bucket and lands every rank's slices");
  }
  if (!weight_buffers_) {
    weight_buffers_ = std::make_unique<WeightBuffers>(*model_, bucket_bytes);
    runner_->reset_cuda_graphs();  // they read the weights' old storage
  }
  return *weight_buffers_;
}

const sync::WeightLayout& LlmEngine::attach_weight_lanes(int64_t bucket_bytes) {
  if (!local_tp_) {
    CRL_INVALID(
        "sync lanes are for an in-process tensor-parallel engine (tensor_parallel_size > 1)");
  }
  if (weight_staging_.defined()) {
    CRL_INVALID("this engine's updates are already staged on its leader (attach_weight_layout)");
  }
  runner_->throw_if_group_broken();  // also after a failed earlier call
  if (!weight_buffers_) {
    weight_buffers_ = std::make_unique<WeightBuffers>(*model_, bucket_bytes);
    local_tp_->lanes().put(0, weight_buffers_->buckets());
    runner_->plan_tp_lanes(bucket_bytes);
    lane_buckets_ = local_tp_->lanes().all();
  }
  return weight_buffers_->layout();
}

const sync::WeightLayout& LlmEngine::attach_weight_layout(int64_t bucket_bytes) {
  if (!runner_->tensor_parallel()) return attach_weight_buffers(bucket_bytes).layout();
  if (!lane_buckets_.empty()) {
    CRL_INVALID("this engine's ranks receive their updates over sync lanes (attach_weight_lanes)");
  }
  const sync::WeightLayout& layout = runner_->attach_tp_weights(bucket_bytes);
  if (!weight_staging_.defined()) {
    weight_staging_ = at::empty({std::max<int64_t>(layout.max_bucket_nbytes(), 1)},
                                at::TensorOptions(at::kByte).device(model_->options().device));
  }
  return layout;
}

sync::SyncStats LlmEngine::receive_weight_update(sync::WeightSource& source, int64_t v,
                                                 InflightPolicy policy) {
  sync::SyncStats st;
  if (!lane_buckets_.empty()) {
    // Every rank past its last step (and none gone: a broken group throws here), then every
    // rank's slices straight into its buckets.
    runner_->quiesce_followers();
    std::vector<std::vector<at::Tensor>*> lanes;
    for (auto& buckets : lane_buckets_) lanes.push_back(&buckets);
    st = source.receive_lanes(lanes, v);
  } else if (weight_staging_.defined()) {
    st = source.receive_staged(v, weight_staging_, [this](int64_t bucket, const at::Tensor& bytes) {
      runner_->land_weights(bucket, bytes);
    });
  } else {
    st = source.receive(update_buckets(), v);
  }
  apply_weight_update(v, policy);
  return st;
}

std::vector<at::Tensor>& LlmEngine::update_buckets() {
  if (LoraBuffers* adapter = loras_->policy_buffers()) return adapter->buckets();
  if (!weight_buffers_) {
    throw std::logic_error(
        "the engine's weights are not in sync buckets (attach_weight_buffers was not called)");
  }
  return weight_buffers_->buckets();
}

void LlmEngine::apply_weight_update(int64_t v, InflightPolicy policy) {
  if (loras_->has_policy()) {
    // The new version into a slot no unfinished request uses, where one is free.
    std::unordered_map<int32_t, int64_t> in_use;
    for (const auto& [id, req] : requests_) {
      if (!req->is_finished() && req->lora_slot >= 0) in_use[req->lora_slot]++;
    }
    const LoraRegistry::Binding b = loras_->load_policy(in_use);
    for (auto& [id, req] : requests_) {  // requests of a reused slot go on under the new version
      if (req->lora_slot == b.slot) req->lora_uid = b.uid;
    }
  }
  set_weight_version(v, policy);
}

const char* inflight_policy_name(InflightPolicy policy) {
  switch (policy) {
    case InflightPolicy::kKeep:
      return "keep";
    case InflightPolicy::kRecompute:
      return "recompute";
    case InflightPolicy::kAbort:
      return "abort";
  }
  return "?";
}

InflightPolicy parse_inflight_policy(const std::string& name) {
  if (name == "keep") return InflightPolicy::kKeep;
  if (name == "recompute") return InflightPolicy::kRecompute;
  if (name == "abort") return InflightPolicy::kAbort;
  throw std::invalid_argument("unknown in-flight update policy '" + name +
                              "' (keep, recompute or abort)");
}

void LlmEngine::set_weight_version(int64_t v, InflightPolicy policy) {
  weight_version_ = v;
  if (loras_->has_policy()) {
    // The policy's slot holds version v now; its requests (all of them unless kKeep) record it.
    const LoraRegistry::Binding b = loras_->set_policy_version(v);
    for (auto& [id, req] : requests_) {
      if (req->lora_slot == b.slot ||
          (policy != InflightPolicy::kKeep && req->policy_version >= 0)) {
        req->lora_slot = b.slot;
        req->lora_uid = b.uid;
        req->policy_version = v;
      }
    }
  }
  scheduler_->on_weight_update(policy);
}

void LlmEngine::reset_prefix_cache() { scheduler_->reset_prefix_cache(); }

void LlmEngine::release_kv_cache() {
  if (runner_->kv_cache_released()) return;
  if (has_unfinished()) {
    throw std::logic_error(fmt::format(
        "cannot release the KV pool: {} request(s) in flight (the hand-over comes between steps "
        "with nothing running)",
        requests_.size()));
  }
  const auto t0 = std::chrono::steady_clock::now();
  scheduler_->reset_prefix_cache();  // the cached blocks' contents go with the pool
  runner_->release_kv_cache();
  stats_.kv_release_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.kv_releases;
}

void LlmEngine::restore_kv_cache() {
  if (!runner_->kv_cache_released()) return;
  const auto t0 = std::chrono::steady_clock::now();
  runner_->restore_kv_cache();
  stats_.kv_restore_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.kv_restores;
}

bool LlmEngine::kv_cache_released() const { return runner_->kv_cache_released(); }

}  // namespace crl::engine
