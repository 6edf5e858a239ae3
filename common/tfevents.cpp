#include "common/tfevents.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace crl {

namespace {

std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected poly
    t[i] = c;
  }
  return t;
}

// Protobuf wire format, the few pieces an Event needs.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_double(std::string& out, int field, double v) {
  put_tag(out, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);  // little-endian, as x86-64 and aarch64 store it
  out.append(b, 8);
}
void put_float(std::string& out, int field, float v) {
  put_tag(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}
void put_u32_le(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event fields (tensorflow/core/util/event.proto): 1 wall_time, 2 step, 3 file_version,
// 5 summary. Summary: 1 value (repeated). Summary.Value: 1 tag, 2 simple_value.
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_double(e, 1, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TfEventsWriter::TfEventsWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error("cannot create the TensorBoard directory " + dir + ": " +
                             ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const auto seconds = static_cast<int64_t>(now_s());
  path_ = dir + "/events.out.tfevents." + std::to_string(seconds) + "." + host + "." +
          std::to_string(getpid()) + ".0";
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw std::runtime_error("cannot write the TensorBoard event file " + path_);
  std::string first = event_head(now_s(), 0);
  put_bytes(first, 3, "brain.Event:2");
  write_event(first);
  flush();
}

void TfEventsWriter::scalar(const std::string& tag, int64_t step, double value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_float(v, 2, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event_head(now_s(), step);
  put_bytes(e, 5, summary);
  write_event(e);
}

void TfEventsWriter::flush() { out_.flush(); }

void TfEventsWriter::write_event(const std::string& event) {
  std::string rec;
  std::string len;
  const uint64_t n = event.size();
  for (int i = 0; i < 8; ++i) len.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  rec += len;
  put_u32_le(rec, masked_crc32c(len.data(), len.size()));
  rec += event;
  put_u32_le(rec, masked_crc32c(event.data(), event.size()));
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  if (!out_) throw std::runtime_error("cannot write the TensorBoard event file " + path_);
}

}  // namespace crl
