#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Generated models and tokenizers are cached beside the test binary, shared by ctest processes.
  std::string exe = argv[0];
  std::string dir = exe.find('/') == std::string::npos ? "." : exe.substr(0, exe.rfind('/'));
  setenv("CRL_CACHE_DIR", (dir + "/test-cache").c_str(), /*overwrite=*/0);
  // Tests run many ctest processes side by side: keep each one single-threaded unless told
  // otherwise.
  if (!std::getenv("CRL_TEST_THREADS"))
    at::set_num_threads(1);
  else
    at::set_num_threads(std::atoi(std::getenv("CRL_TEST_THREADS")));
  return RUN_ALL_TESTS();
}
