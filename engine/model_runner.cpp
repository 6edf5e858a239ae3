#include "engine/model_runner.h"

#include <cmath>

#include "common/check.h"
#include "common/host_memory.h"
#include "kv/paged_attention.h"

namespace crl::engine {

namespace {

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
  const auto& c = model.config();
  kv_cache_ = zeros_in_huge_pages(
      {2, c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim},
      at::TensorOptions().dtype(model.options().dtype).device(model.options().device), "the KV cache pool");
}

ForwardOutput ModelRunner::execute(const SchedulerOutput& batch) {
  ForwardOutput out;
  if (!batch.block_copies.empty()) {
    std::vector<int64_t> pairs;
    for (auto [src, dst] : batch.block_copies) {
      pairs.push_back(src);
      pairs.push_back(dst);
    }
    auto t = at::tensor(pairs, at::kLong).view({-1, 2}).to(kv_cache_.device());
    kv::copy_blocks(kv_cache_, t);
  }
  if (batch.seqs.empty()) return out;

  const int64_t num_seqs = static_cast<int64_t>(batch.seqs.size());
  const int64_t total = batch.num_tokens;
  size_t max_blocks = 1;
  for (const auto& s : batch.seqs) max_blocks = std::max(max_blocks, s.seq->block_table.size());

  auto tokens = at::empty({total}, at::kLong);
  auto positions = at::empty({total}, at::kLong);
  auto slots = at::empty({total}, at::kLong);
  auto query_start = at::empty({num_seqs + 1}, at::kInt);
  auto context_lens = at::empty({num_seqs}, at::kInt);
  auto block_tables = at::zeros({num_seqs, static_cast<int64_t>(max_blocks)}, at::kInt);
  auto* tok = tokens.data_ptr<int64_t>();
  auto* pos = positions.data_ptr<int64_t>();
  auto* slot = slots.data_ptr<int64_t>();
  auto* qs = query_start.data_ptr<int32_t>();
  auto* cl = context_lens.data_ptr<int32_t>();
  auto* bt = block_tables.data_ptr<int32_t>();

  int64_t row = 0;
  int64_t max_q = 0, max_ctx = 0;
  out.row_start.reserve(num_seqs);
  for (int64_t i = 0; i < num_seqs; ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    const Sequence& seq = *s.seq;
    CRL_CHECK(static_cast<int64_t>(seq.block_table.size()) * block_size_ >= s.start + s.num_tokens,
              "seq ", seq.seq_id, " lacks blocks");
    qs[i] = static_cast<int32_t>(row);
    out.row_start.push_back(row);
    for (int64_t p = s.start; p < s.start + s.num_tokens; ++p, ++row) {
      tok[row] = seq.tokens[p];
      pos[row] = p;
      slot[row] = static_cast<int64_t>(seq.block_table[p / block_size_]) * block_size_ +
                  p % block_size_;
    }
    cl[i] = static_cast<int32_t>(s.start + s.num_tokens);
    std::copy(seq.block_table.begin(), seq.block_table.end(), bt + i * max_blocks);
    max_q = std::max(max_q, s.num_tokens);
    max_ctx = std::max<int64_t>(max_ctx, cl[i]);
  }
  qs[num_seqs] = static_cast<int32_t>(row);

  const auto device = kv_cache_.device();
  kv::PagedAttentionMetadata meta;
  meta.slot_mapping = slots.to(device);
  meta.query_start = query_start.to(device);
  meta.context_lens = context_lens.to(device);
  meta.block_tables = block_tables.to(device);
  meta.max_query_len = max_q;
  meta.max_context_len = max_ctx;
  const double scale = 1.0 / std::sqrt(static_cast<double>(model_.config().head_dim));
  PagedKvAttention attention(kv_cache_, std::move(meta), scale);
  out.hidden = model_.forward_hidden(tokens.to(device), positions.to(device), attention);
  return out;
}

}  // namespace crl::engine
