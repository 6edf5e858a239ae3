#include "engine/model_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/check.h"
#include "common/host_memory.h"
#include "engine/cuda_graph.h"
#include "engine/step_inputs.h"
#include "kv/paged_attention.h"

namespace crl::engine {

namespace {

// What a tensor-parallel leader tells its followers (the first word of its header).
enum TpCommand : int64_t {
  kTpStop = 0,
  kTpStep = 1,
  kTpRelease = 2,
  kTpRestore = 3,
  kTpPlanWeights = 4,  // bucket_bytes
  kTpLandWeights = 5,  // bucket; payload: its bytes
  kTpLogits = 6,       // rows (kTpSampleRows, or the first of `count` hidden rows), count
  kTpPlanLanes = 7,    // bucket_bytes: each rank's weights into sync buckets of its own
  kTpQuiesce = 8,      // a barrier: the leader is about to write into the ranks' weights
};
constexpr int64_t kTpSampleRows = -1;
constexpr const char* kTpNoGraphs =
    "a tensor-parallel engine runs its steps eagerly: CUDA graphs are not supported";
constexpr size_t kTpStepWords = 8;  // command, rows, seqs, samples, pairs, max_blocks, max_q,
                                    // max_ctx

// Writes the new tokens' K/V into the paged cache, then attends through the block tables.
class PagedKvAttention : public AttentionBackend {
 public:
  PagedKvAttention(at::Tensor kv_cache, kv::PagedAttentionMetadata meta, double scale)
      : kv_cache_(std::move(kv_cache)), meta_(std::move(meta)), scale_(scale) {}

  at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v) override {
    at::Tensor k_cache = kv_cache_[0][layer];
    at::Tensor v_cache = kv_cache_[1][layer];
    kv::write_kv_cache(k_cache, v_cache, k, v, meta_.slot_mapping);
    return kv::paged_attention(q, k_cache, v_cache, meta_, scale_);
  }

 private:
  at::Tensor kv_cache_;
  kv::PagedAttentionMetadata meta_;
  double scale_;
};

}  // namespace

int64_t ModelRunner::block_bytes(const ModelConfig& c, at::ScalarType dtype, int32_t block_size) {
  return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

ModelRunner::ModelRunner(const Transformer& model, int32_t block_size, int32_t num_blocks)
    : model_(model), block_size_(block_size), num_blocks_(num_blocks) {
  allocate_kv_cache();
}

void ModelRunner::allocate_kv_cache() {
  const auto& c = model_.config();
  kv_cache_ = zeros_in_huge_pages(
      {2, c.num_layers, num_blocks_, block_size_, c.num_kv_heads, c.head_dim},
      at::TensorOptions().dtype(model_.options().dtype).device(model_.options().device),
      "the KV cache pool");
}

void ModelRunner::release_kv_cache() {
  if (kv_released_) return;
  tell_followers({kTpRelease});
  if (kv_cache_.device().is_cpu()) {
    drop_host_pages(kv_cache_);
  } else {
    reset_cuda_graphs();  // they read the pool's addresses
    kv_cache_ = at::Tensor();
    release_cached_device_memory(model_.options().device);
  }
  kv_released_ = true;
}

void ModelRunner::restore_kv_cache() {
  if (!kv_released_) return;
  tell_followers({kTpRestore});
  if (!kv_cache_.defined()) allocate_kv_cache();
  kv_released_ = false;
}

// One captured decode forward: static inputs in one device buffer (StepLayout of `bucket` rows and
// sequences), replayed after one upload into it. A LoRA graph also reads a static mask [bucket,
// S * r] (LoraSlots::row_mask; padding rows take no adapter): every row on the masked product, so
// one graph serves any mix of slots, and the slots' A and B are read in place (updates copy into
// them), so a new adapter version needs no capture.
struct ModelRunner::DecodeGraph {
  int64_t bucket = 0;
  std::unique_ptr<StepLayout> layout;
  at::Tensor inputs;     // [layout.bytes] uint8 on the device
  at::Tensor lora_mask;  // LoRA graphs: [bucket, S * r] in the slots' dtype on the device
  std::unique_ptr<CudaGraph> graph;
};

ModelRunner::~ModelRunner() {
  try {
    stop_followers();
  } catch (const std::exception&) {
    // A broken group: the followers end at their deadline, naming it.
  }
}

void ModelRunner::enable_cuda_graphs(std::vector<int64_t> buckets, int64_t max_model_len) {
  if (!kv_cache_.device().is_cuda()) {
    CRL_INVALID("CUDA graphs need the model on a CUDA device, not ", kv_cache_.device());
  }
  if (tp_ != nullptr) {
    CRL_INVALID(kTpNoGraphs);
  }
  std::sort(buckets.begin(), buckets.end());
  graph_buckets_ = std::move(buckets);
  graph_max_blocks_ = (max_model_len + block_size_ - 1) / block_size_;
  reset_cuda_graphs();
}

void ModelRunner::reset_cuda_graphs() {
  graphs_.clear();
  lora_graphs_.clear();
}

void ModelRunner::capture_cuda_graphs(bool lora) {
  const at::Device device = kv_cache_.device();
  const double scale = 1.0 / std::sqrt(static_cast<double>(model_.config().head_dim));
  const int64_t max_position = model_.config().max_position_embeddings - 1;
  auto& graphs = lora ? lora_graphs_ : graphs_;
  // Largest first, all in one memory pool (no two graphs ever replay concurrently).
  const CudaGraph* pool = !graphs_.empty()        ? graphs_.front()->graph.get()
                          : !lora_graphs_.empty() ? lora_graphs_.front()->graph.get()
                                                  : nullptr;
  for (auto it = graph_buckets_.rbegin(); it != graph_buckets_.rend(); ++it) {
    auto g = std::make_unique<DecodeGraph>();
    g->bucket = *it;
    g->layout = std::make_unique<StepLayout>(g->bucket, g->bucket, 0, 0, graph_max_blocks_);
    at::Tensor host = step_host_buffer(*g->layout, device);
    fill_step(SchedulerOutput(), block_size_, *g->layout, host);  // all padding
    g->inputs = host.to(device);
    LoraBatch batch;
    if (lora) {
      g->lora_mask = lora_->row_mask(std::vector<int32_t>(static_cast<size_t>(g->bucket), -1));
      batch.mask = g->lora_mask;
    }
    const StepLayout& l = *g->layout;
    const kv::PagedAttentionMetadata meta =
        l.metadata(g->inputs, 1, graph_max_blocks_ * block_size_);
    const at::Tensor tokens = StepLayout::view(g->inputs, l.tok, l.rows, at::kLong);
    const at::Tensor positions = StepLayout::view(g->inputs, l.pos, l.rows, at::kLong);
    auto forward = [&]() {
      PagedKvAttention attention(kv_cache_, meta, scale);
      return model_.forward_hidden(tokens, positions, attention, max_position, batch);
    };
    g->graph = capture_cuda_graph(forward, device, pool);
    ++graph_captures_;
    if (pool == nullptr) pool = g->graph.get();
    graphs.push_back(std::move(g));
  }
  std::reverse(graphs.begin(), graphs.end());  // ascending buckets
}

namespace {

// Each forward row's LoRA slot (-1: the base), and whether any row has one.
bool lora_rows(const SchedulerOutput& batch, std::vector<int32_t>* slots) {
  bool any = false;
  for (const ScheduledSeq& s : batch.seqs) {
    const int32_t slot = s.seq->request->lora_slot;
    any |= slot >= 0;
    if (slots != nullptr) slots->insert(slots->end(), static_cast<size_t>(s.num_tokens), slot);
  }
  return any;
}

}  // namespace

ModelRunner::DecodeGraph* ModelRunner::graph_for(const SchedulerOutput& batch) {
  if (graph_buckets_.empty() || batch.seqs.empty()) return nullptr;
  const bool lora = lora_ != nullptr && lora_rows(batch, nullptr);
  const int64_t n = static_cast<int64_t>(batch.seqs.size());
  if (n > graph_buckets_.back() || batch.num_tokens != n) return nullptr;
  for (const ScheduledSeq& s : batch.seqs) {
    if (s.num_tokens != 1 || !s.sample ||
        static_cast<int64_t>(s.seq->block_table.size()) > graph_max_blocks_) {
      return nullptr;
    }
  }
  auto& graphs = lora ? lora_graphs_ : graphs_;
  if (graphs.empty()) capture_cuda_graphs(lora);
  for (auto& g : graphs) {
    if (g->bucket >= n) return g.get();
  }
  return nullptr;
}

ForwardOutput ModelRunner::execute_graph(const SchedulerOutput& batch, DecodeGraph& g) {
  ForwardOutput out;
  const at::Device device = kv_cache_.device();
  const int64_t n = static_cast<int64_t>(batch.seqs.size());
  if (!batch.block_copies.empty()) {
    StepLayout pairs(0, 0, 0, static_cast<int64_t>(batch.block_copies.size()), 1);
    at::Tensor host = step_host_buffer(pairs, device);
    SchedulerOutput copies_only;
    copies_only.block_copies = batch.block_copies;
    fill_step(copies_only, block_size_, pairs, host);
    at::Tensor dev = host.to(at::TensorOptions().device(device), /*non_blocking=*/true);
    out.h2d_bytes += host.numel();
    kv::copy_blocks(kv_cache_,
                    StepLayout::view(dev, pairs.pair, 2 * pairs.pairs, at::kLong).view({-1, 2}));
  }
  // The graph's block table is graph_max_blocks_ columns wide; the step fills and uploads only the
  // columns its longest sequence uses (the kernels read no further than each context), the
  // sections before it with one copy. (At Qwen2-0.5B's 32k context and 256 sequences: 2 MiB a
  // step before, 128 KiB with 2k-token contexts.)
  int64_t used = 1;
  for (const ScheduledSeq& s : batch.seqs) {
    used = std::max<int64_t>(used, static_cast<int64_t>(s.seq->block_table.size()));
  }
  const StepLayout& full = *g.layout;
  const StepLayout compact(full.rows, full.seqs, full.samples, full.pairs, used);
  CRL_CHECK(compact.bt == full.bt, "step inputs: the block table must be the last section");
  at::Tensor host = step_host_buffer(compact, device);
  fill_step(batch, block_size_, compact, host);
  copy_rows_to_device(g.inputs, full.bt, full.max_blocks * 4, host, compact.bt, used * 4, used * 4,
                      full.seqs);
  g.inputs.narrow(0, 0, compact.bt).copy_(host.narrow(0, 0, compact.bt), /*non_blocking=*/true);
  out.h2d_bytes += compact.bt + full.seqs * used * 4;
  if (g.lora_mask.defined()) {
    std::vector<int32_t> row_slots;
    lora_rows(batch, &row_slots);
    row_slots.resize(static_cast<size_t>(g.bucket), -1);  // padding rows: no adapter
    // From pinned memory, queued before the replay on the same stream (no host wait).
    const at::Tensor mask = lora_->row_mask(row_slots, /*on_host=*/true).pin_memory();
    g.lora_mask.copy_(mask, /*non_blocking=*/true);
    out.h2d_bytes += mask.numel() * mask.element_size();
  }
  g.graph->replay();
  out.hidden = g.graph->output().narrow(0, 0, n);
  out.sample_hidden = out.hidden;
  out.row_start.resize(n);
  std::iota(out.row_start.begin(), out.row_start.end(), 0);
  return out;
}

void ModelRunner::set_tensor_parallel(sync::TpGroup* group, const ModelConfig& full) {
  if (group != nullptr && group->size() > 1) {
    if (!graph_buckets_.empty()) {
      CRL_INVALID(kTpNoGraphs);
    }
    tp_ = group;
    tp_full_ = full;
  }
}

void ModelRunner::throw_if_group_broken() const {
  if (!tp_broken_.empty()) {
    throw std::runtime_error("the tensor-parallel group " + tp_->name() +
                             " is broken by an earlier failure: " + tp_broken_);
  }
}

void ModelRunner::plan_tp_landing(int64_t bucket_bytes) {
  tp_landing_ = std::make_unique<TpWeightLanding>(model_, tp_full_,
                                                  TpShard{tp_->rank(), tp_->size()}, bucket_bytes);
}

void ModelRunner::land_and_wait(int64_t bucket, const at::Tensor& bytes) {
  tp_landing_->land(bucket, bytes);
  // Every rank has its slices: the leader may reuse the buffer (in one process the followers
  // read the leader's own bytes).
  wait_for_group();
}

void ModelRunner::wait_for_group() {
  tp_->all_reduce_sum(at::zeros({1}, at::TensorOptions().device(tp_->device())));
}

void ModelRunner::plan_tp_lanes(int64_t bucket_bytes) {
  CRL_CHECK(tp_ != nullptr && tp_->rank() == 0, "plan_tp_lanes: not a tensor-parallel leader");
  throw_if_group_broken();
  try {
    tell_followers({kTpPlanLanes, bucket_bytes});
    wait_for_group();  // every rank's buckets exist and are registered
  } catch (const std::exception& e) {
    tp_broken_ = e.what();
    tp_->abort();
    throw std::runtime_error(
        fmt::format("moving the weights of the tensor-parallel group {} into sync buckets: {}",
                    tp_->name(), e.what()));
  }
}

void ModelRunner::quiesce_followers() {
  CRL_CHECK(tp_ != nullptr && tp_->rank() == 0, "quiesce_followers: not a tensor-parallel leader");
  throw_if_group_broken();
  try {
    tell_followers({kTpQuiesce});
    wait_for_group();
  } catch (const std::exception& e) {
    tp_broken_ = e.what();
    tp_->abort();
    throw std::runtime_error(fmt::format("the tensor-parallel group {} before a weight update: {}",
                                         tp_->name(), e.what()));
  }
}

const sync::WeightLayout& ModelRunner::attach_tp_weights(int64_t bucket_bytes) {
  CRL_CHECK(tp_ != nullptr && tp_->rank() == 0, "attach_tp_weights: not a tensor-parallel leader");
  if (!tp_landing_) {
    plan_tp_landing(bucket_bytes);
    tell_followers({kTpPlanWeights, bucket_bytes});
  }
  return tp_landing_->layout();
}

void ModelRunner::land_weights(int64_t bucket, const at::Tensor& bytes) {
  CRL_CHECK(tp_ != nullptr && tp_->rank() == 0, "land_weights: not a tensor-parallel leader");
  throw_if_group_broken();
  CRL_CHECK(tp_landing_, "land_weights before attach_tp_weights");
  const sync::Bucket& b = tp_landing_->layout().buckets().at(bucket);
  try {
    tell_followers({kTpLandWeights, bucket}, bytes.narrow(0, 0, b.nbytes));
    land_and_wait(bucket, bytes);
  } catch (const std::exception& e) {
    // The followers may be inside the wait: end the group (on the CPU they fail at once, over
    // NCCL at the collective's deadline) and take no further step.
    tp_broken_ = e.what();
    tp_->abort();
    const auto& specs = tp_landing_->layout().specs();
    throw std::runtime_error(fmt::format(
        "landing weight bucket {} ({} bytes, tensors {} .. {}) on the tensor-parallel group {}: {}",
        bucket, b.nbytes, specs[b.entries.front().tensor].name, specs[b.entries.back().tensor].name,
        tp_->name(), e.what()));
  }
}

at::Tensor ModelRunner::sample_logits(const ForwardOutput& fwd) {
  return lead_logits(fwd.sample_hidden, kTpSampleRows);
}

at::Tensor ModelRunner::row_logits(const ForwardOutput& fwd, int64_t first, int64_t count) {
  return lead_logits(fwd.hidden.narrow(0, first, count), first);
}

at::Tensor ModelRunner::lead_logits(const at::Tensor& rows, int64_t which) {
  if (tp_ == nullptr || !model_.splits_vocab()) return model_.compute_logits(rows);
  throw_if_group_broken();
  try {
    tell_followers({kTpLogits, which, rows.size(0)});
    const at::Tensor all = gather_logits(rows);  // [n, R, V / n]
    // Rank r's columns are the vocabulary's r-th part.
    return all.permute({1, 0, 2}).reshape({all.size(1), all.size(0) * all.size(2)});
  } catch (const std::exception& e) {
    tp_broken_ = e.what();  // the followers may be inside the gather
    tp_->abort();
    throw;
  }
}

at::Tensor ModelRunner::gather_logits(const at::Tensor& rows) {
  // [R, V / n], where the group's collectives run (the CPU for a Gloo group of GPU shards).
  const at::Tensor part = model_.compute_logits(rows).to(tp_->device()).contiguous();
  if (tp_->rank() != 0) {
    tp_->gather_to_leader(part, at::Tensor());  // only the leader samples
    return at::Tensor();
  }
  at::Tensor all = at::empty({tp_->size(), part.size(0), part.size(1)}, part.options());
  tp_->gather_to_leader(part, all);
  return all.to(rows.device());
}

void ModelRunner::tell_followers(const std::vector<int64_t>& words, const at::Tensor& payload) {
  if (tp_ == nullptr || tp_->rank() != 0 || followers_stopped_) return;
  tp_->lead(words, payload);
}

void ModelRunner::stop_followers() {
  if (tp_ == nullptr || tp_->rank() != 0 || followers_stopped_) return;
  followers_stopped_ = true;  // first: a stop that fails is not tried again
  tp_->lead({kTpStop}, at::Tensor());
}

void ModelRunner::follow(const std::function<void(int64_t bucket_bytes)>& plan_lanes) {
  if (tp_ == nullptr || tp_->rank() == 0) {
    throw std::logic_error("ModelRunner::follow: not a tensor-parallel follower");
  }
  const at::Device device = kv_cache_.device();
  std::vector<int64_t> h;
  at::Tensor payload;
  // Every command's work below: when it fails here, the group is aborted first, so the leader and
  // the other ranks fail at once (on the CPU; over NCCL at the collective's deadline) instead of
  // waiting for this rank.
  auto run = [&] {
    switch (h[0]) {
      case kTpRelease:
        followed_ = ForwardOutput{};  // no logits before the next step: its memory goes too
        release_kv_cache();
        break;
      case kTpRestore:
        restore_kv_cache();
        break;
      case kTpQuiesce:
        wait_for_group();
        break;
      case kTpPlanLanes:
        if (!plan_lanes) {
          throw std::runtime_error(
              "sync lanes need an in-process tensor-parallel group (this rank has no lane)");
        }
        plan_lanes(h.at(1));
        wait_for_group();
        break;
      case kTpPlanWeights:
        plan_tp_landing(h.at(1));
        break;
      case kTpLandWeights:
        CRL_CHECK(payload.defined(), "a weight bucket command without its bytes");
        land_and_wait(h.at(1), payload.to(device));
        break;
      case kTpStep: {
        CRL_CHECK(h.size() == kTpStepWords, "a step command has ", kTpStepWords, " words");
        const StepLayout layout(h[1], h[2], h[3], h[4], h[5]);
        CRL_CHECK(payload.defined() && payload.numel() == layout.bytes, "a step's inputs are ",
                  layout.bytes, " bytes");
        Filled f;
        f.max_q = h[6];
        f.max_ctx = h[7];
        const at::Tensor buf = payload.to(device);
        followed_ = ForwardOutput{};
        const at::Tensor hidden = run_packed(layout, f, buf, LoraBatch{});
        if (model_.splits_vocab()) {  // the leader's logits commands come next
          followed_.hidden = hidden;
          if (layout.samples > 0) {
            followed_.sample_hidden = hidden.index_select(
                0, StepLayout::view(buf, layout.sample, layout.samples, at::kLong));
          }
        }
        break;
      }
      case kTpLogits: {
        CRL_CHECK(h.size() == 3, "a logits command has 3 words");
        const at::Tensor& rows = h[1] == kTpSampleRows ? followed_.sample_hidden
                                                       : followed_.hidden.narrow(0, h[1], h[2]);
        CRL_CHECK(rows.defined() && rows.size(0) == h[2], "logits of ", h[2],
                  " rows the last step does not have");
        gather_logits(rows);
        break;
      }
      default:
        throw std::runtime_error("tensor-parallel group " + tp_->name() + ": unknown command " +
                                 std::to_string(h[0]) + " from the leader");
    }
  };
  for (;;) {
    tp_->next(&h, &payload);
    if (h.empty() || h[0] == kTpStop) return;  // empty: the leader gave up
    try {
      run();
    } catch (...) {
      tp_->abort();
      throw;
    }
  }
}

at::Tensor ModelRunner::run_packed(const StepLayout& layout, const Filled& f, const at::Tensor& buf,
                                   const LoraBatch& lora) {
  if (layout.pairs > 0) {
    // Validated on the host by copy_blocks when the cache lives there.
    kv::copy_blocks(kv_cache_,
                    StepLayout::view(buf, layout.pair, 2 * layout.pairs, at::kLong).view({-1, 2}));
  }
  if (layout.seqs == 0) return {};
  const double scale = 1.0 / std::sqrt(static_cast<double>(model_.config().head_dim));
  PagedKvAttention attention(kv_cache_, layout.metadata(buf, f.max_q, f.max_ctx), scale);
  return model_.forward_hidden(StepLayout::view(buf, layout.tok, layout.rows, at::kLong),
                               StepLayout::view(buf, layout.pos, layout.rows, at::kLong), attention,
                               /*max_position=*/f.max_ctx - 1, lora);
}

ForwardOutput ModelRunner::execute(const SchedulerOutput& batch) {
  if (kv_cache_released()) {
    throw std::logic_error("the KV pool is released (colocated hand-over): restore it first");
  }
  throw_if_group_broken();
  if (DecodeGraph* g = graph_for(batch)) return execute_graph(batch, *g);
  ForwardOutput out;
  const int64_t num_seqs = static_cast<int64_t>(batch.seqs.size());
  const int64_t total = batch.num_tokens;
  int64_t num_samples = 0;
  int64_t max_blocks = 1;
  for (const auto& s : batch.seqs) {
    num_samples += s.sample ? 1 : 0;
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(s.seq->block_table.size()));
  }
  const StepLayout layout(total, num_seqs, num_samples,
                          static_cast<int64_t>(batch.block_copies.size()), max_blocks);
  const at::Device device = kv_cache_.device();
  at::Tensor host = step_host_buffer(layout, device);
  const Filled f = fill_step(batch, block_size_, layout, host);
  out.row_start.reserve(num_seqs);
  for (int64_t i = 0; i < num_seqs; ++i) {
    out.row_start.push_back(
        reinterpret_cast<const int32_t*>(host.data_ptr<uint8_t>() + layout.qs)[i]);
  }
  // One upload (none on the CPU, where `buf` is the host buffer itself).
  const at::Tensor buf = host.to(at::TensorOptions().device(device), /*non_blocking=*/true);
  out.h2d_bytes = device.is_cpu() ? 0 : host.numel();
  if (tp_ != nullptr && (layout.pairs > 0 || num_seqs > 0)) {
    tell_followers({kTpStep, layout.rows, layout.seqs, layout.samples, layout.pairs,
                    layout.max_blocks, f.max_q, f.max_ctx},
                   host);
  }

  LoraBatch lora;
  std::vector<int32_t> row_slots;
  if (num_seqs > 0 && lora_ != nullptr && lora_rows(batch, &row_slots)) {
    const bool uniform = std::all_of(row_slots.begin(), row_slots.end(),
                                     [&](int32_t s) { return s == row_slots[0]; });
    if (uniform && !model_.options().deterministic) {
      lora.slot = row_slots[0];  // one adapter: its own product (in deterministic mode the masked
                                 // one, so a row's bits do not depend on its batch neighbours)
    } else {
      lora.mask = lora_->row_mask(row_slots);
      out.h2d_bytes += device.is_cpu() ? 0 : lora.mask.numel() * lora.mask.element_size();
      // The runs the CPU kernel takes outside deterministic mode (LlmEngine::step orders the batch
      // by slot, so there is one per slot).
      if (device.is_cpu() && !model_.options().deterministic) lora.runs = lora_row_runs(row_slots);
    }
  }
  try {
    out.hidden = run_packed(layout, f, buf, lora);
  } catch (const std::exception& e) {
    // The followers may be inside this step's collectives: the group cannot take another step.
    if (tp_ != nullptr) {
      tp_broken_ = e.what();
      tp_->abort();
    }
    throw;
  }
  if (num_samples > 0) {
    out.sample_hidden =
        out.hidden.index_select(0, StepLayout::view(buf, layout.sample, num_samples, at::kLong));
  }
  return out;
}

}  // namespace crl::engine
