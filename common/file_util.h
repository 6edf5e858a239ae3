// Small file helpers shared by the modules that write model directories.
#pragma once

#include <string>

namespace crl {

// Replaces `path` with `bytes` atomically: a temp file in the same directory, fsync, rename.
// Throws std::runtime_error naming the path and the OS error.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace crl
