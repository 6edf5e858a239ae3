#include "kv/block_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "common/check.h"
#include "tests/test_utils.h"

namespace crl::kv {
namespace {

std::vector<BlockId> allocate_n(BlockAllocator& a, int n) {
  std::vector<BlockId> ids;
  for (int i = 0; i < n; ++i) {
    std::optional<BlockId> id = a.allocate();
    EXPECT_TRUE(id.has_value()) << "allocation " << i << " failed";
    if (id) ids.push_back(*id);
  }
  return ids;
}

TEST(BlockAllocatorTest, StartsWithAllBlocksFree) {
  BlockAllocator a(8);
  EXPECT_EQ(a.num_blocks(), 8);
  EXPECT_EQ(a.num_free_blocks(), 8);
  EXPECT_EQ(a.num_used_blocks(), 0);
  EXPECT_TRUE(a.can_allocate(8));
  EXPECT_FALSE(a.can_allocate(9));
  for (BlockId id = 0; id < 8; ++id) EXPECT_EQ(a.ref_count(id), 0);
  a.check_invariants();
}

TEST(BlockAllocatorTest, RejectsNegativeBlockCount) {
  EXPECT_THROW(BlockAllocator(-1), std::invalid_argument);
}

TEST(BlockAllocatorTest, ReturnsNulloptWhenExhausted) {
  BlockAllocator a(4);
  std::vector<BlockId> ids = allocate_n(a, 4);
  std::set<BlockId> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), 4u);
  for (BlockId id : ids) EXPECT_EQ(a.ref_count(id), 1);
  EXPECT_EQ(a.num_free_blocks(), 0);
  EXPECT_EQ(a.num_used_blocks(), 4);
  EXPECT_FALSE(a.can_allocate(1));
  EXPECT_FALSE(a.allocate().has_value());
  EXPECT_FALSE(a.allocate().has_value());
  a.check_invariants();
}

TEST(BlockAllocatorTest, EmptyPoolNeverAllocates) {
  BlockAllocator a(0);
  EXPECT_FALSE(a.allocate().has_value());
  EXPECT_TRUE(a.can_allocate(0));
  a.check_invariants();
}

TEST(BlockAllocatorTest, ReusesBlocksInReleaseOrder) {
  BlockAllocator a(5);
  std::vector<BlockId> ids = allocate_n(a, 5);
  // Initial order is by id.
  EXPECT_EQ(ids, (std::vector<BlockId>{0, 1, 2, 3, 4}));
  const std::vector<BlockId> release_order = {3, 0, 4, 1, 2};
  for (BlockId id : release_order) a.release(id);
  a.check_invariants();
  EXPECT_EQ(allocate_n(a, 5), release_order);
}

TEST(BlockAllocatorTest, FreedBlockGoesBehindOlderFreeBlocks) {
  BlockAllocator a(4);
  std::vector<BlockId> ids = allocate_n(a, 2);  // 0, 1 used; 2, 3 still free
  a.release(ids[0]);                            // free list: 2, 3, 0
  EXPECT_EQ(allocate_n(a, 3), (std::vector<BlockId>{2, 3, 0}));
}

TEST(BlockAllocatorTest, FreesBlockWhenLastRefReleased) {
  BlockAllocator a(2);
  BlockId id = *a.allocate();
  a.add_ref(id);
  a.add_ref(id);
  EXPECT_EQ(a.ref_count(id), 3);
  EXPECT_EQ(a.num_free_blocks(), 1);
  a.release(id);
  a.release(id);
  EXPECT_EQ(a.ref_count(id), 1);
  EXPECT_EQ(a.num_free_blocks(), 1);
  a.check_invariants();
  a.release(id);
  EXPECT_EQ(a.ref_count(id), 0);
  EXPECT_EQ(a.num_free_blocks(), 2);
  a.check_invariants();
}

TEST(BlockAllocatorTest, DoubleReleaseThrowsAndLeavesStateIntact) {
  BlockAllocator a(3);
  BlockId x = *a.allocate();
  BlockId y = *a.allocate();
  a.release(x);
  ASSERT_THROWS_WITH(a.release(x), crl::CheckError, "release of free block");
  EXPECT_EQ(a.ref_count(x), 0);
  EXPECT_EQ(a.ref_count(y), 1);
  EXPECT_EQ(a.num_free_blocks(), 2);
  a.check_invariants();
  // The free list was not corrupted: x is handed out exactly once, after block 2.
  EXPECT_EQ(allocate_n(a, 2), (std::vector<BlockId>{2, x}));
  EXPECT_FALSE(a.allocate().has_value());
  a.check_invariants();
}

TEST(BlockAllocatorTest, AddRefOfFreeBlockThrows) {
  BlockAllocator a(2);
  ASSERT_THROWS_WITH(a.add_ref(1), crl::CheckError, "add_ref of free block");
  EXPECT_EQ(a.ref_count(1), 0);
  EXPECT_EQ(a.num_free_blocks(), 2);
  a.check_invariants();
}

TEST(BlockAllocatorTest, OutOfRangeIdsThrow) {
  BlockAllocator a(2);
  a.allocate();
  ASSERT_THROWS_WITH(a.release(2), crl::CheckError, "out of range");
  ASSERT_THROWS_WITH(a.release(-1), crl::CheckError, "out of range");
  ASSERT_THROWS_WITH(a.add_ref(7), crl::CheckError, "out of range");
  ASSERT_THROWS_WITH(a.ref_count(-3), crl::CheckError, "out of range");
  ASSERT_THROWS_WITH(a.register_hash(2, 42), crl::CheckError, "out of range");
  EXPECT_EQ(a.num_free_blocks(), 1);
  a.check_invariants();
}

TEST(BlockAllocatorTest, RegisterHashKeepsFirstHashAndRejectsTakenHash) {
  BlockAllocator a(3);
  BlockId x = *a.allocate();
  BlockId y = *a.allocate();
  EXPECT_TRUE(a.register_hash(x, 100));
  EXPECT_FALSE(a.register_hash(x, 200));  // x keeps 100
  EXPECT_FALSE(a.register_hash(y, 100));  // 100 belongs to x
  EXPECT_TRUE(a.contains_hash(100));
  EXPECT_FALSE(a.contains_hash(200));
  EXPECT_EQ(a.num_cached_hashes(), 1);
  EXPECT_EQ(a.lookup_cached(100), std::optional<BlockId>(x));
  EXPECT_EQ(a.ref_count(x), 2);
  EXPECT_EQ(a.ref_count(y), 1);
  EXPECT_TRUE(a.register_hash(y, 200));
  EXPECT_EQ(a.num_cached_hashes(), 2);
  a.check_invariants();
}

TEST(BlockAllocatorTest, RegisterHashOfFreeBlockThrows) {
  BlockAllocator a(2);
  ASSERT_THROWS_WITH(a.register_hash(0, 5), crl::CheckError, "register_hash of free block");
  EXPECT_FALSE(a.contains_hash(5));
  a.check_invariants();
}

TEST(BlockAllocatorTest, LookupRevivesReleasedCachedBlock) {
  BlockAllocator a(4);
  std::vector<BlockId> ids = allocate_n(a, 3);  // block 3 stays free
  const BlockId cached = ids[1];
  ASSERT_TRUE(a.register_hash(cached, 777));
  a.release(ids[0]);
  a.release(cached);
  a.release(ids[2]);  // free list: 3, ids[0], cached, ids[2]
  EXPECT_EQ(a.num_free_blocks(), 4);
  EXPECT_TRUE(a.contains_hash(777));
  a.check_invariants();

  EXPECT_EQ(a.lookup_cached(777), std::optional<BlockId>(cached));
  EXPECT_EQ(a.ref_count(cached), 1);
  EXPECT_EQ(a.num_free_blocks(), 3);
  EXPECT_TRUE(a.contains_hash(777));  // a hit keeps the entry
  a.check_invariants();
  // It left the middle of the free list; the others keep their order.
  EXPECT_EQ(allocate_n(a, 3), (std::vector<BlockId>{3, ids[0], ids[2]}));
  EXPECT_FALSE(a.allocate().has_value());
  EXPECT_TRUE(a.contains_hash(777));
  EXPECT_EQ(a.ref_count(cached), 1);
  a.check_invariants();
}

TEST(BlockAllocatorTest, LookupOfUsedCachedBlockAddsReference) {
  BlockAllocator a(2);
  BlockId id = *a.allocate();
  ASSERT_TRUE(a.register_hash(id, 9));
  EXPECT_EQ(a.lookup_cached(9), std::optional<BlockId>(id));
  EXPECT_EQ(a.ref_count(id), 2);
  EXPECT_EQ(a.num_free_blocks(), 1);
  EXPECT_FALSE(a.lookup_cached(10).has_value());
  a.check_invariants();
}

TEST(BlockAllocatorTest, AllocateEvictsCachedBlockLast) {
  BlockAllocator a(3);
  BlockId cached = *a.allocate();
  ASSERT_TRUE(a.register_hash(cached, 55));
  a.release(cached);  // free list: 1, 2, cached(0)
  EXPECT_EQ(allocate_n(a, 2), (std::vector<BlockId>{1, 2}));
  EXPECT_TRUE(a.contains_hash(55));  // not evicted while other blocks were free
  std::optional<BlockId> reused = a.allocate();
  ASSERT_TRUE(reused.has_value());
  EXPECT_EQ(*reused, cached);
  EXPECT_FALSE(a.contains_hash(55));
  EXPECT_EQ(a.num_cached_hashes(), 0);
  EXPECT_FALSE(a.lookup_cached(55).has_value());
  // The evicted block can be registered under a new hash, and the old hash is free again.
  EXPECT_TRUE(a.register_hash(cached, 56));
  EXPECT_TRUE(a.register_hash(1, 55));
  a.check_invariants();
}

TEST(BlockAllocatorTest, ResetPrefixCacheForgetsHashes) {
  BlockAllocator a(3);
  BlockId used = *a.allocate();
  BlockId freed = *a.allocate();
  ASSERT_TRUE(a.register_hash(used, 1));
  ASSERT_TRUE(a.register_hash(freed, 2));
  a.release(freed);
  a.reset_prefix_cache();
  EXPECT_EQ(a.num_cached_hashes(), 0);
  EXPECT_FALSE(a.contains_hash(1));
  EXPECT_FALSE(a.lookup_cached(2).has_value());
  // Blocks and refs are unchanged.
  EXPECT_EQ(a.ref_count(used), 1);
  EXPECT_EQ(a.ref_count(freed), 0);
  EXPECT_EQ(a.num_free_blocks(), 2);
  // The used block may take a new hash now.
  EXPECT_TRUE(a.register_hash(used, 3));
  a.check_invariants();
}

// A partial entry (a finished turn's last, unfilled block) lives beside the block's full hash:
// one per block, revived by a hit, evicted with the block, forgotten by a reset.
TEST(BlockAllocatorTest, PartialEntryIsRevivedByAHitAndEvictedWithItsBlock) {
  BlockAllocator a(3);
  const BlockId tail = *a.allocate();
  ASSERT_TRUE(a.register_partial(tail, 41));
  EXPECT_FALSE(a.register_partial(tail, 42)) << "a block keeps its first partial entry";
  const BlockId other = *a.allocate();
  EXPECT_FALSE(a.register_partial(other, 41)) << "the hash belongs to another block";
  EXPECT_FALSE(a.lookup_cached(41).has_value()) << "partial and full entries are apart";
  a.release(other);
  a.release(tail);  // free list: 2, other, tail
  a.check_invariants();
  EXPECT_EQ(a.lookup_partial(41), std::optional<BlockId>(tail));
  EXPECT_EQ(a.ref_count(tail), 1);
  a.release(tail);  // free list: 2, other, tail
  EXPECT_EQ(allocate_n(a, 2), (std::vector<BlockId>{2, other}));
  EXPECT_EQ(a.num_partial_entries(), 1);
  EXPECT_EQ(a.allocate(), std::optional<BlockId>(tail));
  EXPECT_EQ(a.num_partial_entries(), 0) << "reusing the block evicts its entry";
  EXPECT_FALSE(a.lookup_partial(41).has_value());
  ASSERT_TRUE(a.register_partial(tail, 43));
  a.drop_partial(tail);
  EXPECT_FALSE(a.lookup_partial(43).has_value());
  ASSERT_TRUE(a.register_partial(tail, 43));
  a.reset_prefix_cache();
  EXPECT_FALSE(a.lookup_partial(43).has_value());
  a.check_invariants();
}

TEST(BlockAllocatorTest, HashBlockIsDeterministicAndSensitiveToEveryInput) {
  const std::vector<int32_t> t = {5, 17, 3, 99};
  const BlockHash base = BlockAllocator::hash_block(123, t.data(), 4, 7);
  const std::vector<int32_t> t_copy = t;
  EXPECT_EQ(BlockAllocator::hash_block(123, t_copy.data(), 4, 7), base);

  EXPECT_NE(BlockAllocator::hash_block(123, t.data(), 4, 8), base);  // weight version
  EXPECT_NE(BlockAllocator::hash_block(124, t.data(), 4, 7), base);  // parent
  for (size_t i = 0; i < t.size(); ++i) {
    std::vector<int32_t> u = t;
    u[i] += 1;
    EXPECT_NE(BlockAllocator::hash_block(123, u.data(), 4, 7), base) << "token " << i;
  }
  const std::vector<int32_t> swapped = {17, 5, 3, 99};
  EXPECT_NE(BlockAllocator::hash_block(123, swapped.data(), 4, 7), base);  // order matters
  EXPECT_NE(BlockAllocator::hash_block(123, t.data(), 3, 7), base);        // length matters
  EXPECT_NE(BlockAllocator::hash_block(123, t.data(), 0, 7),
            BlockAllocator::hash_block(0, t.data(), 0, 7));
  EXPECT_NO_THROW(BlockAllocator::hash_block(0, nullptr, 0, 0));
  EXPECT_THROW(BlockAllocator::hash_block(0, t.data(), -1, 0), crl::CheckError);
}

TEST(BlockAllocatorTest, HashBlockHasFixedValueAcrossProcesses) {
  // Pinned value: no per-process seed (std::hash, addresses) may leak in, since hashes must agree
  // between runs. Changing the hash function on purpose means updating this constant.
  const int32_t toks[4] = {1, 2, 3, 4};
  EXPECT_EQ(BlockAllocator::hash_block(0, toks, 4, 1), 0xc299c31cac9cef22ULL);
}

TEST(BlockAllocatorTest, HashBlockChainsDistinguishPrefixes) {
  // Same second block after different first blocks must hash differently.
  const std::vector<int32_t> a1 = {1, 2}, b1 = {1, 3}, second = {4, 4};
  const BlockHash ha = BlockAllocator::hash_block(0, a1.data(), 2, 0);
  const BlockHash hb = BlockAllocator::hash_block(0, b1.data(), 2, 0);
  ASSERT_NE(ha, hb);
  EXPECT_NE(BlockAllocator::hash_block(ha, second.data(), 2, 0),
            BlockAllocator::hash_block(hb, second.data(), 2, 0));
  // No collisions among many small distinct blocks.
  std::set<BlockHash> seen;
  for (int32_t x = 0; x < 64; ++x) {
    for (int32_t y = 0; y < 64; ++y) {
      const int32_t toks[2] = {x, y};
      seen.insert(BlockAllocator::hash_block(0, toks, 2, 0));
    }
  }
  EXPECT_EQ(seen.size(), 64u * 64u);
}

// A simple O(n) reference: refs, LRU free order and hash ownership.
struct ReferenceModel {
  explicit ReferenceModel(int n) {
    for (BlockId id = 0; id < n; ++id) {
      refs[id] = 0;
      free_order.push_back(id);
    }
  }
  std::map<BlockId, int> refs;
  std::list<BlockId> free_order;  // least recently freed first
  std::map<BlockHash, BlockId> owner;
  std::map<BlockId, BlockHash> hash_of;

  std::optional<BlockId> allocate() {
    if (free_order.empty()) return std::nullopt;
    BlockId id = free_order.front();
    free_order.pop_front();
    auto it = hash_of.find(id);
    if (it != hash_of.end()) {
      owner.erase(it->second);
      hash_of.erase(it);
    }
    refs[id] = 1;
    return id;
  }
  void release(BlockId id) {
    if (--refs[id] == 0) free_order.push_back(id);
  }
  bool register_hash(BlockId id, BlockHash h) {
    if (hash_of.count(id) || owner.count(h)) return false;
    hash_of[id] = h;
    owner[h] = id;
    return true;
  }
  std::optional<BlockId> lookup(BlockHash h) {
    auto it = owner.find(h);
    if (it == owner.end()) return std::nullopt;
    BlockId id = it->second;
    if (refs[id] == 0) free_order.remove(id);
    ++refs[id];
    return id;
  }
  void reset() {
    owner.clear();
    hash_of.clear();
  }
  std::vector<BlockId> used() const {
    std::vector<BlockId> out;
    for (const auto& [id, r] : refs) {
      if (r > 0) out.push_back(id);
    }
    return out;
  }
};

void expect_matches_model(const BlockAllocator& a, const ReferenceModel& m, int step,
                          BlockHash num_hashes) {
  ASSERT_NO_THROW(a.check_invariants()) << "step " << step;
  ASSERT_EQ(a.num_free_blocks() + a.num_used_blocks(), a.num_blocks()) << "step " << step;
  ASSERT_EQ(a.num_free_blocks(), static_cast<int32_t>(m.free_order.size())) << "step " << step;
  for (const auto& [id, r] : m.refs) {
    ASSERT_GE(a.ref_count(id), 0) << "step " << step;
    ASSERT_EQ(a.ref_count(id), r) << "step " << step << " block " << id;
  }
  ASSERT_EQ(a.num_cached_hashes(), static_cast<int64_t>(m.owner.size())) << "step " << step;
  for (BlockHash h = 0; h < num_hashes; ++h) {
    ASSERT_EQ(a.contains_hash(h), m.owner.count(h) != 0) << "step " << step << " hash " << h;
  }
}

TEST(BlockAllocatorTest, RandomOperationsMatchReferenceModel) {
  constexpr int kBlocks = 24;
  constexpr BlockHash kHashes = 40;  // small pool: conflicts and repeat lookups are common
  constexpr int kSteps = 30000;
  BlockAllocator a(kBlocks);
  ReferenceModel m(kBlocks);
  std::mt19937 rng(20240611);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int hits = 0, evictions = 0, exhausted = 0, rejected = 0;

  for (int step = 0; step < kSteps; ++step) {
    const int op = uniform(0, 99);
    const std::vector<BlockId> used = m.used();
    if (op < 30) {  // allocate
      const bool had_hash_at_head = !m.free_order.empty() && m.hash_of.count(m.free_order.front());
      std::optional<BlockId> want = m.allocate();
      std::optional<BlockId> got = a.allocate();
      ASSERT_EQ(got, want) << "step " << step;
      if (!want) ++exhausted;
      if (had_hash_at_head) ++evictions;
    } else if (op < 40) {  // add_ref
      if (used.empty()) continue;
      BlockId id = used[uniform(0, static_cast<int>(used.size()) - 1)];
      a.add_ref(id);
      ++m.refs[id];
    } else if (op < 70) {  // release
      if (used.empty()) continue;
      BlockId id = used[uniform(0, static_cast<int>(used.size()) - 1)];
      a.release(id);
      m.release(id);
    } else if (op < 82) {  // register_hash
      if (used.empty()) continue;
      BlockId id = used[uniform(0, static_cast<int>(used.size()) - 1)];
      BlockHash h = static_cast<BlockHash>(uniform(0, kHashes - 1));
      ASSERT_EQ(a.register_hash(id, h), m.register_hash(id, h)) << "step " << step;
    } else if (op < 96) {  // lookup_cached
      BlockHash h = static_cast<BlockHash>(uniform(0, kHashes - 1));
      std::optional<BlockId> want = m.lookup(h);
      ASSERT_EQ(a.lookup_cached(h), want) << "step " << step;
      if (want) ++hits;
    } else if (op < 97) {  // reset
      a.reset_prefix_cache();
      m.reset();
    } else {  // misuse: release or add_ref of a free block must throw and change nothing
      if (m.free_order.empty()) continue;
      auto it = m.free_order.begin();
      std::advance(it, uniform(0, static_cast<int>(m.free_order.size()) - 1));
      if (op % 2 == 0) {
        EXPECT_THROW(a.release(*it), crl::CheckError) << "step " << step;
      } else {
        EXPECT_THROW(a.add_ref(*it), crl::CheckError) << "step " << step;
      }
      ++rejected;
    }
    expect_matches_model(a, m, step, kHashes);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The walk exercised every interesting path.
  EXPECT_GT(hits, 100);
  EXPECT_GT(evictions, 100);
  EXPECT_GT(exhausted, 10);
  EXPECT_GT(rejected, 100);
}

}  // namespace
}  // namespace crl::kv
