#include "engine/step_inputs.h"

#include <algorithm>

#include "common/check.h"

namespace crl::engine {

at::Tensor step_host_buffer(const StepLayout& layout, const at::Device& device) {
  return at::empty({layout.bytes},
                   at::TensorOptions().dtype(at::kByte).pinned_memory(!device.is_cpu()));
}

Filled fill_step(const SchedulerOutput& batch, int32_t block_size, const StepLayout& layout,
                 at::Tensor& buf) {
  uint8_t* base = buf.data_ptr<uint8_t>();
  auto* tok = reinterpret_cast<int64_t*>(base + layout.tok);
  auto* pos = reinterpret_cast<int64_t*>(base + layout.pos);
  auto* slot = reinterpret_cast<int64_t*>(base + layout.slot);
  auto* sample = reinterpret_cast<int64_t*>(base + layout.sample);
  auto* pairs = reinterpret_cast<int64_t*>(base + layout.pair);
  auto* qs = reinterpret_cast<int32_t*>(base + layout.qs);
  auto* cl = reinterpret_cast<int32_t*>(base + layout.cl);
  auto* bt = reinterpret_cast<int32_t*>(base + layout.bt);
  for (int64_t i = 0; i < layout.pairs; ++i) {
    pairs[2 * i] = batch.block_copies[i].first;
    pairs[2 * i + 1] = batch.block_copies[i].second;
  }
  Filled f;
  int64_t row = 0, samples = 0;
  const int64_t mb = layout.max_blocks;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    const Sequence& seq = *s.seq;
    CRL_CHECK(static_cast<int64_t>(seq.block_table.size()) * block_size >= s.start + s.num_tokens,
              "seq ", seq.seq_id, " lacks blocks");
    qs[i] = static_cast<int32_t>(row);
    for (int64_t p = s.start; p < s.start + s.num_tokens; ++p, ++row) {
      tok[row] = seq.tokens[p];
      pos[row] = p;
      slot[row] =
          static_cast<int64_t>(seq.block_table[p / block_size]) * block_size + p % block_size;
    }
    if (s.sample && samples < layout.samples) sample[samples++] = row - 1;
    cl[i] = static_cast<int32_t>(s.start + s.num_tokens);
    std::fill(std::copy(seq.block_table.begin(), seq.block_table.end(), bt + i * mb),
              bt + (i + 1) * mb, 0);
    f.max_q = std::max(f.max_q, s.num_tokens);
    f.max_ctx = std::max<int64_t>(f.max_ctx, cl[i]);
  }
  for (int64_t i = static_cast<int64_t>(batch.seqs.size()); i < layout.seqs; ++i, ++row) {
    qs[i] = static_cast<int32_t>(row);
    tok[row] = 0;
    pos[row] = 0;
    slot[row] = -1;
    cl[i] = 1;
    std::fill(bt + i * mb, bt + (i + 1) * mb, 0);
  }
  qs[layout.seqs] = static_cast<int32_t>(row);
  return f;
}

}  // namespace crl::engine
