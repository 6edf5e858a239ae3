#include "app/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "common/check.h"
#include "common/file_util.h"
#include "sync/groups.h"
#include "sync/store.h"

extern char** environ;

namespace crl::app {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> g_args;
volatile std::sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int sig) { g_stop_signal = sig; }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Runs the body in this process (a rank) and exits with its code.
[[noreturn]] void run_rank(const sync::RankEnv& env, const RankBody& body) {
  int code = 1;
  std::string error;
  try {
    code = body(env);
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "unknown exception";
  }
  if (!error.empty()) {
    spdlog::error("rank {}: {}", env.rank, error);
    if (!env.error_file.empty()) {
      try {
        write_file_atomic(env.error_file, error + "\n");
      } catch (...) {
      }
    }
    code = 1;
  }
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  // Destructors of communicators whose peers died can block: leave without them.
  std::_Exit(code);
}

struct Child {
  pid_t pid = -1;
  sync::RankEnv env;
  bool running = false;
  int status = 0;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  }
  return "ended";
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
            pid_t parent) {
  // Everything exec needs is built before fork: the child only makes async-signal-safe calls.
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the launcher died before prctl
    syscall(SYS_close_range, 3U, ~0U, 0U);
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent: no race with an early kill
  return pid;
}

// The environment of the node's ranks: the launcher's, less its own rank variables (which a
// launcher that was itself started as a rank would pass on); the user's CRL_* settings
// (CRL_CPU_ISA, CRL_CACHE_DIR, CRL_API_KEY, ...) reach every rank. The ranks share the node's
// cores unless the user said otherwise.
std::vector<std::string> rank_base_env(int per_node) {
  std::vector<std::string> rank_vars;
  for (const std::string& a : sync::rank_env_assignments(sync::RankEnv{})) {
    rank_vars.push_back(a.substr(0, a.find('=') + 1));
  }
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    const bool rank_var = std::any_of(
        rank_vars.begin(), rank_vars.end(),
        [&](const std::string& v) { return std::strncmp(*e, v.c_str(), v.size()) == 0; });
    if (!rank_var) base_env.emplace_back(*e);
  }
  if (!std::getenv("OMP_NUM_THREADS")) {
    unsigned hw = std::max(1U, std::thread::hardware_concurrency());
    base_env.push_back(fmt::format("OMP_NUM_THREADS={}", std::max(1U, hw / per_node)));
  }
  return base_env;
}

int count_running(const std::vector<Child>& children) {
  int n = 0;
  for (const auto& c : children) n += c.running;
  return n;
}

// Records the exit of every child that exited.
void reap(std::vector<Child>& children) {
  int st = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    for (auto& c : children) {
      if (c.pid == pid) {
        c.running = false;
        c.status = st;
      }
    }
  }
}

void kill_all(const std::vector<Child>& children, int sig) {
  for (const auto& c : children) {
    if (c.running) kill(-c.pid, sig);
  }
}

// The job's failure key (sync::kJobFailedKey) from a launcher's side: set when a rank of this node
// fails or the launcher is stopped, so ranks on every node waiting on the store fail at once naming
// it, and polled for another node's failure, so this node's ranks blocked outside the store (in a
// collective with a dead peer) are stopped too. Node 0's launcher hosts the store; the others
// connect when first needed, at most every 2 s (until node 0 is up, and after it has gone).
class FailureChannel {
 public:
  FailureChannel(sync::StorePtr hosted, std::string addr, int port, std::string prefix)
      : addr_(std::move(addr)), port_(port), prefix_(std::move(prefix)) {
    if (hosted) store_ = with_prefix(hosted);
  }

  // Sets the key, trying for up to 5 s (a loaded node 0 may be slow to accept a connection; a
  // dead one never will, and the ranks' grace should not wait much longer for it).
  void report(const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    std::string error = "no connection";
    while (Clock::now() < deadline) {
      try {
        if (auto s = store(/*now=*/true)) return sync::report_job_failure(s, what);
      } catch (const std::exception& e) {
        error = e.what();
        store_.reset();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    spdlog::warn("launcher: cannot tell the other nodes that the job failed (store {}:{}): {}",
                 addr_, port_, error);
  }
  // Another node's failure, once (empty otherwise); polled every 250 ms at most.
  std::string poll() {
    const auto now = Clock::now();
    if (now < next_poll_) return "";
    next_poll_ = now + std::chrono::milliseconds(250);
    try {
      if (auto s = store()) return sync::job_failure(s);
    } catch (const std::exception&) {
      store_.reset();  // node 0's store is gone (the job ending there) or not up yet
    }
    return "";
  }

 private:
  sync::StorePtr with_prefix(sync::StorePtr s) const {
    if (prefix_.empty()) return s;
    return c10::make_intrusive<c10d::PrefixStore>(prefix_, std::move(s));
  }
  // The store, connecting when there is none (`now`: whatever the last attempt; else at most
  // every 2 s). Throws only when `now`.
  sync::StorePtr store(bool now = false) {
    if (store_ || (!now && Clock::now() < next_connect_)) return store_;
    next_connect_ = Clock::now() + std::chrono::seconds(2);
    try {
      // A report waits up to 2 s for a connection; a poll 1 s (it blocks the supervise loop).
      store_ = with_prefix(
          sync::connect_store(addr_, port_, std::chrono::milliseconds(now ? 2000 : 1000)));
    } catch (const std::exception&) {
      store_.reset();
      if (now) throw;
    }
    return store_;
  }

  std::string addr_;
  int port_;
  std::string prefix_;
  sync::StorePtr store_;
  Clock::time_point next_connect_{}, next_poll_{};
};

// How long the other ranks of a node get after one of them failed: enough to print their own
// errors (a peer blocked in a collective with the failed rank fails on its own within --timeout,
// naming the op, when that is shorter), not the whole --timeout.
constexpr std::chrono::seconds kFailureGrace{5};
// From SIGTERM to SIGKILL.
constexpr std::chrono::seconds kTermGrace{3};

// Waits until every rank of the node exited. The first failure is logged as it happens; the
// others get min(timeout + 1 s, kFailureGrace) to end on their own, then SIGTERM, then SIGKILL
// kTermGrace later (torchrun's agent stops the group at once too: a job never sits out its
// --timeout behind a dead rank). SIGINT/SIGTERM to the launcher stop the ranks the same way.
// Returns the local index of the first failed rank, or -1.
int supervise(std::vector<Child>& children, const sync::Topology& topo,
              std::chrono::milliseconds timeout, FailureChannel& failures, std::string* elsewhere) {
  int first_failed = -1;
  Clock::time_point term_at = Clock::time_point::max(), kill_at = Clock::time_point::max();
  bool stopping = false;
  while (count_running(children) > 0) {
    reap(children);
    for (size_t l = 0; first_failed < 0 && l < children.size(); ++l) {
      if (children[l].running || !failed(children[l].status)) continue;
      first_failed = static_cast<int>(l);
      const std::string err = read_text(children[l].env.error_file);
      const auto grace =
          std::min<Clock::duration>(timeout + std::chrono::seconds(1), kFailureGrace);
      const double grace_s = std::chrono::duration<double>(grace).count();
      spdlog::error("launcher: {} {}{}{}; stopping the other ranks in {:g} s",
                    topo.describe(children[l].env.rank), describe_status(children[l].status),
                    err.empty() ? "" : ": ", err, grace_s);
      term_at = std::min(term_at, Clock::now() + grace);
      if (elsewhere->empty()) {
        failures.report(fmt::format("{} {}{}{}", topo.describe(children[l].env.rank),
                                    describe_status(children[l].status), err.empty() ? "" : ": ",
                                    err));
      }
    }
    if (first_failed < 0 && elsewhere->empty() && !stopping) {
      *elsewhere = failures.poll();
      if (!elsewhere->empty()) {
        const auto grace =
            std::min<Clock::duration>(timeout + std::chrono::seconds(1), kFailureGrace);
        spdlog::error(
            "launcher: the job failed on another node: {}; stopping this node's ranks "
            "in {:g} s",
            *elsewhere, std::chrono::duration<double>(grace).count());
        term_at = Clock::now() + grace;
      }
    }
    if (g_stop_signal && !stopping) {
      spdlog::warn("launcher: signal {}, stopping the ranks", static_cast<int>(g_stop_signal));
      failures.report(fmt::format("node {}'s launcher was stopped by signal {}",
                                  children.empty() ? 0 : children[0].env.node_rank,
                                  static_cast<int>(g_stop_signal)));
      term_at = Clock::now();
    }
    if (Clock::now() >= term_at && !stopping) {
      if (!g_stop_signal && count_running(children) > 0) {
        spdlog::warn("launcher: stopping {} rank(s) still running", count_running(children));
      }
      kill_all(children, SIGTERM);
      kill_at = Clock::now() + kTermGrace;
      stopping = true;
    }
    if (Clock::now() >= kill_at) {
      kill_all(children, SIGKILL);
      kill_at = Clock::time_point::max();
    }
    if (count_running(children) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return first_failed;
}

// Logs every failed rank, the first failure first, and removes the ranks' error files. Returns the
// node's exit code: 1 when any rank failed.
int report_exit(const std::vector<Child>& children, int first_failed, const sync::Topology& topo,
                const std::string& error_dir, const std::string& elsewhere) {
  int code = elsewhere.empty() ? 0 : 1;
  std::string report = elsewhere.empty() ? "" : "\n  on another node: " + elsewhere;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t l = 0; l < children.size(); ++l) {
      if ((pass == 0) != (static_cast<int>(l) == first_failed)) continue;
      const Child& c = children[l];
      if (!failed(c.status)) continue;
      code = 1;
      std::string err = read_text(c.env.error_file);
      report += fmt::format("\n  {} {}{}{}", topo.describe(c.env.rank), describe_status(c.status),
                            err.empty() ? "" : ": ", err);
    }
  }
  for (const auto& c : children) std::remove(c.env.error_file.c_str());
  rmdir(error_dir.c_str());
  if (code != 0) spdlog::error("launcher: the job failed; first failure first:{}", report);
  return code;
}

// A one-node job's store serves only this host's ranks: keep it off the network when they reach
// it through a loopback address (the default; a MASTER_ADDR the user set is left as it is).
void keep_store_local(const sync::StorePtr& store, const std::string& master_addr) {
  const bool loopback =
      master_addr == "localhost" || master_addr == "::1" || master_addr.rfind("127.", 0) == 0;
  if (!loopback) return;
  std::string why;
  if (!sync::bind_store_to_loopback(store, &why)) {
    spdlog::warn(
        "launcher: the rendezvous store (no authentication) stays reachable from the "
        "network: cannot tie it to loopback ({})",
        why);
  }
}

}  // namespace

void set_process_args(int argc, char** argv) { g_args.assign(argv, argv + argc); }

int run_distributed(const LaunchOptions& options, const RankBody& body) {
  auto penv = sync::process_env();
  if (auto spawned = sync::rank_env_from_launcher(penv)) run_rank(*spawned, body);

  int per_node = options.infer_per_node + options.train_per_node;
  if (options.infer_per_node < 1 || options.train_per_node < 1) {
    CRL_INVALID("--gpus-infer and --gpus-train must be >= 1 (got ", options.infer_per_node, " and ",
                options.train_per_node, ")");
  }
  sync::DistEnv d = sync::resolve_dist_env(per_node, penv);

  if (!d.spawn) {
    // srun/mpirun started every rank: world rank 0 hosts the store, nobody spawns.
    sync::StorePtr server;
    if (d.rank == 0 && !d.agent_store) {
      server = sync::host_store(d.master_port, options.timeout);
      if (d.nnodes == 1) keep_store_local(server, d.master_addr);
    }
    sync::RankEnv env{d.rank,      d.world_size(), d.local_rank,  d.local_world_size,
                      d.node_rank, d.nnodes,       d.master_addr, d.master_port,
                      "",          d.store_prefix};
    run_rank(env, body);
  }

  sync::StorePtr server;
  int port = d.master_port;
  if (d.node_rank == 0 && !d.agent_store) {
    server = sync::host_store(d.master_port, options.timeout);
    port = sync::store_port(server);
    if (d.nnodes == 1) keep_store_local(server, d.master_addr);
  }
  char dir_template[] = "/tmp/colocated-rl-XXXXXX";
  if (!mkdtemp(dir_template)) {
    throw std::runtime_error(fmt::format("mkdtemp failed: {}", std::strerror(errno)));
  }
  std::string error_dir = dir_template;

  const std::vector<std::string> base_env = rank_base_env(per_node);

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  sync::Topology topo{d.nnodes, options.infer_per_node, options.train_per_node};
  std::vector<Child> children(per_node);
  pid_t self = getpid();
  for (int l = 0; l < per_node; ++l) {
    Child& c = children[l];
    c.env = sync::RankEnv{d.node_rank * per_node + l,
                          d.world_size(),
                          l,
                          per_node,
                          d.node_rank,
                          d.nnodes,
                          d.master_addr,
                          port,
                          fmt::format("{}/rank{}.err", error_dir, d.node_rank * per_node + l),
                          d.store_prefix};
    auto env = base_env;
    for (auto& a : sync::rank_env_assignments(c.env)) env.push_back(a);
    c.pid = spawn(g_args, env, self);
    c.running = true;
  }
  spdlog::info("launcher: node {}/{} started {} ranks ({} infer + {} train), store {}:{}",
               d.node_rank, d.nnodes, per_node, options.infer_per_node, options.train_per_node,
               d.master_addr, port);

  FailureChannel failures(server, d.master_addr, port, d.store_prefix);
  std::string elsewhere;
  const int first_failed = supervise(children, topo, options.timeout, failures, &elsewhere);
  const int code = report_exit(children, first_failed, topo, error_dir, elsewhere);
  if (g_stop_signal) return 128 + g_stop_signal;
  return code;
}

}  // namespace crl::app
