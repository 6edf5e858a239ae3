#include "engine/weight_buffers.h"

#include <stdexcept>
#include <string>

#include "common/check.h"
#include "engine/model/transformer.h"

namespace crl::engine {

std::vector<sync::TensorSpec> weight_specs(const Transformer& model) {
  std::vector<sync::TensorSpec> specs;
  for (const auto& [name, t] : model.named_parameters()) {
    specs.push_back(
        {name, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.scalar_type()});
  }
  return specs;
}

std::vector<sync::TensorSpec> weight_specs(const Transformer& model, at::ScalarType dtype) {
  auto specs = weight_specs(model);
  for (auto& s : specs) s.dtype = dtype;
  return specs;
}

WeightBuffers::WeightBuffers(Transformer& model, int64_t bucket_bytes)
    : layout_(sync::WeightLayout::plan(weight_specs(model), bucket_bytes)) {
  const at::Device device = model.options().device;
  buckets_ = layout_.allocate_buckets(at::TensorOptions().device(device));
  std::vector<at::Tensor> current;
  for (const auto& [name, t] : model.named_parameters()) current.push_back(t);
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    layout_.pack(current, static_cast<int64_t>(b), buckets_[b]);
  }
  std::vector<at::Tensor> views = layout_.views(buckets_);
  NamedTensors rebound;
  rebound.reserve(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    rebound.emplace_back(layout_.specs()[i].name, views[i]);
  }
  model.set_parameters(rebound);
}

TpWeightLanding::TpWeightLanding(const Transformer& shard, const ModelConfig& full, TpShard where,
                                 int64_t bucket_bytes)
    : layout_([&] {
        const at::ScalarType dtype = shard.options().dtype;
        std::vector<sync::TensorSpec> specs;
        for (const ParamSpec& p : model_param_specs(full))
          specs.push_back({p.name, p.shape, dtype});
        return sync::WeightLayout::plan(std::move(specs), bucket_bytes);
      }()),
      where_(where) {
  const NamedTensors& mine = shard.named_parameters();
  if (mine.size() != layout_.specs().size()) {
    CRL_INVALID("tensor-parallel weight updates: the shard has ", mine.size(),
                " parameters, the whole model ", layout_.specs().size());
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    const sync::TensorSpec& spec = layout_.specs()[i];
    std::vector<int64_t> want = spec.shape;
    if (const int dim = tp_split_dim(spec.name, full, where.size); dim >= 0)
      want[dim] /= where.size;
    if (mine[i].first != spec.name || mine[i].second.sizes() != at::IntArrayRef(want)) {
      CRL_INVALID("tensor-parallel weight updates: shard parameter ", i, " is '", mine[i].first,
                  "' ", mine[i].second.sizes(), ", expected '", spec.name, "' ",
                  at::IntArrayRef(want), " (rank ", where.rank, " of ", where.size, ")");
    }
    params_.push_back(mine[i].second);
  }
}

void TpWeightLanding::land(int64_t bucket, const at::Tensor& bytes) const {
  const sync::Bucket& b = layout_.buckets().at(bucket);
  CRL_CHECK(bytes.is_contiguous() && bytes.scalar_type() == at::kByte && bytes.numel() >= b.nbytes,
            "tensor-parallel weight updates: bucket ", bucket, " needs ", b.nbytes,
            " contiguous bytes");
  for (const auto& e : b.entries) {
    const sync::TensorSpec& spec = layout_.specs()[e.tensor];
    const at::Tensor whole = bytes.narrow(0, e.offset, e.nbytes).view(spec.dtype).view(spec.shape);
    params_[e.tensor].copy_(tp_slice_view(spec.name, whole, where_));
  }
}

std::vector<sync::TensorSpec> tensor_specs(const NamedTensors& tensors, at::ScalarType dtype) {
  std::vector<sync::TensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    specs.push_back({name, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), dtype});
  }
  return specs;
}

LoraBuffers::LoraBuffers(const LoraAdapter& initial, at::ScalarType dtype, at::Device device,
                         int64_t bucket_bytes)
    : layout_(sync::WeightLayout::plan(tensor_specs(lora_tensors(initial), dtype), bucket_bytes)) {
  buckets_ = layout_.allocate_buckets(at::TensorOptions().device(device));
  std::vector<at::Tensor> current;
  for (const auto& [name, t] : lora_tensors(initial)) current.push_back(t.to(device, dtype));
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    layout_.pack(current, static_cast<int64_t>(b), buckets_[b]);
  }
  std::vector<at::Tensor> views = layout_.views(buckets_);
  NamedTensors named;
  for (size_t i = 0; i < views.size(); ++i) named.emplace_back(layout_.specs()[i].name, views[i]);
  adapter_ = lora_with_tensors(initial, named);
}

void TpLaneBoard::put(int rank, const std::vector<at::Tensor>& buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  buckets_.at(static_cast<size_t>(rank)) = buckets;
}

std::vector<std::vector<at::Tensor>> TpLaneBoard::all() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t r = 0; r < buckets_.size(); ++r) {
    if (buckets_[r].empty()) {
      throw std::logic_error("tensor-parallel rank " + std::to_string(r) +
                             " has no weight buckets on its sync lane");
    }
  }
  return buckets_;
}

}  // namespace crl::engine
