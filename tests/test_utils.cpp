#include "tests/test_utils.h"

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "engine/model/model_cache.h"
#include "sync/local_ranks.h"

namespace crl::test {

std::vector<std::string> run_ranks(
    int n, std::chrono::milliseconds timeout,
    const std::function<void(int, std::unique_ptr<sync::Communicator>&, const sync::StorePtr&)>&
        body) {
  return sync::run_local_ranks(n, timeout, body);
}

void expect_tensor_near(const at::Tensor& a, const at::Tensor& b, double atol, double rtol) {
  ASSERT_EQ(a.sizes(), b.sizes());
  auto af = a.to(at::kDouble);
  auto bf = b.to(at::kDouble);
  auto diff = (af - bf).abs();
  auto tol = atol + rtol * bf.abs();
  auto bad = diff > tol;
  if (bad.any().item<bool>()) {
    auto idx = bad.flatten().nonzero()[0].item<int64_t>();
    ADD_FAILURE() << "tensors differ: max |a-b| = " << diff.max().item<double>() << " (atol "
                  << atol << "), first bad flat index " << idx << ": "
                  << af.flatten()[idx].item<double>() << " vs " << bf.flatten()[idx].item<double>();
  }
}

void expect_tensor_equal(const at::Tensor& a, const at::Tensor& b) {
  ASSERT_EQ(a.scalar_type(), b.scalar_type());
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_TRUE(at::equal(a, b))
      << "tensors are not bit-identical: max |a-b| = "
      << (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

std::string tokenizer_fixtures_dir() {
  if (const char* d = std::getenv("CRL_TOKENIZER_FIXTURES"); d && *d) return d;
  return engine::cache_dir() + "/tokenizer-fixtures";
}

const std::string& tokenizer_fixtures_error() {
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string dir = tokenizer_fixtures_dir();
    const std::string log = dir + ".log";
    const std::string cmd = "'" + std::string(CRL_SOURCE_DIR) +
                            "/scripts/tokenizer_fixtures.sh' '" + dir + "' > '" + log + "' 2>&1";
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
      std::ifstream in(log);
      std::stringstream out;
      out << in.rdbuf();
      std::string text = out.str();
      if (text.size() > 4000) text = "..." + text.substr(text.size() - 4000);
      error = "scripts/tokenizer_fixtures.sh " + dir + " failed (exit status " +
              std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : rc) +
              "); it needs node >= 18, npm and, the first time, the npm registry. Output:\n" + text;
    }
  });
  return error;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "crl_test_XXXXXX").string();
  char* p = mkdtemp(tmpl.data());
  if (!p) throw std::runtime_error("mkdtemp failed");
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace crl::test
