#include "tests/test_utils.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "sync/gloo_communicator.h"

namespace crl::test {

std::vector<std::string> run_ranks(
    int n, std::chrono::milliseconds timeout,
    const std::function<void(int, std::unique_ptr<sync::Communicator>&, const sync::StorePtr&)>& body) {
  static std::atomic<int> job{0};
  std::string prefix = "job" + std::to_string(job++);
  sync::StorePtr server = sync::host_store(0, timeout);
  int port = sync::store_port(server);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        sync::StorePtr store = sync::connect_store("127.0.0.1", port, timeout);
        sync::GroupInfo info;
        info.name = "world";
        info.rank = r;
        info.timeout = timeout;
        for (int i = 0; i < n; ++i) info.world_ranks.push_back(i);
        auto comm = sync::make_gloo_communicator(store, prefix, info, "127.0.0.1");
        body(r, comm, store);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
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
    ADD_FAILURE() << "tensors differ: max |a-b| = " << diff.max().item<double>() << " (atol " << atol
                  << "), first bad flat index " << idx << ": " << af.flatten()[idx].item<double>()
                  << " vs " << bf.flatten()[idx].item<double>();
  }
}

void expect_tensor_equal(const at::Tensor& a, const at::Tensor& b) {
  ASSERT_EQ(a.scalar_type(), b.scalar_type());
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_TRUE(at::equal(a, b)) << "tensors are not bit-identical: max |a-b| = "
                               << (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
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
