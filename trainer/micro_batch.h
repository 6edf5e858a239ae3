// Rollout samples and the packed micro-batch the trainer consumes (docs/design.md §5 step 3).
//
// A finished rollout is a SampleGroup: one prompt, its n completions, their rewards and the
// engine's log-probs. The packer concatenates prompt + completion of every sample, then packs
// whole sequences, in order, into MicroBatches of at most `micro_batch_tokens` tokens: nothing is
// padded, sequences are delimited by seq_lens (cu_seqlens), and a sequence never splits.
//
// Per-token fields are aligned with `tokens`: entry j describes token j as a *target* (it is
// predicted by the logits of row j - 1 of the same sequence). loss_mask is 1 on completion tokens
// only, so the first token of a sequence (a prompt token) never carries loss.
//
// serialize() / deserialize() turn a MicroBatch into one contiguous uint8 tensor and back, so the
// rollout transport can send it as a single message (host byte order: sender and receiver are the
// same build on the same kind of machine).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace crl::trainer {

// One finished completion of a prompt.
struct Sample {
  std::vector<int32_t> completion_ids;  // generated tokens (EOS included when it stopped on EOS)
  std::vector<float> logprobs;          // engine log-prob of each completion token (behaviour)
  std::vector<int64_t> versions;        // weight version that sampled each token (empty: the
                                        // version given to pack_micro_batches)
  double reward = 0;                    // verifiable reward
  double advantage = 0;                 // set by compute_group_advantages (GRPO) or the caller
  // Multi-turn (issue 28): the loss weight of each completion token, 1 for the model's tokens,
  // exactly 0 for tool/environment text inside the completion (empty: all 1), and the sample's
  // own prompt (empty: its group's; a trajectory's later segment has its own).
  std::vector<uint8_t> loss_mask;
  std::vector<int32_t> prompt_ids;
};

// The n samples of one prompt (a GRPO group; never split across infer ranks).
struct SampleGroup {
  std::vector<int32_t> prompt_ids;  // BOS included when the model adds one
  std::vector<Sample> samples;
  int64_t prompt_index = 0;  // caller's id of the prompt (task row), for bookkeeping
};

// Sets each sample's advantage to (r - mean) / (std + eps) over its group, std with Bessel's
// correction (as TRL's GRPO); a group of one sample, or of equal rewards, gets advantage 0
// exactly. Equal: no reward further than 1e-9 (relative, at least absolute) from the first, so
// eight partial-credit scores of 0.1, whose computed spread is rounding (~1e-17), are equal too.
void compute_group_advantages(SampleGroup& group, double eps = 1e-4);
void compute_group_advantages(std::vector<SampleGroup>& groups, double eps = 1e-4);

// A teacher-forced SFT example as a one-sample group: `prompt_ids` (BOS included by the caller),
// then `answer_ids` followed by `eos` as the completion; log-probs 0 (the SFT loss ignores them).
SampleGroup sft_group(std::vector<int32_t> prompt_ids, const std::vector<int32_t>& answer_ids,
                      int32_t eos);

struct MicroBatch {
  at::Tensor tokens;              // [T] int64: prompt + completion of each sequence, concatenated
  std::vector<int64_t> seq_lens;  // [S]: tokens per sequence, sum == T
  at::Tensor loss_mask;           // [T] float32: 1 on completion tokens, else 0
  at::Tensor old_logprobs;        // [T] float32: engine log-prob of the token (0 off the mask)
  at::Tensor advantages;          // [T] float32: the sequence's advantage on its completion tokens
  at::Tensor versions;            // [T] int64: weight version that sampled the token (-1 on prompt
                                  // tokens); undefined = weight_version everywhere
  int64_t weight_version = 0;     // the newest version that sampled a token

  int64_t num_tokens() const { return tokens.defined() ? tokens.size(0) : 0; }
  int64_t num_seqs() const { return static_cast<int64_t>(seq_lens.size()); }
  // Tokens that carry loss (completion tokens).
  int64_t num_loss_tokens() const;
  // [S + 1] int64 prefix sums of seq_lens.
  at::Tensor cu_seqlens() const;
  // Throws std::invalid_argument when the fields disagree in length/dtype or a sequence's first
  // token is on the loss mask.
  void validate() const;
};

// Packs the groups' sequences in order into micro-batches of at most `micro_batch_tokens` tokens.
// Completion tokens off a sample's loss_mask get mask 0, log-prob 0, advantage 0 and version -1.
// Throws std::invalid_argument when one sequence alone exceeds the cap, a sample's logprobs (or
// loss_mask) and completion lengths differ, or a prompt is empty. Samples with an empty completion
// are skipped.
std::vector<MicroBatch> pack_micro_batches(const std::vector<SampleGroup>& groups,
                                           int64_t micro_batch_tokens, int64_t weight_version = 0);

// PPO mini-batches (verl's ppo_mini_batch_size, as a count): the sequences of `held`, in order,
// in `count` runs of as equal a number of sequences as can be (sequence i of S goes to run
// i * count / S), each run the slices of the micro-batches it spans (a slice never grows past
// its micro-batch, so never past the token cap). Runs may be empty when there are fewer sequences
// than runs. Throws std::invalid_argument when count < 1.
std::vector<std::vector<MicroBatch>> split_mini_batches(const std::vector<MicroBatch>& held,
                                                        int64_t count);

// One contiguous uint8 tensor holding every field of `mb` (format in micro_batch.cpp).
at::Tensor serialize_micro_batch(const MicroBatch& mb);
// The inverse of serialize_micro_batch. Throws std::invalid_argument on a malformed buffer
// (bad magic/version, sizes that do not add up).
MicroBatch deserialize_micro_batch(const at::Tensor& bytes);

}  // namespace crl::trainer
