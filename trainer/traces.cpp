#include "trainer/traces.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/hash.h"

namespace crl::trainer {

TraceWriter::TraceWriter(const TraceOptions& o, const text::Tokenizer& tokenizer)
    : o_(o), tokenizer_(tokenizer) {
  if (!(o_.rate > 0 && o_.rate <= 1)) {
    throw std::invalid_argument("--trace-rate must be in (0, 1], got " + std::to_string(o_.rate));
  }
  fd_ = ::open(o_.path.c_str(),
               O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (o_.truncate ? O_TRUNC : 0), 0644);
  if (fd_ < 0) {
    throw std::runtime_error("cannot open the traces file " + o_.path + ": " +
                             std::strerror(errno));
  }
}

TraceWriter::~TraceWriter() {
  if (fd_ >= 0) ::close(fd_);
}

bool TraceWriter::traced(int64_t step, int64_t prompt_index) const {
  if (o_.rate >= 1) return true;
  const uint64_t h = mix64(mix64(mix64(o_.seed) ^ static_cast<uint64_t>(step)) ^
                           static_cast<uint64_t>(prompt_index));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < o_.rate;
}

void TraceWriter::write(int64_t step, int infer_rank, const SampleGroup& group, bool dropped) {
  const int64_t group_id = groups_++;
  if (!traced(step, group.prompt_index)) return;
  std::string lines;
  for (size_t i = 0; i < group.samples.size(); ++i) {
    const Sample& s = group.samples[i];
    const std::vector<int32_t>& prompt = s.prompt_ids.empty() ? group.prompt_ids : s.prompt_ids;
    nlohmann::ordered_json j = {{"step", step},
                                {"infer_rank", infer_rank},
                                {"group", group_id},
                                {"prompt_index", group.prompt_index},
                                {"sample", i},
                                {"dropped", dropped},
                                {"reward", s.reward},
                                {"advantage", dropped ? 0.0 : s.advantage},
                                {"prompt", tokenizer_.decode(prompt, false)},
                                {"completion", tokenizer_.decode(s.completion_ids, false)},
                                {"prompt_ids", prompt},
                                {"completion_ids", s.completion_ids},
                                {"logprobs", s.logprobs},
                                {"versions", s.versions}};
    if (!s.loss_mask.empty()) j["loss_mask"] = s.loss_mask;
    // Invalid UTF-8 in a decoded piece (a token cut inside a character) becomes U+FFFD.
    lines += j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    lines += '\n';
  }
  // One write for the group: O_APPEND places it whole, after any other rank's (a short write's
  // rest follows in another).
  const char* p = lines.data();
  size_t left = lines.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw std::runtime_error("cannot write the traces file " + o_.path + ": " +
                               std::strerror(errno));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  lines_ += static_cast<int64_t>(group.samples.size());
}

}  // namespace crl::trainer
