// Error helpers shared by every module (STYLE.md §8).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace crl {

// An invariant or programmer error: thrown by CRL_CHECK with file:line.
class CheckError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace crl

// CRL_CHECK(cond, parts...): throws crl::CheckError("file:line: parts...") when cond is false.
#define CRL_CHECK(cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      throw ::crl::CheckError(::crl::detail::str_cat(__FILE__, ":", __LINE__, ": ",                \
                                                     "check failed: " #cond ": ", ##__VA_ARGS__)); \
    }                                                                                              \
  } while (0)

// CRL_INVALID(parts...): bad user input; throws std::invalid_argument with the message only.
#define CRL_INVALID(...) throw std::invalid_argument(::crl::detail::str_cat(__VA_ARGS__))
