#include "trainer/micro_batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "common/check.h"

namespace crl::trainer {

SampleGroup sft_group(std::vector<int32_t> prompt_ids, const std::vector<int32_t>& answer_ids,
                      int32_t eos) {
  SampleGroup g;
  g.prompt_ids = std::move(prompt_ids);
  Sample s;
  s.completion_ids = answer_ids;
  s.completion_ids.push_back(eos);
  s.logprobs.assign(s.completion_ids.size(), 0.0f);
  g.samples.push_back(std::move(s));
  return g;
}

void compute_group_advantages(SampleGroup& g, double eps) {
  const size_t n = g.samples.size();
  if (n < 2) {
    for (auto& s : g.samples) s.advantage = 0;
    return;
  }
  const double first = g.samples[0].reward;
  bool equal = true;
  for (const auto& s : g.samples) {
    equal = equal && std::abs(s.reward - first) <= 1e-9 * std::max(1.0, std::abs(first));
  }
  if (equal) {
    for (auto& s : g.samples) s.advantage = 0;
    return;
  }
  double mean = 0;
  for (const auto& s : g.samples) mean += s.reward;
  mean /= static_cast<double>(n);
  double var = 0;
  for (const auto& s : g.samples) var += (s.reward - mean) * (s.reward - mean);
  const double std_dev = std::sqrt(var / static_cast<double>(n - 1));
  for (auto& s : g.samples) {
    s.advantage =
        std_dev > 0 ? (s.reward - mean) / (std_dev + eps) : 0.0;  // equal rewards: no signal
  }
}

void compute_group_advantages(std::vector<SampleGroup>& groups, double eps) {
  for (auto& g : groups) compute_group_advantages(g, eps);
}

int64_t MicroBatch::num_loss_tokens() const {
  return loss_mask.defined() ? static_cast<int64_t>(loss_mask.sum().item<double>()) : 0;
}

at::Tensor MicroBatch::cu_seqlens() const {
  std::vector<int64_t> cu(seq_lens.size() + 1, 0);
  for (size_t i = 0; i < seq_lens.size(); ++i) cu[i + 1] = cu[i] + seq_lens[i];
  return at::tensor(cu, at::kLong);
}

void MicroBatch::validate() const {
  const int64_t t = num_tokens();
  auto check = [&](const at::Tensor& x, const char* name, at::ScalarType dtype) {
    if (!x.defined() || x.dim() != 1 || x.size(0) != t || x.scalar_type() != dtype) {
      CRL_INVALID("micro-batch field '", name, "' must be [", t, "] ", dtype, ", got ",
                  x.defined() ? c10::str(x.sizes(), " ", x.scalar_type()) : "undefined");
    }
  };
  check(tokens, "tokens", at::kLong);
  check(loss_mask, "loss_mask", at::kFloat);
  check(old_logprobs, "old_logprobs", at::kFloat);
  check(advantages, "advantages", at::kFloat);
  if (versions.defined()) check(versions, "versions", at::kLong);
  int64_t sum = 0;
  const float* mask = loss_mask.data_ptr<float>();
  for (int64_t len : seq_lens) {
    if (len <= 0) CRL_INVALID("micro-batch has a sequence of length ", len);
    if (sum + len > t) CRL_INVALID("micro-batch seq_lens add up to more than ", t, " tokens");
    if (mask[sum] != 0.0f) CRL_INVALID("micro-batch: the first token of a sequence carries loss");
    sum += len;
  }
  if (sum != t) CRL_INVALID("micro-batch seq_lens add up to ", sum, ", tokens has ", t);
}

namespace {

// Sequences [first, first + count) of `mb` as a micro-batch of their own.
MicroBatch slice_sequences(const MicroBatch& mb, int64_t first, int64_t count) {
  if (first == 0 && count == mb.num_seqs()) return mb;
  int64_t begin = 0;
  for (int64_t i = 0; i < first; ++i) begin += mb.seq_lens[i];
  MicroBatch out;
  out.seq_lens.assign(mb.seq_lens.begin() + first, mb.seq_lens.begin() + first + count);
  int64_t len = 0;
  for (int64_t l : out.seq_lens) len += l;
  out.tokens = mb.tokens.narrow(0, begin, len);
  out.loss_mask = mb.loss_mask.narrow(0, begin, len);
  out.old_logprobs = mb.old_logprobs.narrow(0, begin, len);
  out.advantages = mb.advantages.narrow(0, begin, len);
  if (mb.versions.defined()) out.versions = mb.versions.narrow(0, begin, len);
  out.weight_version = mb.weight_version;  // an upper bound for the slice, as packed
  return out;
}

}  // namespace

std::vector<std::vector<MicroBatch>> split_mini_batches(const std::vector<MicroBatch>& held,
                                                        int64_t count) {
  if (count < 1) CRL_INVALID("mini-batch count must be >= 1, got ", count);
  int64_t total = 0;
  for (const MicroBatch& mb : held) total += mb.num_seqs();
  std::vector<std::vector<MicroBatch>> runs(count);
  int64_t seq = 0;  // the first sequence of the current micro-batch, counted over `held`
  for (const MicroBatch& mb : held) {
    int64_t i = 0;
    while (i < mb.num_seqs()) {
      const int64_t run = (seq + i) * count / total;
      // The first sequence of the next run: the least j with j * count / total > run.
      const int64_t next = ((run + 1) * total + count - 1) / count;
      const int64_t n = std::min(mb.num_seqs() - i, next - (seq + i));
      runs[run].push_back(slice_sequences(mb, i, n));
      i += n;
    }
    seq += mb.num_seqs();
  }
  return runs;
}

std::vector<MicroBatch> pack_micro_batches(const std::vector<SampleGroup>& groups,
                                           int64_t micro_batch_tokens, int64_t weight_version) {
  if (micro_batch_tokens <= 0)
    CRL_INVALID("micro_batch_tokens must be > 0, got ", micro_batch_tokens);
  std::vector<MicroBatch> out;
  std::vector<int64_t> tokens;
  std::vector<float> mask, old_lp, adv;
  std::vector<int64_t> lens, versions;
  auto flush = [&]() {
    if (lens.empty()) return;
    MicroBatch mb;
    mb.tokens = at::tensor(tokens, at::kLong);
    mb.loss_mask = at::tensor(mask, at::kFloat);
    mb.old_logprobs = at::tensor(old_lp, at::kFloat);
    mb.advantages = at::tensor(adv, at::kFloat);
    mb.seq_lens = lens;
    mb.versions = at::tensor(versions, at::kLong);
    mb.weight_version = weight_version;
    for (int64_t v : versions) mb.weight_version = std::max(mb.weight_version, v);
    out.push_back(std::move(mb));
    versions.clear();
    tokens.clear();
    mask.clear();
    old_lp.clear();
    adv.clear();
    lens.clear();
  };
  for (const auto& g : groups) {
    for (size_t si = 0; si < g.samples.size(); ++si) {
      const Sample& s = g.samples[si];
      const std::vector<int32_t>& prompt = s.prompt_ids.empty() ? g.prompt_ids : s.prompt_ids;
      if (prompt.empty()) CRL_INVALID("sample group ", g.prompt_index, " has an empty prompt");
      const int64_t prompt_len = static_cast<int64_t>(prompt.size());
      if (!s.loss_mask.empty() && s.loss_mask.size() != s.completion_ids.size()) {
        CRL_INVALID("sample ", si, " of group ", g.prompt_index, " has ", s.completion_ids.size(),
                    " tokens but a loss mask of ", s.loss_mask.size());
      }
      if (s.logprobs.size() != s.completion_ids.size()) {
        CRL_INVALID("sample ", si, " of group ", g.prompt_index, " has ", s.completion_ids.size(),
                    " tokens but ", s.logprobs.size(), " log-probs");
      }
      if (!s.versions.empty() && s.versions.size() != s.completion_ids.size()) {
        CRL_INVALID("sample ", si, " of group ", g.prompt_index, " has ", s.completion_ids.size(),
                    " tokens but ", s.versions.size(), " weight versions");
      }
      if (s.completion_ids.empty()) continue;
      const int64_t len = prompt_len + static_cast<int64_t>(s.completion_ids.size());
      if (len > micro_batch_tokens) {
        CRL_INVALID("a sequence of ", len, " tokens (group ", g.prompt_index,
                    ") exceeds micro_batch_tokens ", micro_batch_tokens);
      }
      if (static_cast<int64_t>(tokens.size()) + len > micro_batch_tokens) flush();
      for (int32_t id : prompt) {
        tokens.push_back(id);
        mask.push_back(0.0f);
        old_lp.push_back(0.0f);
        adv.push_back(0.0f);
        versions.push_back(-1);
      }
      for (size_t i = 0; i < s.completion_ids.size(); ++i) {
        const bool on = s.loss_mask.empty() || s.loss_mask[i] != 0;
        tokens.push_back(s.completion_ids[i]);
        mask.push_back(on ? 1.0f : 0.0f);
        old_lp.push_back(on ? s.logprobs[i] : 0.0f);
        adv.push_back(on ? static_cast<float>(s.advantage) : 0.0f);
        versions.push_back(!on ? -1 : s.versions.empty() ? weight_version : s.versions[i]);
      }
      lens.push_back(len);
    }
  }
  flush();
  return out;
}

// Serialized layout (host byte order), all sections contiguous:
//   int64 header[6] = {kMagic, kVersion, S, T, weight_version, 0}
//   int64 seq_lens[S]
//   int32 tokens[T]
//   float loss_mask[T], old_logprobs[T], advantages[T]
//   int32 versions[T]
namespace {
constexpr int64_t kMagic = 0x43524c4d42415443;  // "CRLMBATC"
constexpr int64_t kVersion = 2;
constexpr int64_t kHeaderWords = 6;

int64_t serialized_bytes(int64_t s, int64_t t) { return (kHeaderWords + s) * 8 + t * 4 * 5; }
}  // namespace

at::Tensor serialize_micro_batch(const MicroBatch& mb) {
  mb.validate();
  const int64_t s = mb.num_seqs(), t = mb.num_tokens();
  at::Tensor out = at::empty({serialized_bytes(s, t)}, at::kByte);
  uint8_t* p = out.data_ptr<uint8_t>();
  const int64_t header[kHeaderWords] = {kMagic, kVersion, s, t, mb.weight_version, 0};
  std::memcpy(p, header, sizeof(header));
  p += sizeof(header);
  std::memcpy(p, mb.seq_lens.data(), s * 8);
  p += s * 8;
  at::Tensor tok32 = mb.tokens.to(at::kInt).contiguous();
  std::memcpy(p, tok32.data_ptr<int32_t>(), t * 4);
  p += t * 4;
  for (const at::Tensor* f : {&mb.loss_mask, &mb.old_logprobs, &mb.advantages}) {
    at::Tensor c = f->contiguous();
    std::memcpy(p, c.data_ptr<float>(), t * 4);
    p += t * 4;
  }
  at::Tensor v32 = mb.versions.defined() ? mb.versions.to(at::kInt).contiguous()
                                         : at::full({t}, mb.weight_version, at::kInt);
  std::memcpy(p, v32.data_ptr<int32_t>(), t * 4);
  return out;
}

MicroBatch deserialize_micro_batch(const at::Tensor& bytes) {
  if (!bytes.defined() || bytes.scalar_type() != at::kByte || bytes.dim() != 1) {
    CRL_INVALID("deserialize_micro_batch: expected a 1-d uint8 tensor");
  }
  at::Tensor buf = bytes.contiguous().cpu();
  const int64_t n = buf.size(0);
  if (n < kHeaderWords * 8) CRL_INVALID("deserialize_micro_batch: ", n, " bytes is too short");
  const uint8_t* p = buf.data_ptr<uint8_t>();
  int64_t header[kHeaderWords];
  std::memcpy(header, p, sizeof(header));
  if (header[0] != kMagic) CRL_INVALID("deserialize_micro_batch: bad magic");
  if (header[1] != kVersion) CRL_INVALID("deserialize_micro_batch: unknown version ", header[1]);
  const int64_t s = header[2], t = header[3];
  if (s < 0 || t < 0 || s > n || t > n || serialized_bytes(s, t) != n) {
    CRL_INVALID("deserialize_micro_batch: header says ", s, " sequences and ", t,
                " tokens, which does not match ", n, " bytes");
  }
  p += sizeof(header);
  MicroBatch mb;
  mb.weight_version = header[4];
  mb.seq_lens.resize(s);
  std::memcpy(mb.seq_lens.data(), p, s * 8);
  p += s * 8;
  at::Tensor tok32 = at::empty({t}, at::kInt);
  std::memcpy(tok32.data_ptr<int32_t>(), p, t * 4);
  p += t * 4;
  mb.tokens = tok32.to(at::kLong);
  for (at::Tensor* f : {&mb.loss_mask, &mb.old_logprobs, &mb.advantages}) {
    *f = at::empty({t}, at::kFloat);
    std::memcpy(f->data_ptr<float>(), p, t * 4);
    p += t * 4;
  }
  at::Tensor v32 = at::empty({t}, at::kInt);
  std::memcpy(v32.data_ptr<int32_t>(), p, t * 4);
  mb.versions = v32.to(at::kLong);
  mb.validate();
  return mb;
}

}  // namespace crl::trainer
