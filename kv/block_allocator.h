// BlockAllocator: pure bookkeeping for the paged KV cache (no tensors, no locks).
//
// Owns: the ids [0, num_blocks) of the KV block pool, their reference counts, an O(1) free list
// (intrusive doubly linked, least-recently-freed first) and the prefix-cache map from block hash
// to block id.
//
// Prefix caching: a *full* block may be registered under a hash that chains the previous block's
// hash, the block's token ids and the weight version (hash_block). When its last reference is
// released the block goes back to the free list but keeps its hash, so a later lookup_cached() can
// revive it until allocate() reuses (evicts) it. reset_prefix_cache() forgets every hash.
// A block may also carry one *partial* entry: its first k < block_size slots hold the K/V of the
// tokens the partial hash names (a finished sequence's last, unfilled block: the earlier turn of a
// multi-turn conversation). Whoever writes such a block drops its entry first (drop_partial), so
// the slots an entry vouches for never change while it is registered.
//
// Thread safety: none. Only the engine thread (which owns the Scheduler) may call it.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace crl::kv {

using BlockId = int32_t;
using BlockHash = uint64_t;

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  // Blocks with ref count 0 (cached-but-free blocks included).
  int32_t num_free_blocks() const { return num_free_; }
  int32_t num_used_blocks() const { return num_blocks() - num_free_; }
  bool can_allocate(int32_t n) const { return n <= num_free_; }

  // Takes the least recently freed block, evicting its prefix-cache entry if it had one.
  // Returns nullopt when no block is free. The block's ref count becomes 1.
  std::optional<BlockId> allocate();

  // Adds one reference (sharing between the n samples of a request). REQUIRES: ref_count(id) > 0.
  void add_ref(BlockId id);

  // Drops one reference; at zero the block returns to the tail of the free list (keeping its hash).
  // REQUIRES: ref_count(id) > 0 (throws crl::CheckError otherwise).
  void release(BlockId id);

  int32_t ref_count(BlockId id) const;

  // Registers a full block under `hash`. A block already registered keeps its first hash; if
  // another block already owns `hash`, nothing changes (returns false).
  bool register_hash(BlockId id, BlockHash hash);

  // Prefix-cache lookup: the block registered under `hash`, or nullopt. On a hit the block gains a
  // reference (and leaves the free list if it was free).
  std::optional<BlockId> lookup_cached(BlockHash hash);

  // True when `hash` is registered (no reference taken).
  bool contains_hash(BlockHash hash) const { return hash_to_block_.count(hash) != 0; }

  // Registers a partial entry of block `id` (see above). A block keeps its first partial entry;
  // a hash owned by another block is left alone (returns false). REQUIRES: ref_count(id) > 0.
  bool register_partial(BlockId id, BlockHash hash);
  // The block whose partial entry is `hash`, with a reference taken (as lookup_cached), or nullopt.
  std::optional<BlockId> lookup_partial(BlockHash hash);
  // Forgets block `id`'s partial entry, if it has one.
  void drop_partial(BlockId id);
  int64_t num_partial_entries() const { return static_cast<int64_t>(partial_to_block_.size()); }

  // Forgets every registered hash, partial ones included (weight update, explicit reset). Blocks
  // and refs are unchanged.
  void reset_prefix_cache();

  int64_t num_cached_hashes() const { return static_cast<int64_t>(hash_to_block_.size()); }

  // Hash of a full block: chains parent_hash, the block's token ids and the weight version, so KV
  // computed by older weights never matches. Deterministic across processes and runs.
  static BlockHash hash_block(BlockHash parent_hash, const int32_t* tokens, int32_t num_tokens,
                              int64_t weight_version);

  // Checks the internal invariants (free-list length == num_free, no negative refs, map and
  // per-block hashes consistent). Throws crl::CheckError describing the first violation. O(n).
  void check_invariants() const;

 private:
  // A reference to a cached block, reviving it from the free list if it was free.
  BlockId take(BlockId id);
  void unlink_free(BlockId id);
  void push_free_back(BlockId id);

  std::vector<int32_t> ref_counts_;
  std::vector<BlockId> prev_;  // free-list links, -1 at the ends / when not free
  std::vector<BlockId> next_;
  std::vector<std::optional<BlockHash>> block_hash_;
  std::unordered_map<BlockHash, BlockId> hash_to_block_;
  std::vector<std::optional<BlockHash>> block_partial_;
  std::unordered_map<BlockHash, BlockId> partial_to_block_;
  BlockId free_head_ = -1;
  BlockId free_tail_ = -1;
  int32_t num_free_ = 0;
};

}  // namespace crl::kv
