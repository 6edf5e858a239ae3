#include "trainer/train_state.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace crl::trainer {
namespace {

constexpr int64_t kSliceAlign = 64;  // elements: 256 bytes of fp32

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// The part of a tensor at elements [off, off + n) of its bucket that falls in the slice
// [lo, lo + slice): `at` within the slice, `from` within the tensor, `count` elements (0: none).
struct Overlap {
  int64_t at = 0, from = 0, count = 0;
};
Overlap overlap(int64_t off, int64_t n, int64_t lo, int64_t slice) {
  const int64_t s = std::max(off, lo), t = std::min(off + n, lo + slice);
  if (s >= t) return {};
  return {s - lo, s - off, t - s};
}

// Stage 3: a full buffer's memory moves out (its storage left with zero bytes) and back in. Its
// views keep their shapes and offsets (autograd's saved weights among them) and see the memory
// given back.
at::DataPtr take_storage(const at::Tensor& full) {
  c10::StorageImpl* impl = full.storage().unsafeGetStorageImpl();
  at::DataPtr mem = impl->set_data_ptr(at::DataPtr(nullptr, full.device()));
  impl->set_nbytes(0);
  return mem;
}
void give_storage(const at::Tensor& full, at::DataPtr mem, int64_t nbytes) {
  c10::StorageImpl* impl = full.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(std::move(mem));
  impl->set_nbytes(static_cast<size_t>(nbytes));
}
at::DataPtr allocate_on(at::Device dev, int64_t nbytes) {
  const c10::DeviceGuard on_device(dev);  // the allocator allocates on the current device
  return c10::GetAllocator(dev.type())->allocate(static_cast<size_t>(nbytes));
}

// Freed full buffers kept for the next gathers (no allocation, no page faults, per layer).
constexpr size_t kSpareBuffers = 2;

// A tensor over `t`'s memory with a version counter of its own: writing the gathered parameters
// through it between a forward and its backward is not an in-place change autograd's saved views
// of `t` would refuse.
at::Tensor unversioned_alias(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options());
}

}  // namespace

struct TrainState::Pending {
  int64_t bucket;
  int slot;  // stage 2: the pool buffer reduced into this bucket's slice at wait; else -1
  std::unique_ptr<sync::Work> work;
};

TrainState::TrainState(const engine::NamedTensors& weights, TrainStateOptions options,
                       sync::Communicator* group)
    : TrainState(
          [&] {
            std::vector<engine::ParamSpec> specs;
            for (const auto& [name, w] : weights) {
              specs.push_back({name, std::vector<int64_t>(w.sizes().begin(), w.sizes().end())});
            }
            return specs;
          }(),
          [&weights](size_t i, int64_t from, int64_t count) {
            return weights[i].second.reshape({-1}).narrow(0, from, count);
          },
          options, group) {}

TrainState::TrainState(const std::vector<engine::ParamSpec>& specs, const ReadFn& read,
                       TrainStateOptions options, sync::Communicator* group)
    : o_(options), group_(group), layout_([&] {
        std::vector<sync::TensorSpec> layout_specs;
        for (const auto& spec : specs) {
          layout_specs.push_back({spec.name, spec.shape, options.compute_dtype});
        }
        return sync::WeightLayout::plan(std::move(layout_specs), options.bucket_bytes);
      }()) {
  at::NoGradGuard no_grad;
  CRL_CHECK(o_.zero_stage >= 0 && o_.zero_stage <= 3, "zero stage ", o_.zero_stage,
            " is not 0, 1, 2 or 3");
  const int world = group_ ? group_->size() : 1;
  shards_ = o_.zero_stage == 0 ? 1 : world;
  // Stage 3 on one rank has nothing to shard: its buffers stay whole, as stage 2's.
  sharded_ = o_.zero_stage == 3 && shards_ > 1;
  shard_rank_ = o_.zero_stage == 0 || !group_ ? 0 : group_->rank();
  state_device_ = o_.offload_optimizer ? at::Device(at::kCPU) : o_.device;
  const auto dev = at::TensorOptions().device(o_.device);
  const auto f32 = dev.dtype(at::kFloat);
  auto state_opts = at::TensorOptions().device(state_device_).dtype(at::kFloat);
  if (o_.offload_optimizer && o_.device.is_cuda()) state_opts = state_opts.pinned_memory(true);
  const int64_t esize = c10::elementSize(o_.compute_dtype);
  master_aliased_ = o_.compute_dtype == at::kFloat && !o_.offload_optimizer;

  const auto& buckets = layout_.buckets();
  const int64_t nb = static_cast<int64_t>(buckets.size());
  where_.assign(specs.size(), {0, 0});
  std::vector<at::Tensor> views(specs.size());
  // Each tensor's part in this rank's slice of its bucket, read once in fp32 (the exact masters
  // come from it, not from the compute-dtype copy): at stage 3 nothing else of the model is read.
  std::vector<at::Tensor> masters;
  for (const auto& b : buckets) {
    const int64_t elems = b.nbytes / esize;
    const int64_t slice = round_up((elems + shards_ - 1) / shards_, kSliceAlign);
    slice_.push_back(slice);
    expected_.push_back(static_cast<int64_t>(b.entries.size()));
    at::Tensor full = sharded_ ? at::empty({slice * shards_}, dev.dtype(o_.compute_dtype))
                               : at::zeros({slice * shards_}, dev.dtype(o_.compute_dtype));
    param_full_.push_back(full);
    bucket_bytes_views_.push_back(full.view(at::kByte).narrow(0, 0, b.nbytes));
    at::Tensor shard = sharded_ ? at::zeros({slice}, dev.dtype(o_.compute_dtype)) : at::Tensor();
    at::Tensor master = master_aliased_ ? at::Tensor() : at::zeros({slice}, state_opts);
    std::vector<std::pair<int64_t, int64_t>> decay;
    for (const auto& e : b.entries) {
      const auto& shape = specs[e.tensor].shape;
      const int64_t off = e.offset / esize, numel = e.nbytes / esize;
      where_[e.tensor] = {b.index, off};
      views[e.tensor] = full.narrow(0, off, numel).view(shape);
      const Overlap o = overlap(off, numel, shard_rank_ * slice, slice);
      if (shape.size() >= 2 && o.count > 0) decay.emplace_back(o.at, o.count);
      if (!sharded_) views[e.tensor].copy_(read(e.tensor, 0, numel).view(shape));
      if (o.count == 0 || (!sharded_ && master_aliased_)) continue;
      const at::Tensor part = read(e.tensor, o.from, o.count);
      if (sharded_) shard.narrow(0, o.at, o.count).copy_(part);
      if (!master_aliased_) master.narrow(0, o.at, o.count).copy_(part);
    }
    decay_.push_back(std::move(decay));
    if (sharded_) {
      param_shard_.push_back(shard);
      take_storage(full);  // a bucket's full buffer exists only while gathered
    }
    masters.push_back(master);
  }
  for (size_t i = 0; i < specs.size(); ++i) params_.emplace_back(specs[i].name, views[i]);
  for (int64_t b = 0; b < nb; ++b) {
    master_.push_back(master_aliased_ ? own_params(b) : masters[b]);
    exp_avg_.push_back(at::zeros({slice_[b]}, state_opts));
    exp_avg_sq_.push_back(at::zeros({slice_[b]}, state_opts));
    if (o_.zero_stage >= 2) {
      grad_slice_.push_back(at::zeros({slice_[b]}, f32));
    } else {
      grad_full_.push_back(at::zeros({slice_[b] * shards_}, f32));
    }
  }
  scratch_ = at::empty({nb > 0 ? *std::max_element(slice_.begin(), slice_.end()) : 0}, state_opts);
  slot_of_.assign(nb, -1);
  arrived_.assign(nb, 0);
  holds_.assign(nb, 0);
  idle_.assign(nb, false);
  cap_.assign(nb, 0);
  gathering_.resize(nb);
  gathering_into_.assign(nb, at::Tensor());
  set_parameter_groups(std::vector<int>(specs.size(), 0));
}

TrainState::~TrainState() {
  // Outstanding reductions must not outlive their buffers; a failed group is abandoned.
  if (!sync::Communicator::process_failed()) {
    try {
      wait_pending();
    } catch (...) {
    }
    for (size_t b = 0; b < gathering_.size(); ++b) {
      try {
        settle(static_cast<int64_t>(b));
      } catch (...) {
      }
    }
  }
  // Gathers never completed (a failed group): their Work and target memory are leaked, not freed
  // under a transfer that may still write into them.
  for (size_t b = 0; b < gathering_.size(); ++b) {
    if (!gathering_[b]) continue;
    (void)gathering_[b].release();
    (void)take_storage(param_full_[b]).release_context();
  }
}

at::Tensor TrainState::slice_of(const at::Tensor& full, int64_t b) const {
  return full.narrow(0, shard_rank_ * slice_[b], slice_[b]);
}

at::Tensor TrainState::own_params(int64_t b) const {
  return sharded_ ? param_shard_[b] : slice_of(param_full_[b], b);
}

void TrainState::set_parameter_groups(const std::vector<int>& group_of_param) {
  CRL_CHECK(group_of_param.size() == params_.size(),
            "set_parameter_groups: ", group_of_param.size(), " groups for ", params_.size(),
            " parameters");
  int groups = 0;
  for (int g : group_of_param) {
    CRL_CHECK(g >= 0, "set_parameter_groups: negative group ", g);
    groups = std::max(groups, g + 1);
  }
  group_of_param_ = group_of_param;
  group_buckets_.assign(groups, {});
  group_params_.assign(groups, 0);
  for (size_t i = 0; i < group_of_param.size(); ++i) {
    const int g = group_of_param[i];
    auto& bs = group_buckets_[g];
    const int64_t b = where_[i].first;
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) bs.push_back(b);
    ++group_params_[g];
  }
  for (auto& bs : group_buckets_) std::sort(bs.begin(), bs.end());
  group_arrived_.assign(groups, 0);
  backward_hold_.assign(groups, false);
}

at::Tensor TrainState::gather_target(int64_t b) {
  const at::Tensor& full = param_full_[b];
  const int64_t nbytes = full.numel() * static_cast<int64_t>(full.element_size());
  auto best = spare_.end();  // the smallest spare buffer that fits
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if (it->second >= nbytes && (best == spare_.end() || it->second < best->second)) best = it;
  }
  if (best != spare_.end()) {
    cap_[b] = best->second;
    spare_bytes_ -= best->second;
    give_storage(full, std::move(best->first), nbytes);
    spare_.erase(best);
  } else {
    cap_[b] = nbytes;
    give_storage(full, allocate_on(full.device(), nbytes), nbytes);
  }
  gathered_bytes_ += cap_[b];
  gathered_peak_ = std::max(gathered_peak_, gathered_bytes_ + spare_bytes_);
  if (updating_) update_peak_ = std::max(update_peak_, gathered_bytes_ + spare_bytes_);
  return unversioned_alias(full);
}

bool TrainState::settle(int64_t b) {
  if (!gathering_[b]) return false;
  gathering_[b]->wait();  // on a failure the bucket stays in flight (abandoned with the group)
  gathering_[b].reset();
  gathering_into_[b] = at::Tensor();
  idle_[b] = true;
  return true;
}

void TrainState::prefetch(int g) {
  if (!sharded_ || !prefetch_on_ || g < 0 || g >= static_cast<int>(group_buckets_.size())) return;
  at::NoGradGuard no_grad;
  for (int64_t b : group_buckets_[g]) {
    if (holds_[b] > 0 || idle_[b] || gathering_[b]) continue;  // resident or on its way
    gathering_into_[b] = gather_target(b);
    gathering_[b] = group_->all_gather_async(param_shard_[b], gathering_into_[b]);
    ++prefetched_;
  }
}

void TrainState::hold(int64_t b) {
  if (settle(b)) ++prefetch_used_;
  if (holds_[b]++ > 0) return;
  if (idle_[b]) {  // still gathered since its last release: parameters change only at step()
    idle_[b] = false;
    return;
  }
  at::NoGradGuard no_grad;
  group_->all_gather(param_shard_[b], gather_target(b));
}

void TrainState::unhold(int64_t b) {
  CRL_CHECK(holds_[b] > 0, "train state: bucket ", b, " released more often than acquired");
  if (--holds_[b] > 0) return;
  idle_[b] = true;  // freed by the next acquire that does not need it (a layer's neighbour may)
}

void TrainState::evict(int64_t b) {
  idle_[b] = false;
  at::DataPtr mem = take_storage(param_full_[b]);
  gathered_bytes_ -= cap_[b];
  if (spare_.size() < kSpareBuffers) {
    spare_.emplace_back(std::move(mem), cap_[b]);
    spare_bytes_ += cap_[b];
  }
}

void TrainState::evict_idle(const std::vector<int64_t>& except) {
  for (int64_t b = 0; b < static_cast<int64_t>(idle_.size()); ++b) {
    if (gathering_[b] && std::find(except.begin(), except.end(), b) == except.end()) settle(b);
    if (idle_[b] && std::find(except.begin(), except.end(), b) == except.end()) evict(b);
  }
}

void TrainState::acquire(int g) {
  if (!sharded_) return;
  evict_idle(group_buckets_.at(g));  // before gathering: the peak is one group and its neighbour's
  for (int64_t b : group_buckets_.at(g)) hold(b);
}

void TrainState::release(int g) {
  if (!sharded_) return;
  for (int64_t b : group_buckets_.at(g)) unhold(b);
}

void TrainState::acquire_for_backward(int g) {
  if (!sharded_) return;
  CRL_CHECK(!backward_hold_.at(g), "train state: group ", g, " acquired twice for one backward");
  acquire(g);
  backward_hold_[g] = true;
}

void TrainState::acquire_buckets(const std::function<bool(int64_t)>& keep) {
  if (!sharded_) return;
  CRL_CHECK(!updating_, "acquire_buckets: the previous buckets were not released");
  acquire_parameters(0, static_cast<int64_t>(where_.size()), keep);
}

void TrainState::acquire_parameters(int64_t first, int64_t end,
                                    const std::function<bool(int64_t)>& keep) {
  if (!sharded_) return;
  const auto params = static_cast<int64_t>(where_.size());
  CRL_CHECK(0 <= first && first <= end && end <= params, "acquire_parameters: [", first, ", ", end,
            ") is not a range of the ", params, " parameters");
  if (!updating_) {
    evict_idle({});
    updating_ = true;
    update_next_ = 0;
    update_peak_ = gathered_bytes_ + spare_bytes_;
  }
  std::vector<int64_t> still;
  for (int64_t b : kept_) {
    if (layout_.buckets()[b].entries.back().tensor < first) {
      unhold(b);
      evict(b);
    } else {
      still.push_back(b);
    }
  }
  kept_ = std::move(still);
  if (first == end) return;
  const int64_t last = where_[end - 1].first;
  // Buckets before update_next_ are gathered once an update: those it needs again must be kept.
  for (int64_t b = where_[first].first; b < std::min(update_next_, last + 1); ++b) {
    CRL_CHECK(std::find(kept_.begin(), kept_.end(), b) != kept_.end(),
              "acquire_parameters: parameters [", first, ", ", end, ") need bucket ", b,
              ", which this update already dropped");
  }
  for (int64_t b = std::max(update_next_, where_[first].first); b <= last; ++b) {
    hold(b);
    if (keep(b)) {
      kept_.push_back(b);
    } else {
      unhold(b);
      evict(b);
    }
  }
  update_next_ = std::max(update_next_, last + 1);
}

void TrainState::release_kept() {
  for (int64_t b : kept_) unhold(b);
  kept_.clear();
  updating_ = false;
  update_next_ = 0;
  evict_idle({});  // none stays gathered outside a micro-batch (the engine beside may need it)
  spare_.clear();
  spare_bytes_ = 0;
}

StateBytes TrainState::bytes() const {
  StateBytes s;
  auto nbytes = [](const at::Tensor& t) {
    return t.numel() * static_cast<int64_t>(t.element_size());
  };
  if (sharded_) {
    for (const auto& t : param_shard_) s.parameters += nbytes(t);
    s.parameters += gathered_peak_;
  } else {
    for (const auto& t : param_full_) s.parameters += nbytes(t);
  }
  for (const auto& t : grad_full_) s.gradients += nbytes(t);
  for (const auto& t : grad_slice_) s.gradients += nbytes(t);
  for (const auto& t : pool_) s.gradients += nbytes(t);
  for (size_t b = 0; b < master_.size(); ++b) {
    if (!master_aliased_) s.optimizer += nbytes(master_[b]);
    s.optimizer += nbytes(exp_avg_[b]) + nbytes(exp_avg_sq_[b]);
  }
  if (scratch_.defined()) s.optimizer += nbytes(scratch_);
  return s;
}

void TrainState::zero_grad() {
  wait_pending();
  reduced_ = false;
  for (auto& g : grad_full_) g.zero_();
  for (auto& g : grad_slice_) g.zero_();
}

void TrainState::begin_micro_batch(bool launch) {
  launching_ = launch || o_.zero_stage >= 2;
  std::fill(arrived_.begin(), arrived_.end(), 0);
  std::fill(group_arrived_.begin(), group_arrived_.end(), 0);
  next_launch_ = static_cast<int64_t>(arrived_.size()) - 1;
}

at::Tensor TrainState::grad_target(int64_t b) {
  if (o_.zero_stage < 2) return grad_full_[b];
  if (slot_of_[b] < 0) {
    // A free pool buffer, else the oldest in-flight one once its reduction is done, else a new one
    // (only when every buffer belongs to a bucket backward has not completed).
    while (pool_free_.empty() && !pending_.empty()) {
      auto p = std::move(pending_.front());
      pending_.erase(pending_.begin());
      finish(*p);
    }
    if (pool_free_.empty()) {
      int64_t biggest = *std::max_element(slice_.begin(), slice_.end()) * shards_;
      pool_.push_back(
          at::empty({biggest}, at::TensorOptions().device(o_.device).dtype(at::kFloat)));
      pool_free_.push_back(static_cast<int>(pool_.size()) - 1);
    }
    slot_of_[b] = pool_free_.back();
    pool_free_.pop_back();
    pool_[slot_of_[b]].narrow(0, 0, slice_[b] * shards_).zero_();
  }
  return pool_[slot_of_[b]].narrow(0, 0, slice_[b] * shards_);
}

void TrainState::add_grad(int64_t i, const at::Tensor& grad) {
  at::NoGradGuard no_grad;
  const auto [b, off] = where_[i];
  const at::Tensor& p = params_[i].second;
  at::Tensor dst = grad_target(b).narrow(0, off, p.numel()).view(p.sizes());
  dst.add_(grad.to(at::kFloat));
  if (++arrived_[b] == expected_[b] && launching_) launch_ready();
  // Stage 3: backward is done with the group's gathered parameters once its last gradient is in
  // (a parameter's sink runs after every node that read the parameter).
  const int g = group_of_param_[i];
  if (++group_arrived_[g] == group_params_[g] && backward_hold_[g]) {
    backward_hold_[g] = false;
    release(g);
  }
}

void TrainState::launch_ready() {
  while (next_launch_ >= 0 && arrived_[next_launch_] >= expected_[next_launch_]) {
    launch(next_launch_--);
  }
}

void TrainState::release_backward_holds() {
  for (size_t g = 0; g < backward_hold_.size(); ++g) {
    if (backward_hold_[g]) {
      backward_hold_[g] = false;
      release(static_cast<int>(g));
    }
  }
}

void TrainState::end_micro_batch() {
  // A group some of whose parameters had no gradient keeps its backward hold until here.
  release_backward_holds();
  if (!launching_) return;
  while (next_launch_ >= 0) launch(next_launch_--);
  launching_ = false;
  reduced_ = o_.zero_stage < 2;
}

void TrainState::launch(int64_t b) {
  if (!group_ || group_->size() == 1) {
    if (o_.zero_stage >= 2) {  // one rank: the pool buffer is the slice's contribution
      grad_slice_[b].add_(grad_target(b));
      pool_free_.push_back(slot_of_[b]);
      slot_of_[b] = -1;
    }
    return;
  }
  auto p = std::make_unique<Pending>();
  p->bucket = b;
  p->slot = -1;
  if (o_.zero_stage == 0) {
    p->work = group_->all_reduce_async(grad_full_[b], sync::ReduceOp::kSum);
  } else if (o_.zero_stage == 1) {
    p->work = group_->reduce_scatter_async(grad_full_[b], slice_of(grad_full_[b], b));
  } else {
    at::Tensor full = grad_target(b);
    p->slot = slot_of_[b];
    slot_of_[b] = -1;
    p->work = group_->reduce_scatter_async(full, slice_of(full, b));
  }
  pending_.push_back(std::move(p));
}

void TrainState::finish(Pending& p) {
  p.work->wait();
  if (p.slot >= 0) {  // stage 2: add the reduced chunk to the slice, free the pool buffer
    grad_slice_[p.bucket].add_(slice_of(pool_[p.slot], p.bucket));
    pool_free_.push_back(p.slot);
  }
}

void TrainState::wait_pending() {
  for (auto& p : pending_) finish(*p);
  pending_.clear();
}

void TrainState::launch_remaining() {
  if (o_.zero_stage < 2 && !reduced_) {
    // No micro-batch of this step said it was the last: reduce every bucket now.
    for (int64_t b = static_cast<int64_t>(master_.size()) - 1; b >= 0; --b) launch(b);
    reduced_ = true;
  }
}

double TrainState::step(double scale, double max_norm, const AdamWSettings& a) {
  at::NoGradGuard no_grad;
  if (sharded_) {
    // A gathered bucket would keep the old values: the holds must all be released, and the idle
    // gathered buckets and spare buffers are given back before AdamW's temporaries.
    for (size_t b = 0; b < holds_.size(); ++b) {
      CRL_CHECK(holds_[b] == 0, "train state: bucket ", b, " is still gathered at the step");
    }
    evict_idle({});
    spare_.clear();
    spare_bytes_ = 0;
  }
  launch_remaining();
  reduced_ = false;
  launching_ = false;
  wait_pending();
  const int64_t nb = static_cast<int64_t>(master_.size());
  std::vector<at::Tensor> g(nb);
  for (int64_t b = 0; b < nb; ++b) {
    g[b] = o_.zero_stage >= 2 ? grad_slice_[b] : slice_of(grad_full_[b], b);
    if (scale != 1.0) g[b].mul_(scale);
  }
  // Per-bucket norms (accumulated in double by the reduction, without a double copy), squared
  // and summed in double: one small all-reduce for the global norm.
  double local_sq = 0;
  for (const auto& t : g) {
    const double n = t.norm().item<double>();
    local_sq += n * n;
  }
  at::Tensor sq = at::full({1}, local_sq, at::TensorOptions().dtype(at::kDouble).device(o_.device));
  if (shards_ > 1) group_->all_reduce(sq);
  const double norm = std::sqrt(sq.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double coef = max_norm / (norm + 1e-6);
    for (auto& t : g) t.mul_(coef);
  }
  // AdamW as torch.optim.AdamW computes it (decoupled decay, bias corrections folded into the
  // step size and the denominator), element by element on the flat slices.
  ++adam_step_;
  const double bc1 = 1 - std::pow(a.beta1, static_cast<double>(adam_step_));
  const double bc2 = 1 - std::pow(a.beta2, static_cast<double>(adam_step_));
  for (int64_t b = 0; b < nb; ++b) {
    at::Tensor grad = g[b].to(state_device_, /*non_blocking=*/false);
    at::Tensor& p = master_[b];
    if (a.weight_decay != 0) {
      for (const auto& [s, n] : decay_[b]) p.narrow(0, s, n).mul_(1 - a.lr * a.weight_decay);
    }
    exp_avg_[b].mul_(a.beta1).add_(grad, 1 - a.beta1);
    exp_avg_sq_[b].mul_(a.beta2).addcmul_(grad, grad, 1 - a.beta2);
    // One scratch buffer for every bucket's denominator (no bucket-sized temporaries per step).
    at::Tensor denom = scratch_.narrow(0, 0, slice_[b]);
    at::sqrt_out(denom, exp_avg_sq_[b]);
    denom.div_(std::sqrt(bc2)).add_(a.eps);
    p.addcdiv_(exp_avg_[b], denom, -a.lr / bc1);
    if (!master_aliased_) own_params(b).copy_(p);
  }
  if (shards_ > 1 && !sharded_) {
    std::vector<std::unique_ptr<sync::Work>> works;
    for (int64_t b = 0; b < nb; ++b) {
      works.push_back(group_->all_gather_async(slice_of(param_full_[b], b), param_full_[b]));
    }
    sync::wait_all(works);
  }
  return norm;
}

engine::NamedTensors TrainState::gather(int what, bool keep) {
  at::NoGradGuard no_grad;
  const auto& src = what == 0 ? master_ : what == 1 ? exp_avg_ : exp_avg_sq_;
  const int64_t esize = c10::elementSize(o_.compute_dtype);
  engine::NamedTensors out(params_.size());
  for (const auto& bk : layout_.buckets()) {
    const int64_t b = bk.index;
    at::Tensor full =
        at::empty({slice_[b] * shards_}, at::TensorOptions().device(o_.device).dtype(at::kFloat));
    at::Tensor own = slice_of(full, b);
    own.copy_(src[b]);
    if (shards_ > 1) group_->all_gather(own, full);
    if (!keep) continue;
    for (const auto& e : bk.entries) {
      const at::Tensor& p = params_[e.tensor].second;
      at::Tensor t = full.narrow(0, e.offset / esize, p.numel()).view(p.sizes());
      // Stage 3: on the host, one bucket on the device at a time (a whole fp32 copy on each
      // device is what it avoids).
      out[e.tensor] = {params_[e.tensor].first, sharded_ ? t.to(at::kCPU) : t.clone()};
    }
  }
  if (!keep) out.clear();
  return out;
}

void TrainState::scatter(int what, const engine::NamedTensors& full) {
  CRL_CHECK(full.size() == params_.size(), "scatter: ", full.size(), " tensors for ",
            params_.size(), " parameters");
  scatter(what, [&](int64_t param, int64_t from, int64_t count) {
    return full[param].second.reshape({-1}).narrow(0, from, count);
  });
}

void TrainState::scatter(int what, const RangeReader& read) {
  at::NoGradGuard no_grad;
  if (what == 0 && sharded_) evict_idle({});  // their values are about to change
  auto& dst = what == 0 ? master_ : what == 1 ? exp_avg_ : exp_avg_sq_;
  const int64_t esize = c10::elementSize(o_.compute_dtype);
  for (const auto& bk : layout_.buckets()) {
    const int64_t b = bk.index;
    for (const auto& e : bk.entries) {
      const Overlap o =
          overlap(e.offset / esize, e.nbytes / esize, shard_rank_ * slice_[b], slice_[b]);
      if (o.count == 0) continue;
      dst[b].narrow(0, o.at, o.count).copy_(read(e.tensor, o.from, o.count));
    }
    if (what == 0 && !master_aliased_) own_params(b).copy_(master_[b]);
  }
  if (what == 0 && shards_ > 1 && !sharded_) {
    for (size_t b = 0; b < param_full_.size(); ++b) {
      group_->all_gather(slice_of(param_full_[b], static_cast<int64_t>(b)), param_full_[b]);
    }
  }
}

}  // namespace crl::trainer
