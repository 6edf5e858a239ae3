// Units: human-readable sizes for flags such as --kv-memory, memory and time measurements.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace crl {

// Parses "512MiB", "1GiB", "2G", "300M", "4096" (bytes). Throws std::invalid_argument naming the
// text.
int64_t parse_bytes(const std::string& text);

// "1.50 GiB" style rendering for logs.
std::string format_bytes(double bytes);

// Seconds from `t0` to now (steady clock), for timing phases.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Peak resident set size of this process in bytes (getrusage).
int64_t peak_rss_bytes();

// Current and high-water resident set size from /proc/self/status (VmRSS, VmHWM); 0 when unknown.
int64_t current_rss_bytes();
int64_t rss_high_water_bytes();
// Resets the high-water mark to the current RSS (/proc/self/clear_refs "5"), so the peak of one
// phase can be measured; false where the kernel does not allow it.
bool reset_rss_high_water();

}  // namespace crl
