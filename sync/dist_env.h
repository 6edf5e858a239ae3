// DistEnv: where this process sits in the job, from the environment (docs/design.md §1).
//
// Two ways to start a job:
//   node mode   one colocated-rl per node (by hand, torchrun-style NNODES/NODE_RANK, or Slurm/MPI
//               with one task per node); its launcher spawns the node's local ranks.
//   rank mode   one colocated-rl per rank (srun/mpirun with I+T tasks per node, or torchrun
//               --nproc-per-node I+T): the process is a rank itself and spawns nothing.
// Variables, first match wins:
//   per-rank  torchrun WORLD_SIZE/RANK/LOCAL_RANK/LOCAL_WORLD_SIZE, Slurm
//   SLURM_NTASKS/SLURM_PROCID/
//             SLURM_LOCALID/SLURM_NTASKS_PER_NODE, OpenMPI OMPI_COMM_WORLD_SIZE/_RANK/_LOCAL_RANK/
//             _LOCAL_SIZE. The local size decides: == I+T is rank mode, == 1 is node mode with
//             node = that rank.
//   per-node  NNODES/NODE_RANK (torchrun), SLURM_NNODES/SLURM_NODEID.
//   master    MASTER_ADDR/MASTER_PORT (required with several nodes). A single node defaults to
//             127.0.0.1 and a free port. Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the
//             agent's store on MASTER_PORT is used rather than hosting one.
// Ranks spawned by our launcher get CRL_* variables (kRankVars) and read them with from_launcher().
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace crl::sync {

// A lookup of environment variables (std::getenv in production, a map in tests).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();
EnvLookup map_env(std::map<std::string, std::string> vars);

struct DistEnv {
  int nnodes = 1;
  int node_rank = 0;
  int local_world_size = 1;  // ranks per node (I + T)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port (single node only)
  // Rank mode only (spawn == false): this process's ranks.
  bool spawn = true;
  int rank = 0;
  int local_rank = 0;
  std::string
      source;  // which variables decided, for logs: "torchrun", "slurm", "openmpi", "default"
  // torchrun's agent hosts the store on MASTER_PORT: nobody hosts one, keys get store_prefix.
  bool agent_store = false;
  std::string store_prefix;

  int world_size() const { return nnodes * local_world_size; }
};

// Resolves the job's layout for `ranks_per_node` = I + T. Throws std::invalid_argument naming the
// variables when they contradict each other or the requested counts.
DistEnv resolve_dist_env(int ranks_per_node, const EnvLookup& env);

// What a spawned rank knows about itself (the CRL_* variables its launcher set).
struct RankEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr;
  int master_port = 0;
  std::string error_file;    // where a failing rank writes its error for the launcher
  std::string store_prefix;  // prepended to every store key (a shared agent store)
};

// Names of the variables from_launcher() reads.
inline const char* const kRankVars[] = {
    "CRL_RANK",   "CRL_WORLD_SIZE",  "CRL_LOCAL_RANK",  "CRL_LOCAL_WORLD_SIZE", "CRL_NODE_RANK",
    "CRL_NNODES", "CRL_MASTER_ADDR", "CRL_MASTER_PORT", "CRL_ERROR_FILE",       "CRL_STORE_PREFIX"};

// nullopt when CRL_RANK is unset (this process is not a spawned rank).
std::optional<RankEnv> rank_env_from_launcher(const EnvLookup& env);
// The CRL_* assignments ("NAME=value") for a rank.
std::vector<std::string> rank_env_assignments(const RankEnv& r);

}  // namespace crl::sync
