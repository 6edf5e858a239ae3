#include "engine/weight_buffers.h"

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

}  // namespace crl::engine
