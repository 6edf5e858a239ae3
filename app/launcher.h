// The launcher (docs/design.md §1): the parent colocated-rl process spawns the node's I + T local
// ranks, hosts the rendezvous store on node 0, watches the ranks and exits non-zero with the first
// failing rank's error.
//
// Each rank re-executes this binary (/proc/self/exe, same arguments) with CRL_* variables set
// (fork + exec: libgomp and c10d's threads are not fork-safe). Ranks run in their own process
// groups and die with the launcher (PR_SET_PDEATHSIG). When a rank fails, the others get the
// collective timeout (plus a grace period) to fail on their own -- their errors name the broken
// op -- and are then killed; no process outlives the launcher.
//
// Under srun/mpirun with I + T tasks per node (see sync/dist_env.h) there is no launcher: each
// process is a rank and world rank 0 hosts the store.
#pragma once

#include <chrono>
#include <functional>

#include "sync/dist_env.h"

namespace crl::app {

// main() records argv here so the launcher can re-execute the binary with the same arguments.
void set_process_args(int argc, char** argv);

struct LaunchOptions {
  int infer_per_node = 1;
  int train_per_node = 1;
  // Collective/rendezvous timeout of the job: a failing rank's peers get this long (plus a grace)
  // to fail on their own before the launcher kills them.
  std::chrono::milliseconds timeout{60000};
};

// The body a rank runs; returns its exit code. Exceptions are reported (stderr and the error file
// the launcher reads) and turn into exit code 1.
using RankBody = std::function<int(const sync::RankEnv&)>;

// In a launcher: spawns and watches the local ranks and returns the job's exit code. In a rank
// (spawned, or rank mode): runs `body` and never returns (the process exits with its code, without
// running destructors that could block on broken peers).
int run_distributed(const LaunchOptions& options, const RankBody& body);

}  // namespace crl::app
