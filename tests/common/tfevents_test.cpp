#include "common/tfevents.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace crl {
namespace {

// CRC-32C's check value (RFC 3720, B.4): "123456789" -> 0xE3069283; 32 zero bytes -> 0x8A9136AA.
TEST(TfEventsTest, Crc32cMatchesTheStandardCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

// The file is a sequence of TFRecords whose lengths and CRCs check out, the first holding the
// file_version, one more per scalar, the tag and the float value inside it.
TEST(TfEventsTest, RecordsAreFramedAndCarryTheTagAndValue) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("crl-tfevents-" + std::to_string(getpid())))
          .string();
  std::string path;
  {
    TfEventsWriter w(dir);
    path = w.path();
    EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos);
    w.scalar("grpo/reward_mean", 3, 0.75);
    w.scalar("eval/held_out_accuracy", 10, 1.0);
  }
  std::ifstream in(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, data.data() + at, 4);
    return v;
  };
  std::vector<std::string> events;
  for (size_t at = 0; at < data.size();) {
    ASSERT_LE(at + 12, data.size());
    uint64_t n;
    std::memcpy(&n, data.data() + at, 8);
    EXPECT_EQ(u32(at + 8), masked_crc32c(data.data() + at, 8));
    ASSERT_LE(at + 12 + n + 4, data.size());
    EXPECT_EQ(u32(at + 12 + n), masked_crc32c(data.data() + at + 12, n));
    events.emplace_back(data.substr(at + 12, n));
    at += 12 + n + 4;
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_NE(events[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(events[1].find("grpo/reward_mean"), std::string::npos);
  const float v = 0.75f;
  char b[5] = {0x15};  // Summary.Value.simple_value: field 2, 32-bit
  std::memcpy(b + 1, &v, 4);
  EXPECT_NE(events[1].find(std::string(b, 5)), std::string::npos);
  EXPECT_NE(events[2].find("eval/held_out_accuracy"), std::string::npos);
}

}  // namespace
}  // namespace crl
