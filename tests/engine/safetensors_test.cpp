#include "engine/model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/test_utils.h"

namespace crl::engine {
namespace {

using nlohmann::json;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Writes a safetensors file by hand: 8-byte little-endian header length, header text, data bytes.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               uint64_t header_len_override = 0) {
  const uint64_t n = header_len_override ? header_len_override : header.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
}

std::string entry(const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

TEST(SafetensorsTest, RoundTripsTensorsOfEveryStoredDtype) {
  test::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const at::Tensor f32 = at::randn({3, 5});
  const at::Tensor bf16 = at::randn({4, 2}).to(at::kBFloat16);
  const at::Tensor f16 = at::randn({7}).to(at::kHalf);
  const at::Tensor i64 = at::arange(6, at::kLong).reshape({2, 3});
  const at::Tensor empty = at::empty({0, 4});
  const at::Tensor scalar = at::full({}, 2.5);
  const at::Tensor strided = at::randn({4, 6}).t();  // non-contiguous input
  write_safetensors(path,
                    {{"z.f32", f32},
                     {"a.bf16", bf16},
                     {"m.f16", f16},
                     {"i64", i64},
                     {"empty", empty},
                     {"scalar", scalar},
                     {"strided", strided}},
                    {{"format", "pt"}});
  // Nothing but the file itself is left in the directory.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);

  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->path(), path);
  EXPECT_EQ(file->tensors().size(), 7u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->tensors().at("a.bf16").dtype, "BF16");
  EXPECT_EQ(file->tensors().at("m.f16").dtype, "F16");
  EXPECT_EQ(file->tensors().at("i64").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(file->contains("empty"));
  EXPECT_FALSE(file->contains("nope"));
  test::expect_tensor_equal(file->load("z.f32", at::kFloat), f32);
  test::expect_tensor_equal(file->load("a.bf16", at::kBFloat16), bf16);
  test::expect_tensor_equal(file->load("m.f16", at::kHalf), f16);
  test::expect_tensor_equal(file->load("i64", at::kLong), i64);
  test::expect_tensor_equal(file->load("empty", at::kFloat), empty);
  test::expect_tensor_equal(file->load("scalar", at::kFloat), scalar);
  test::expect_tensor_equal(file->load("strided", at::kFloat), strided.contiguous());
}

TEST(SafetensorsTest, WritesSortedPaddedHeaderAndRawLittleEndianData) {
  test::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const at::Tensor b = at::arange(5, at::kFloat);
  const at::Tensor a = at::arange(3, at::kInt);
  write_safetensors(path, {{"b", b}, {"a", a}});
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 3 * 4 + 5 * 4);
  const std::string header = bytes.substr(8, n);
  EXPECT_LT(header.find("\"a\""), header.find("\"b\""));
  const json h = json::parse(header);
  EXPECT_FALSE(h.contains("__metadata__"));
  EXPECT_EQ(h["a"]["data_offsets"], json::array({0, 12}));
  EXPECT_EQ(h["b"]["data_offsets"], json::array({12, 32}));
  EXPECT_EQ(h["b"]["dtype"], "F32");
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 12, b.data_ptr(), 20), 0);
  const int32_t expected_a[3] = {0, 1, 2};
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, expected_a, 12), 0);
}

TEST(SafetensorsTest, ConvertsAmongFloatDtypesOnLoad) {
  test::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const at::Tensor x = at::randn({8, 3});
  write_safetensors(path, {{"f32", x}, {"bf16", x.to(at::kBFloat16)}, {"f16", x.to(at::kHalf)}});
  auto file = SafetensorsFile::open(path);
  test::expect_tensor_equal(file->load("bf16", at::kFloat), x.to(at::kBFloat16).to(at::kFloat));
  test::expect_tensor_equal(file->load("f16", at::kFloat), x.to(at::kHalf).to(at::kFloat));
  test::expect_tensor_equal(file->load("f32", at::kBFloat16), x.to(at::kBFloat16));
  test::expect_tensor_equal(file->load("f16", at::kBFloat16), x.to(at::kHalf).to(at::kBFloat16));
}

TEST(SafetensorsTest, LoadsAnElementRangeInRowMajorOrder) {
  test::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const at::Tensor x = at::randn({5, 7});
  write_safetensors(path, {{"x", x}, {"h", x.to(at::kBFloat16)}});
  auto file = SafetensorsFile::open(path);
  test::expect_tensor_equal(file->load_range("x", 9, 13, at::kFloat),
                            x.reshape({-1}).narrow(0, 9, 13));
  test::expect_tensor_equal(file->load_range("h", 30, 5, at::kFloat),
                            x.to(at::kBFloat16).to(at::kFloat).reshape({-1}).narrow(0, 30, 5));
  EXPECT_EQ(file->load_range("x", 35, 0, at::kFloat).numel(), 0);
  ASSERT_THROWS_WITH(file->load_range("x", 30, 6, at::kFloat), std::runtime_error,
                     "elements [30, 36) are outside its 35");
  ASSERT_THROWS_WITH(file->load_range("x", -1, 2, at::kFloat), std::runtime_error, "tensor 'x'");
  ASSERT_THROWS_WITH(file->load_range("nope", 0, 1, at::kFloat), std::runtime_error,
                     "tensor 'nope'");
}

TEST(SafetensorsTest, LoadsTensorsAtUnalignedOffsets) {
  test::TempDir dir;
  const std::string path = dir.file("odd.safetensors");
  const float values[3] = {1.5f, -2.25f, 1e-3f};
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  // A 1-byte tensor first and a header padded to a multiple of 4: the F32 data sits at an address
  // that is 1 mod 4.
  std::string header =
      "{\"b\":" + entry("U8", "[1]", 0, 1) + ",\"f\":" + entry("F32", "[3]", 1, 13) + "}";
  while (header.size() % 4 != 0) header += ' ';
  write_raw(path, header, data);
  auto file = SafetensorsFile::open(path);
  const at::Tensor expected = at::tensor({1.5f, -2.25f, 1e-3f});
  test::expect_tensor_equal(file->load("f", at::kFloat), expected);
  test::expect_tensor_equal(file->load("f", at::kHalf), expected.to(at::kHalf));
  EXPECT_EQ(file->load("b", at::kByte).item<uint8_t>(), 7);
}

TEST(SafetensorsTest, RefusesConversionsOutsideFloatTypesAndMissingTensors) {
  test::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  write_safetensors(path, {{"ids", at::arange(4, at::kLong)}, {"w", at::ones({2})}});
  auto file = SafetensorsFile::open(path);
  ASSERT_THROWS_WITH(file->load("ids", at::kFloat), std::runtime_error, "tensor 'ids'");
  ASSERT_THROWS_WITH(file->load("ids", at::kFloat), std::runtime_error, "I64");
  ASSERT_THROWS_WITH(file->load("w", at::kLong), std::runtime_error, path);
  ASSERT_THROWS_WITH(file->load("nope", at::kFloat), std::runtime_error, "tensor 'nope'");
  ASSERT_THROWS_WITH(write_safetensors(path, {{"a", at::ones({1})}, {"a", at::ones({1})}}),
                     std::runtime_error, "duplicate");
}

TEST(SafetensorsTest, RejectsTruncatedFiles) {
  test::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  write_safetensors(path, {{"a", at::ones({16})}, {"b", at::ones({16})}});
  const std::string bytes = read_bytes(path);

  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 10);
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "tensor 'b'");
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "truncated");

  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, 40);  // inside header
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "exceeds the file size");

  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, 5);
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "too small");
  std::ofstream(path, std::ios::binary | std::ios::trunc);
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, path);

  ASSERT_THROWS_WITH(SafetensorsFile::open(dir.file("absent")), std::runtime_error, "absent");
}

TEST(SafetensorsTest, RejectsCorruptHeaders) {
  test::TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_raw(path, "{\"a\": {\"dtype\": ", "");
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "not valid JSON");
  write_raw(path, "\x01\x02garbage\xff", "");
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, path);
  write_raw(path, "[1, 2, 3]", "");
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "not a JSON object");
  write_raw(path, "{}", "", uint64_t{1} << 62);
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "100 MB");
  write_raw(path, "{}", "", ~uint64_t{0});
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "100 MB");
  write_raw(path, "{\"__metadata__\": {\"n\": 3}}", "");
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "__metadata__");
  write_raw(path, "{\"__metadata__\": {\"k\": \"v\"}}  ", "");
  EXPECT_EQ(SafetensorsFile::open(path)->metadata().at("k"), "v");
}

TEST(SafetensorsTest, RejectsBadTensorEntriesNamingFileAndTensor) {
  test::TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const std::string data(64, '\0');
  struct Case {
    std::string tensor_json;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"{\"dtype\":\"F32\",\"shape\":[2]}", "missing key 'data_offsets'"},
      {"{\"shape\":[2],\"data_offsets\":[0,8]}", "missing key 'dtype'"},
      {"[1]", "not an object"},
      {entry("F8_E9M9", "[2]", 0, 8), "unknown dtype 'F8_E9M9'"},
      {"{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}", "'dtype' is not a string"},
      {entry("F32", "[-2]", 0, 8), "shape dimension -2"},
      {entry("F32", "[2.5]", 0, 8), "shape dimension 2.5"},
      {entry("F32", "{}", 0, 8), "'shape' is not an array"},
      {entry("F32", "[4294967296, 4294967296]", 0, 8), "overflows"},
      {entry("F32", "[2]", 8, 0), "begin 8 > end 0"},
      {entry("F32", "[32]", 0, 128), "beyond the data region"},
      {entry("F32", "[3]", 0, 8), "holds 8 bytes but F32 shape needs 12"},
      {"{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}", "'data_offsets' must be"},
      {"{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}", "'data_offsets' must be"},
      {entry("F32", "[2]", 0, 18446744073709551615ull), "beyond the data region"},
  };
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.tensor_json);
    write_raw(path, "{\"layer.w\":" + tc.tensor_json + "}", data);
    ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, tc.expected);
    ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error,
                       "safetensors file " + path + ": tensor 'layer.w'");
  }
}

TEST(SafetensorsTest, RejectsOverlappingRanges) {
  test::TempDir dir;
  const std::string path = dir.file("overlap.safetensors");
  write_raw(path,
            "{\"a\":" + entry("F32", "[4]", 0, 16) + ",\"b\":" + entry("F32", "[2]", 12, 20) +
                ",\"e\":" + entry("F32", "[0]", 4, 4) + "}",
            std::string(20, '\0'));
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "tensor 'b'");
  ASSERT_THROWS_WITH(SafetensorsFile::open(path), std::runtime_error, "overlaps tensor 'a'");
  // Adjacent ranges and an empty tensor inside another's range are fine.
  write_raw(path,
            "{\"a\":" + entry("F32", "[4]", 0, 16) + ",\"b\":" + entry("F32", "[1]", 16, 20) +
                ",\"e\":" + entry("F32", "[0]", 4, 4) + "}",
            std::string(20, '\0'));
  EXPECT_EQ(SafetensorsFile::open(path)->tensors().size(), 3u);
}

}  // namespace
}  // namespace crl::engine
