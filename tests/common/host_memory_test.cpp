#include "common/host_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace crl {
namespace {

TEST(HostMemoryTest, LargeBuffersAreWritableZerosOfTheAskedShapeAndDtype) {
  // 3 MiB + 12 bytes: not a whole number of huge pages.
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kByte}) {
    const int64_t n = ((int64_t{3} << 20) + 12) / static_cast<int64_t>(c10::elementSize(dtype));
    at::Tensor t =
        zeros_in_huge_pages({n / 4, 4}, at::TensorOptions().dtype(dtype), "a test buffer");
    ASSERT_EQ(t.sizes(), (std::vector<int64_t>{n / 4, 4}));
    EXPECT_EQ(t.scalar_type(), dtype);
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.count_nonzero().item<int64_t>(), 0);
    t.fill_(1);
    EXPECT_EQ(t.sum(at::kDouble).item<double>(), static_cast<double>(t.numel()));
  }
}

TEST(HostMemoryTest, SmallBuffersAreOrdinaryZeros) {
  at::Tensor t =
      zeros_in_huge_pages({16, 3}, at::TensorOptions().dtype(at::kFloat), "a test buffer");
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{16, 3}));
  EXPECT_EQ(t.count_nonzero().item<int64_t>(), 0);
}

TEST(HostMemoryTest, MemoryThatCannotBeHadIsAnErrorNamingTheBufferAndItsSize) {
  // 16 PiB: more than any machine maps.
  try {
    zeros_in_huge_pages({int64_t{1} << 54}, at::TensorOptions().dtype(at::kByte),
                        "the KV cache pool");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the KV cache pool"), std::string::npos) << what;
    EXPECT_NE(what.find("16384.00 TiB"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace crl
