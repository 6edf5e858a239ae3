#include "common/units.h"

#include <sys/resource.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace crl {

int64_t parse_bytes(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument("invalid size '" + text +
                                "': expected a number with an optional unit");
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else
    throw std::invalid_argument("invalid size unit in '" + text + "': use B, KiB, MiB or GiB");
  if (!(value >= 0) || !std::isfinite(value))
    throw std::invalid_argument("invalid size '" + text + "'");
  return static_cast<int64_t>(value * mult);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", bytes, units[u]);
  return buf;
}

int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

namespace {
int64_t proc_status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::atoll(line.c_str() + n + 1);
    }
  }
  return 0;
}
}  // namespace

int64_t current_rss_bytes() { return proc_status_kib("VmRSS") * 1024; }
int64_t rss_high_water_bytes() { return proc_status_kib("VmHWM") * 1024; }

bool reset_rss_high_water() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace crl
