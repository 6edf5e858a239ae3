#include "kv/block_allocator.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/hash.h"

namespace crl::kv {

namespace {

// Order-sensitive chaining step: h_{i+1} = mix(h_i ^ v_i).
uint64_t combine(uint64_t h, uint64_t v) { return mix64(h ^ v); }

}  // namespace

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  if (num_blocks < 0) {
    CRL_INVALID("BlockAllocator: num_blocks must be >= 0, got ", num_blocks);
  }
  const size_t n = static_cast<size_t>(num_blocks);
  ref_counts_.assign(n, 0);
  prev_.assign(n, -1);
  next_.assign(n, -1);
  block_hash_.assign(n, std::nullopt);
  block_partial_.assign(n, std::nullopt);
  hash_to_block_.reserve(n);
  // Initially every block is free, in id order.
  for (BlockId id = 0; id < num_blocks; ++id) push_free_back(id);
}

std::optional<BlockId> BlockAllocator::allocate() {
  if (free_head_ < 0) return std::nullopt;
  const BlockId id = free_head_;
  CRL_CHECK(ref_counts_[id] == 0, "free-list head ", id, " has ref count ", ref_counts_[id]);
  unlink_free(id);
  if (block_hash_[id].has_value()) {
    // Evict: the block's contents are about to be overwritten.
    auto it = hash_to_block_.find(*block_hash_[id]);
    CRL_CHECK(it != hash_to_block_.end() && it->second == id, "block ", id,
              " has a hash not mapped back to it");
    hash_to_block_.erase(it);
    block_hash_[id].reset();
  }
  drop_partial(id);
  ref_counts_[id] = 1;
  return id;
}

void BlockAllocator::add_ref(BlockId id) {
  CRL_CHECK(id >= 0 && id < num_blocks(), "add_ref: block id ", id, " out of range [0, ",
            num_blocks(), ")");
  CRL_CHECK(ref_counts_[id] > 0, "add_ref of free block ", id);
  ++ref_counts_[id];
}

void BlockAllocator::release(BlockId id) {
  CRL_CHECK(id >= 0 && id < num_blocks(), "release: block id ", id, " out of range [0, ",
            num_blocks(), ")");
  CRL_CHECK(ref_counts_[id] > 0, "release of free block ", id, " (double release?)");
  if (--ref_counts_[id] == 0) push_free_back(id);
}

int32_t BlockAllocator::ref_count(BlockId id) const {
  CRL_CHECK(id >= 0 && id < num_blocks(), "ref_count: block id ", id, " out of range [0, ",
            num_blocks(), ")");
  return ref_counts_[id];
}

bool BlockAllocator::register_hash(BlockId id, BlockHash hash) {
  CRL_CHECK(id >= 0 && id < num_blocks(), "register_hash: block id ", id, " out of range [0, ",
            num_blocks(), ")");
  CRL_CHECK(ref_counts_[id] > 0, "register_hash of free block ", id);
  if (block_hash_[id].has_value()) return false;
  if (hash_to_block_.count(hash) != 0) return false;
  hash_to_block_.emplace(hash, id);
  block_hash_[id] = hash;
  return true;
}

std::optional<BlockId> BlockAllocator::lookup_cached(BlockHash hash) {
  auto it = hash_to_block_.find(hash);
  if (it == hash_to_block_.end()) return std::nullopt;
  return take(it->second);
}

bool BlockAllocator::register_partial(BlockId id, BlockHash hash) {
  CRL_CHECK(id >= 0 && id < num_blocks(), "register_partial: block id ", id, " out of range [0, ",
            num_blocks(), ")");
  CRL_CHECK(ref_counts_[id] > 0, "register_partial of free block ", id);
  if (block_partial_[id].has_value() || partial_to_block_.count(hash) != 0) return false;
  partial_to_block_.emplace(hash, id);
  block_partial_[id] = hash;
  return true;
}

std::optional<BlockId> BlockAllocator::lookup_partial(BlockHash hash) {
  auto it = partial_to_block_.find(hash);
  if (it == partial_to_block_.end()) return std::nullopt;
  return take(it->second);
}

void BlockAllocator::drop_partial(BlockId id) {
  CRL_CHECK(id >= 0 && id < num_blocks(), "drop_partial: block id ", id, " out of range [0, ",
            num_blocks(), ")");
  if (!block_partial_[id].has_value()) return;
  partial_to_block_.erase(*block_partial_[id]);
  block_partial_[id].reset();
}

BlockId BlockAllocator::take(BlockId id) {
  if (ref_counts_[id] == 0) unlink_free(id);  // revive a cached-but-free block
  ++ref_counts_[id];
  return id;
}

void BlockAllocator::reset_prefix_cache() {
  hash_to_block_.clear();
  for (auto& h : block_hash_) h.reset();
  partial_to_block_.clear();
  for (auto& h : block_partial_) h.reset();
}

BlockHash BlockAllocator::hash_block(BlockHash parent_hash, const int32_t* tokens,
                                     int32_t num_tokens, int64_t weight_version) {
  CRL_CHECK(num_tokens >= 0, "hash_block: num_tokens must be >= 0, got ", num_tokens);
  CRL_CHECK(tokens != nullptr || num_tokens == 0, "hash_block: null tokens with num_tokens ",
            num_tokens);
  uint64_t h = 0x243f6a8885a308d3ULL;  // fixed seed (pi digits): same value in every process
  h = combine(h, parent_hash);
  h = combine(h, static_cast<uint64_t>(weight_version));
  h = combine(h, static_cast<uint64_t>(static_cast<uint32_t>(num_tokens)));
  for (int32_t i = 0; i < num_tokens; ++i) {
    h = combine(h, static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])));
  }
  return h;
}

void BlockAllocator::check_invariants() const {
  const int32_t n = num_blocks();
  CRL_CHECK(prev_.size() == ref_counts_.size() && next_.size() == ref_counts_.size() &&
                block_hash_.size() == ref_counts_.size() &&
                block_partial_.size() == ref_counts_.size(),
            "per-block arrays differ in size");
  CRL_CHECK(num_free_ >= 0 && num_free_ <= n, "num_free ", num_free_, " outside [0, ", n, "]");

  // Walk the free list (bounded by n steps so a cycle cannot loop forever).
  std::vector<char> on_free_list(static_cast<size_t>(n), 0);
  CRL_CHECK((free_head_ < 0) == (free_tail_ < 0), "free head ", free_head_, " and tail ",
            free_tail_, " disagree on emptiness");
  int32_t length = 0;
  BlockId prev = -1;
  for (BlockId id = free_head_; id >= 0; id = next_[id]) {
    CRL_CHECK(id < n, "free-list id ", id, " out of range");
    CRL_CHECK(!on_free_list[id], "free list has a cycle through block ", id);
    CRL_CHECK(length < n, "free list longer than the pool");
    on_free_list[id] = 1;
    CRL_CHECK(prev_[id] == prev, "block ", id, " has prev ", prev_[id], ", expected ", prev);
    CRL_CHECK(ref_counts_[id] == 0, "free block ", id, " has ref count ", ref_counts_[id]);
    prev = id;
    ++length;
  }
  CRL_CHECK(prev == free_tail_, "free list ends at ", prev, " but tail is ", free_tail_);
  CRL_CHECK(length == num_free_, "free list has ", length, " blocks but num_free is ", num_free_);

  int64_t num_hashed = 0;
  for (BlockId id = 0; id < n; ++id) {
    if (!on_free_list[id]) {
      CRL_CHECK(ref_counts_[id] > 0, "block ", id, " is off the free list with ref count ",
                ref_counts_[id]);
      CRL_CHECK(prev_[id] == -1 && next_[id] == -1, "used block ", id, " has free-list links");
    }
    if (block_hash_[id].has_value()) {
      ++num_hashed;
      auto it = hash_to_block_.find(*block_hash_[id]);
      CRL_CHECK(it != hash_to_block_.end() && it->second == id, "hash of block ", id,
                " is not mapped back to it");
    }
  }
  CRL_CHECK(num_hashed == static_cast<int64_t>(hash_to_block_.size()), num_hashed,
            " blocks carry a hash but the map has ", hash_to_block_.size(), " entries");
  for (const auto& [hash, id] : hash_to_block_) {
    CRL_CHECK(id >= 0 && id < n, "hash map points to out-of-range block ", id);
    CRL_CHECK(block_hash_[id].has_value() && *block_hash_[id] == hash, "hash map entry for block ",
              id, " does not match the block's hash");
  }
  int64_t num_partial = 0;
  for (BlockId id = 0; id < n; ++id) {
    if (!block_partial_[id].has_value()) continue;
    ++num_partial;
    auto it = partial_to_block_.find(*block_partial_[id]);
    CRL_CHECK(it != partial_to_block_.end() && it->second == id, "partial entry of block ", id,
              " is not mapped back to it");
  }
  CRL_CHECK(num_partial == static_cast<int64_t>(partial_to_block_.size()), num_partial,
            " blocks carry a partial entry but the map has ", partial_to_block_.size());
}

void BlockAllocator::unlink_free(BlockId id) {
  const BlockId p = prev_[id];
  const BlockId nx = next_[id];
  if (p >= 0) {
    next_[p] = nx;
  } else {
    free_head_ = nx;
  }
  if (nx >= 0) {
    prev_[nx] = p;
  } else {
    free_tail_ = p;
  }
  prev_[id] = -1;
  next_[id] = -1;
  --num_free_;
}

void BlockAllocator::push_free_back(BlockId id) {
  prev_[id] = free_tail_;
  next_[id] = -1;
  if (free_tail_ >= 0) {
    next_[free_tail_] = id;
  } else {
    free_head_ = id;
  }
  free_tail_ = id;
  ++num_free_;
}

}  // namespace crl::kv
