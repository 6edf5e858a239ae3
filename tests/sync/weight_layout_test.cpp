#include "sync/weight_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/test_utils.h"

namespace crl::sync {
namespace {

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// The byte image of a tensor (made contiguous), read through its own data pointer.
std::vector<uint8_t> bytes_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// A small Llama-shaped spec list: embeddings, per layer q/k/v/o and gate/up/down, norms, lm_head.
std::vector<TensorSpec> llama_specs(at::ScalarType dtype, int layers = 2) {
  const int64_t h = 64, kv = 32, ffn = 128, vocab = 100;
  std::vector<TensorSpec> s{{"model.embed_tokens.weight", {vocab, h}, dtype}};
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    s.push_back({p + "input_layernorm.weight", {h}, dtype});
    s.push_back({p + "self_attn.q_proj.weight", {h, h}, dtype});
    s.push_back({p + "self_attn.k_proj.weight", {kv, h}, dtype});
    s.push_back({p + "self_attn.v_proj.weight", {kv, h}, dtype});
    s.push_back({p + "self_attn.o_proj.weight", {h, h}, dtype});
    s.push_back({p + "post_attention_layernorm.weight", {h}, dtype});
    s.push_back({p + "mlp.gate_proj.weight", {ffn, h}, dtype});
    s.push_back({p + "mlp.up_proj.weight", {ffn, h}, dtype});
    s.push_back({p + "mlp.down_proj.weight", {h, ffn}, dtype});
  }
  s.push_back({"model.norm.weight", {h}, dtype});
  s.push_back({"lm_head.weight", {vocab, h}, dtype});
  return s;
}

// Random specs with odd sizes and mixed dtypes (so raw ends are rarely aligned).
std::vector<TensorSpec> random_specs(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  const at::ScalarType dtypes[] = {at::kFloat, at::kBFloat16, at::kHalf, at::kChar, at::kDouble};
  std::vector<TensorSpec> s;
  for (int i = 0; i < n; ++i) {
    std::vector<int64_t> shape{1 + static_cast<int64_t>(rng() % 40)};
    if (rng() % 2) shape.push_back(1 + static_cast<int64_t>(rng() % 50));
    s.push_back({"t" + std::to_string(i), shape, dtypes[rng() % 5]});
  }
  return s;
}

// Checks the structural contract of a plan against the specs, independently of the planner.
void expect_valid_plan(const WeightLayout& l, int64_t cap, int64_t align) {
  int64_t next_tensor = 0, total = 0;
  for (size_t bi = 0; bi < l.buckets().size(); ++bi) {
    const Bucket& b = l.buckets()[bi];
    EXPECT_EQ(b.index, static_cast<int64_t>(bi));
    ASSERT_FALSE(b.entries.empty());
    int64_t end = 0;
    for (const BucketEntry& e : b.entries) {
      EXPECT_EQ(e.tensor, next_tensor++) << "entries must follow spec order";
      EXPECT_EQ(e.offset % align, 0) << "tensor " << e.tensor;
      EXPECT_GE(e.offset, end) << "tensor " << e.tensor << " overlaps its predecessor";
      EXPECT_EQ(e.nbytes, l.specs()[e.tensor].nbytes());
      end = e.offset + e.nbytes;
    }
    EXPECT_EQ(b.nbytes, round_up(end, align));
    if (b.entries.size() > 1) EXPECT_LE(b.nbytes, cap) << "bucket " << bi;
    // Greedy packing: the next bucket's first tensor did not fit into this one.
    if (bi + 1 < l.buckets().size()) {
      EXPECT_GT(round_up(b.nbytes + l.buckets()[bi + 1].entries[0].nbytes, align), cap);
    }
    total += b.nbytes;
  }
  EXPECT_EQ(next_tensor, static_cast<int64_t>(l.specs().size()));
  EXPECT_EQ(l.total_bytes(), total);
}

TEST(WeightLayoutTest, PacksTensorsInOrderWithoutExceedingTheCap) {
  // 400 B, 200 B, 256 B, 40 B under a 1024 B cap with 256 B alignment (offsets worked out by hand).
  WeightLayout l = WeightLayout::plan({{"a", {100}, at::kFloat},
                                       {"b", {50}, at::kFloat},
                                       {"c", {8, 8}, at::kFloat},
                                       {"d", {20}, at::kBFloat16}},
                                      1024, 256);
  ASSERT_EQ(l.buckets().size(), 2u);
  const auto& b0 = l.buckets()[0].entries;
  ASSERT_EQ(b0.size(), 3u);
  EXPECT_EQ(b0[0].offset, 0);
  EXPECT_EQ(b0[1].offset, 512);
  EXPECT_EQ(b0[2].offset, 768);
  EXPECT_EQ(l.buckets()[0].nbytes, 1024);
  ASSERT_EQ(l.buckets()[1].entries.size(), 1u);
  EXPECT_EQ(l.buckets()[1].entries[0].tensor, 3);
  EXPECT_EQ(l.buckets()[1].nbytes, 256);
  EXPECT_EQ(l.total_bytes(), 1280);
  EXPECT_EQ(l.bucket_bytes(), 1024);
  EXPECT_EQ(l.max_bucket_nbytes(), 1024);

  for (int64_t cap : {1000, 4096, 20000}) {
    SCOPED_TRACE(cap);
    expect_valid_plan(WeightLayout::plan(random_specs(7, 60), cap, 64), cap, 64);
  }
}

TEST(WeightLayoutTest, GivesAnOversizeTensorABucketOfItsOwn) {
  WeightLayout l = WeightLayout::plan({{"big0", {600}, at::kFloat},
                                       {"s1", {10}, at::kFloat},
                                       {"big2", {1000, 2}, at::kHalf},
                                       {"s3", {10}, at::kFloat},
                                       {"s4", {10}, at::kFloat}},
                                      1024, 256);
  ASSERT_EQ(l.buckets().size(), 4u);
  std::vector<std::vector<int64_t>> tensors;
  for (const Bucket& b : l.buckets()) {
    tensors.emplace_back();
    for (const BucketEntry& e : b.entries) tensors.back().push_back(e.tensor);
  }
  EXPECT_EQ(tensors, (std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {3, 4}}));
  EXPECT_EQ(l.buckets()[0].nbytes, 2560);
  EXPECT_EQ(l.buckets()[2].nbytes, 4096);
  EXPECT_EQ(l.max_bucket_nbytes(), 4096);
}

// A streamed send's runs: consecutive buckets, in order, every bucket once, none over the cap
// unless it is one bucket alone, each as long as the cap allows.
TEST(WeightLayoutTest, ChunksAreConsecutiveRunsOfBucketsUpToTheCap) {
  auto layout = WeightLayout::plan(llama_specs(at::kFloat, 4), 40000);
  const auto& buckets = layout.buckets();
  const auto n = static_cast<int64_t>(buckets.size());
  ASSERT_GE(n, 6);
  for (int64_t cap : {int64_t{1}, int64_t{40000}, int64_t{90000}, int64_t{250000}}) {
    SCOPED_TRACE(cap);
    auto runs = layout.chunks(cap);
    ASSERT_FALSE(runs.empty());
    int64_t next = 0;
    for (size_t r = 0; r < runs.size(); ++r) {
      const auto [first, end] = runs[r];
      EXPECT_EQ(first, next);
      ASSERT_LT(first, end);
      int64_t bytes = 0;
      for (int64_t b = first; b < end; ++b) bytes += buckets[b].nbytes;
      if (end - first > 1) EXPECT_LE(bytes, cap);
      // Greedy: the next run's first bucket would not have fit into this one.
      if (end < n) EXPECT_GT(bytes + buckets[end].nbytes, cap);
      next = end;
    }
    EXPECT_EQ(next, n);
  }
  EXPECT_EQ(layout.chunks(1).size(), static_cast<size_t>(n));  // each bucket alone
  for (int64_t whole : {int64_t{0}, int64_t{-1}, layout.total_bytes()}) {
    ASSERT_EQ(layout.chunks(whole).size(), 1u);
    EXPECT_EQ(layout.chunks(whole)[0], std::make_pair(int64_t{0}, n));
  }
}

TEST(WeightLayoutTest, AlignsOffsetsWithoutOverlap) {
  for (int64_t align : {1, 64, 256, 4096}) {
    SCOPED_TRACE(align);
    expect_valid_plan(WeightLayout::plan(random_specs(11, 80), 8192, align), 8192, align);
  }
  // A scalar and an empty tensor still get aligned, non-overlapping slots.
  WeightLayout l = WeightLayout::plan({{"x", {3}, at::kBFloat16},
                                       {"scalar", {}, at::kFloat},
                                       {"empty", {0, 4}, at::kFloat},
                                       {"y", {5}, at::kFloat}},
                                      1 << 20, 256);
  expect_valid_plan(l, 1 << 20, 256);
  EXPECT_EQ(l.buckets()[0].entries[1].offset, 256);
  EXPECT_EQ(l.buckets()[0].entries[1].nbytes, 4);
}

TEST(WeightLayoutTest, PlansDeterministicallyAndHashesEveryInput) {
  const auto specs = llama_specs(at::kBFloat16);
  WeightLayout a = WeightLayout::plan(specs, 16384);
  WeightLayout b = WeightLayout::plan(specs, 16384);
  EXPECT_EQ(a.hash(), b.hash());
  ASSERT_EQ(a.buckets().size(), b.buckets().size());
  EXPECT_GT(a.buckets().size(), 1u);
  for (size_t i = 0; i < a.buckets().size(); ++i) {
    ASSERT_EQ(a.buckets()[i].entries.size(), b.buckets()[i].entries.size());
    for (size_t j = 0; j < a.buckets()[i].entries.size(); ++j) {
      EXPECT_EQ(a.buckets()[i].entries[j].offset, b.buckets()[i].entries[j].offset);
    }
  }

  auto renamed = specs, reshaped = specs, retyped = specs;
  renamed[3].name = "model.layers.0.self_attn.k_proj.bias";
  reshaped[2].shape = {32, 128};  // same byte count, different shape
  retyped[2].dtype = at::kHalf;   // same element size, different dtype
  EXPECT_NE(WeightLayout::plan(renamed, 16384).hash(), a.hash());
  EXPECT_NE(WeightLayout::plan(reshaped, 16384).hash(), a.hash());
  EXPECT_NE(WeightLayout::plan(retyped, 16384).hash(), a.hash());
  EXPECT_NE(WeightLayout::plan(specs, 16384 + 256).hash(), a.hash());
  EXPECT_NE(WeightLayout::plan(specs, 16384, 512).hash(), a.hash());
}

TEST(WeightLayoutTest, FirstDifferenceNamesTheTensor) {
  const auto specs = llama_specs(at::kBFloat16);
  WeightLayout a = WeightLayout::plan(specs, 16384);
  EXPECT_EQ(a.first_difference(WeightLayout::plan(specs, 16384)), std::nullopt);

  auto other = specs;
  size_t idx = 0;
  while (other[idx].name != "model.layers.1.mlp.up_proj.weight") ++idx;
  other[idx].shape = {128, 32};
  auto msg = a.first_difference(WeightLayout::plan(other, 16384));
  ASSERT_TRUE(msg.has_value());
  for (const std::string& part :
       {std::to_string(idx), std::string("model.layers.1.mlp.up_proj.weight"),
        std::string("[128, 64]"), std::string("[128, 32]"), std::string("BFloat16")}) {
    EXPECT_NE(msg->find(part), std::string::npos) << "missing '" << part << "' in: " << *msg;
  }

  other = specs;
  other[5].dtype = at::kFloat;
  msg = a.first_difference(WeightLayout::plan(other, 16384));
  ASSERT_TRUE(msg.has_value());
  EXPECT_NE(msg->find(specs[5].name), std::string::npos) << *msg;
  EXPECT_NE(msg->find("] Float"), std::string::npos) << *msg;

  other = specs;
  other.pop_back();
  msg = a.first_difference(WeightLayout::plan(other, 16384));
  ASSERT_TRUE(msg.has_value());
  EXPECT_NE(msg->find("count"), std::string::npos) << *msg;
  EXPECT_NE(msg->find("lm_head.weight"), std::string::npos) << *msg;

  msg = a.first_difference(WeightLayout::plan(specs, 32768));
  ASSERT_TRUE(msg.has_value());
  EXPECT_NE(msg->find("bucket size"), std::string::npos) << *msg;
  msg = a.first_difference(WeightLayout::plan(specs, 16384, 128));
  ASSERT_TRUE(msg.has_value());
  EXPECT_NE(msg->find("alignment"), std::string::npos) << *msg;
}

TEST(WeightLayoutTest, ViewsAliasTheBucketsBothWays) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    WeightLayout l = WeightLayout::plan(llama_specs(dtype), 8000, 256);
    std::vector<at::Tensor> buckets = l.allocate_buckets(at::TensorOptions());
    ASSERT_EQ(buckets.size(), l.buckets().size());
    std::vector<at::Tensor> views = l.views(buckets);
    ASSERT_EQ(views.size(), l.specs().size());

    // View -> bucket: write each view, then rebuild every bucket's expected bytes independently.
    at::manual_seed(1);
    std::vector<at::Tensor> values;
    for (size_t i = 0; i < views.size(); ++i) {
      EXPECT_EQ(views[i].scalar_type(), dtype);
      EXPECT_EQ(views[i].sizes(), at::IntArrayRef(l.specs()[i].shape));
      values.push_back(at::randn(l.specs()[i].shape).to(dtype));
      views[i].copy_(values[i]);
    }
    for (const Bucket& b : l.buckets()) {
      std::vector<uint8_t> expected(b.nbytes, 0);  // padding stays zero
      for (const BucketEntry& e : b.entries) {
        std::vector<uint8_t> src = bytes_of(values[e.tensor]);
        std::memcpy(expected.data() + e.offset, src.data(), src.size());
        EXPECT_EQ(
            views[e.tensor].data_ptr(),
            static_cast<void*>(static_cast<uint8_t*>(buckets[b.index].data_ptr()) + e.offset));
      }
      EXPECT_EQ(bytes_of(buckets[b.index]), expected) << "bucket " << b.index;
    }

    // Bucket -> view: write fresh bytes into the buckets; the views (read through a clone) see
    // them.
    for (const Bucket& b : l.buckets()) {
      for (const BucketEntry& e : b.entries) {
        values[e.tensor] = at::randn(l.specs()[e.tensor].shape).to(dtype);
        std::vector<uint8_t> src = bytes_of(values[e.tensor]);
        std::memcpy(static_cast<uint8_t*>(buckets[b.index].data_ptr()) + e.offset, src.data(),
                    src.size());
      }
    }
    buckets.clear();  // the views keep the storage alive
    for (size_t i = 0; i < views.size(); ++i)
      test::expect_tensor_equal(views[i].clone(), values[i]);
  }
}

TEST(WeightLayoutTest, PackThenViewsRoundTripsBitExactly) {
  // Engine weights are bf16 except the norms (fp32), plus a scalar and an empty tensor.
  std::vector<TensorSpec> specs = llama_specs(at::kBFloat16);
  for (TensorSpec& s : specs) {
    if (s.name.find("norm") != std::string::npos) s.dtype = at::kFloat;
  }
  specs.push_back({"scale", {}, at::kFloat});
  specs.push_back({"empty", {0, 8}, at::kBFloat16});
  WeightLayout l = WeightLayout::plan(specs, 12000, 256);
  ASSERT_GT(l.buckets().size(), 2u);

  // Trainer side: fp32 masters, one given as a non-contiguous (transposed) tensor.
  at::manual_seed(2);
  std::vector<at::Tensor> masters;
  for (const TensorSpec& s : specs) masters.push_back(at::randn(s.shape));
  masters[2] = at::randn({masters[2].size(1), masters[2].size(0)}).t();

  // One reused send buffer full of garbage; each bucket is "broadcast" by copying its prefix.
  at::Tensor send = at::full({l.max_bucket_nbytes()}, 0xAB, at::kByte);
  std::vector<at::Tensor> received = l.allocate_buckets(at::TensorOptions());
  for (auto& r : received) r.fill_(0xCD);
  for (const Bucket& b : l.buckets()) {
    // Only this bucket's tensors are read: leave every other one undefined.
    std::vector<at::Tensor> only(masters.size());
    for (const BucketEntry& e : b.entries) only[e.tensor] = masters[e.tensor];
    l.pack(only, b.index, send);
    received[b.index].copy_(send.narrow(0, 0, b.nbytes));
  }
  std::vector<at::Tensor> views = l.views(received);
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(specs[i].name);
    test::expect_tensor_equal(views[i], masters[i].to(specs[i].dtype));
  }
  // Padding was zeroed by pack(), not left as the send buffer's garbage.
  for (const Bucket& b : l.buckets()) {
    std::vector<uint8_t> bytes = bytes_of(received[b.index]);
    int64_t end = 0;
    for (const BucketEntry& e : b.entries) {
      for (int64_t k = end; k < e.offset; ++k) ASSERT_EQ(bytes[k], 0) << "bucket " << b.index;
      end = e.offset + e.nbytes;
    }
    for (int64_t k = end; k < b.nbytes; ++k) ASSERT_EQ(bytes[k], 0) << "bucket " << b.index;
  }
}

// On a GPU pack() batches each bucket's copies and casts (one ATen multi-tensor kernel per dtype
// pair, one for the gaps); its bytes must be the CPU pack's, padding included.
TEST(CudaWeightLayoutTest, GpuPackWritesTheCpuPacksBytes) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  std::vector<TensorSpec> specs = llama_specs(at::kBFloat16, 3);
  for (TensorSpec& s : specs) {
    if (s.name.find("post_attention_layernorm") != std::string::npos) s.dtype = at::kFloat;
  }
  specs.push_back({"scale", {}, at::kFloat});
  specs.push_back({"empty", {0, 8}, at::kBFloat16});
  WeightLayout l = WeightLayout::plan(specs, 40000, 256);
  ASSERT_GT(l.buckets().size(), 1u);
  at::manual_seed(3);
  std::vector<at::Tensor> cpu, gpu;
  for (const TensorSpec& s : specs) cpu.push_back(at::randn(s.shape));
  cpu[3] = at::randn({cpu[3].size(1), cpu[3].size(0)}).t();  // a strided source
  cpu[5] = cpu[5].to(at::kBFloat16);                         // a bf16 source among fp32 ones
  for (const at::Tensor& t : cpu) gpu.push_back(t.to(at::kCUDA));
  at::Tensor on_cpu = at::full({l.max_bucket_nbytes()}, 0xAB, at::kByte);
  at::Tensor on_gpu = on_cpu.to(at::kCUDA);
  for (const Bucket& b : l.buckets()) {
    SCOPED_TRACE("bucket " + std::to_string(b.index));
    l.pack(cpu, b.index, on_cpu);
    l.pack(gpu, b.index, on_gpu);
    EXPECT_EQ(bytes_of(on_gpu.narrow(0, 0, b.nbytes).cpu()),
              bytes_of(on_cpu.narrow(0, 0, b.nbytes)));
  }
}

TEST(WeightLayoutTest, RejectsBadInputs) {
  const std::vector<TensorSpec> ok{{"a", {4}, at::kFloat}, {"b", {2, 2}, at::kFloat}};
  ASSERT_THROWS_WITH(WeightLayout::plan(ok, 0), std::invalid_argument, "bucket_bytes");
  ASSERT_THROWS_WITH(WeightLayout::plan(ok, -5), std::invalid_argument, "bucket_bytes");
  for (int64_t bad : {0, 3, 100, -256}) {
    ASSERT_THROWS_WITH(WeightLayout::plan(ok, 1024, bad), std::invalid_argument, "power of two");
  }
  ASSERT_THROWS_WITH(WeightLayout::plan({{"a", {4}, at::kFloat}, {"a", {4}, at::kFloat}}, 1024),
                     std::invalid_argument, "duplicate tensor name 'a'");
  ASSERT_THROWS_WITH(WeightLayout::plan({{"a", {4, -1}, at::kFloat}}, 1024), std::invalid_argument,
                     "negative dim");
  ASSERT_THROWS_WITH(WeightLayout::plan({{"", {4}, at::kFloat}}, 1024), std::invalid_argument,
                     "empty name");

  WeightLayout l = WeightLayout::plan(ok, 1024);
  std::vector<at::Tensor> buckets = l.allocate_buckets(at::TensorOptions());
  ASSERT_THROWS_WITH(l.views({}), std::invalid_argument, "expected 1 bucket");
  ASSERT_THROWS_WITH(l.views({at::zeros({512}, at::kFloat)}), std::invalid_argument, "uint8");
  ASSERT_THROWS_WITH(l.views({at::zeros({256}, at::kByte)}), std::invalid_argument, "512");
  ASSERT_THROWS_WITH(l.views({at::zeros({1024}, at::kByte).narrow(0, 4, 512)}),
                     std::invalid_argument, "aligned");

  std::vector<at::Tensor> tensors{at::ones({4}), at::ones({2, 2})};
  at::Tensor dst = at::zeros({512}, at::kByte);
  ASSERT_THROWS_WITH(l.pack(tensors, 1, dst), std::invalid_argument, "out of range");
  ASSERT_THROWS_WITH(l.pack({tensors[0]}, 0, dst), std::invalid_argument, "expected 2 tensors");
  ASSERT_THROWS_WITH(l.pack({tensors[0], at::ones({4})}, 0, dst), std::invalid_argument,
                     "b [2, 2] Float");
  at::Tensor small = at::zeros({300}, at::kByte);
  ASSERT_THROWS_WITH(l.pack(tensors, 0, small), std::invalid_argument, "at least 512 bytes");
}

}  // namespace
}  // namespace crl::sync
