#include "sync/local_ranks.h"

#include <atomic>
#include <thread>

#include "sync/gloo_communicator.h"

namespace crl::sync {

std::vector<std::string> run_local_ranks(
    int n, std::chrono::milliseconds timeout,
    const std::function<void(int, std::unique_ptr<Communicator>&, const StorePtr&)>& body) {
  static std::atomic<int> job{0};
  std::string prefix = "job" + std::to_string(job++);
  StorePtr server = host_store(0, timeout);
  int port = store_port(server);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        StorePtr store = connect_store("127.0.0.1", port, timeout);
        GroupInfo info;
        info.name = "world";
        info.rank = r;
        info.timeout = timeout;
        for (int i = 0; i < n; ++i) info.world_ranks.push_back(i);
        auto comm = make_gloo_communicator(store, prefix, info, "127.0.0.1");
        body(r, comm, store);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace crl::sync
