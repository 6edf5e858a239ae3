// TensorBoard event files (`events.out.tfevents.*`) written without TensorFlow: the TFRecord
// framing (length, masked CRC-32C of the length, data, masked CRC-32C of the data) around `Event`
// protobufs encoded here by hand (wall_time, step, file_version, and a Summary of simple_value
// scalars). TensorBoard, tbparse and `wandb sync` read them.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace crl {

// CRC-32C (Castagnoli) of `n` bytes, and the masked form TFRecord stores.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

class TfEventsWriter {
 public:
  // Creates `dir` when missing and a new event file in it, named as TensorFlow names them
  // (`events.out.tfevents.<seconds>.<host>.<pid>.0`); throws std::runtime_error naming the path
  // when it cannot.
  explicit TfEventsWriter(const std::string& dir);
  // One scalar at `step` (written as a float, as TensorBoard's simple_value).
  void scalar(const std::string& tag, int64_t step, double value);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

}  // namespace crl
