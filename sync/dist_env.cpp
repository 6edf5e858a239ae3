#include "sync/dist_env.h"

#include <cstdlib>
#include <stdexcept>

#include "common/check.h"

namespace crl::sync {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v || !*v) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup map_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

namespace {

int parse_int(const EnvLookup& env, const std::string& name, int min_value) {
  std::string v = *env(name);
  size_t used = 0;
  int x = 0;
  try {
    x = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || x < min_value) {
    CRL_INVALID("environment variable ", name, "=", v, " is not an integer >= ", min_value);
  }
  return x;
}

std::optional<int> opt_int(const EnvLookup& env, const std::string& name, int min_value) {
  if (!env(name)) return std::nullopt;
  return parse_int(env, name, min_value);
}

// The step's tasks per node ("4" or "4(x2)"); the job-level SLURM_NTASKS_PER_NODE may be stale
// inside an srun step, so it comes last. Uneven layouts ("4,2") cannot be a block layout.
std::optional<int> slurm_tasks_per_node(const EnvLookup& env) {
  auto v = env("SLURM_STEP_TASKS_PER_NODE");
  if (!v) v = env("SLURM_TASKS_PER_NODE");
  if (!v) v = env("SLURM_NTASKS_PER_NODE");
  if (!v) return std::nullopt;
  if (v->find(',') != std::string::npos) {
    CRL_INVALID("Slurm tasks per node '", *v,
                "' differ between nodes; every node must run the "
                "same number of tasks");
  }
  size_t used = 0;
  int x = 0;
  try {
    x = std::stoi(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || x < 1) CRL_INVALID("cannot read the Slurm tasks per node from '", *v, "'");
  return x;
}

struct PerRank {
  std::string source;
  int world = 0, rank = 0;
  std::optional<int> local_rank, local_size;
  std::string names;  // for messages
};

std::optional<PerRank> per_rank_vars(const EnvLookup& env) {
  if (env("WORLD_SIZE") && env("RANK")) {
    return PerRank{"torchrun",
                   parse_int(env, "WORLD_SIZE", 1),
                   parse_int(env, "RANK", 0),
                   opt_int(env, "LOCAL_RANK", 0),
                   opt_int(env, "LOCAL_WORLD_SIZE", 1),
                   "WORLD_SIZE/RANK/LOCAL_WORLD_SIZE"};
  }
  if (env("SLURM_NTASKS") && env("SLURM_PROCID")) {
    return PerRank{"slurm",
                   parse_int(env, "SLURM_NTASKS", 1),
                   parse_int(env, "SLURM_PROCID", 0),
                   opt_int(env, "SLURM_LOCALID", 0),
                   slurm_tasks_per_node(env),
                   "SLURM_NTASKS/SLURM_PROCID/SLURM_NTASKS_PER_NODE"};
  }
  if (env("OMPI_COMM_WORLD_SIZE") && env("OMPI_COMM_WORLD_RANK")) {
    return PerRank{"openmpi",
                   parse_int(env, "OMPI_COMM_WORLD_SIZE", 1),
                   parse_int(env, "OMPI_COMM_WORLD_RANK", 0),
                   opt_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
                   opt_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1),
                   "OMPI_COMM_WORLD_SIZE/_RANK/_LOCAL_SIZE"};
  }
  return std::nullopt;
}

}  // namespace

DistEnv resolve_dist_env(int ranks_per_node, const EnvLookup& env) {
  if (ranks_per_node < 1) CRL_INVALID("ranks per node must be >= 1, got ", ranks_per_node);
  DistEnv d;
  d.local_world_size = ranks_per_node;
  d.source = "default";

  if (auto pr = per_rank_vars(env)) {
    if (pr->rank >= pr->world) {
      CRL_INVALID(pr->names, ": rank ", pr->rank, " is not below the world size ", pr->world);
    }
    // Without a local size only the unambiguous cases are guessed: one process (a launcher) or
    // exactly one node's ranks.
    if (!pr->local_size && pr->world != 1 && pr->world != ranks_per_node) {
      CRL_INVALID(pr->names,
                  ": the tasks per node are not set, so it is unclear whether each of "
                  "the ",
                  pr->world, " processes is a rank or a node launcher; set the local size");
    }
    int local = pr->local_size.value_or(pr->world == ranks_per_node ? ranks_per_node : 1);
    d.source = pr->source;
    if (local == ranks_per_node) {
      if (pr->world % ranks_per_node != 0) {
        CRL_INVALID(pr->names, ": world size ", pr->world, " is not a multiple of the ",
                    ranks_per_node, " ranks per node (--gpus-infer + --gpus-train)");
      }
      d.spawn = false;
      d.nnodes = pr->world / ranks_per_node;
      d.rank = pr->rank;
      d.node_rank = pr->rank / ranks_per_node;
      d.local_rank = pr->local_rank.value_or(pr->rank % ranks_per_node);
      if (d.local_rank != pr->rank % ranks_per_node) {
        CRL_INVALID(pr->names, ": local rank ", d.local_rank, " of rank ", pr->rank,
                    " does not match a block layout of ", ranks_per_node, " ranks per node");
      }
    } else if (local == 1) {
      d.nnodes = pr->world;  // one launcher per node
      d.node_rank = pr->rank;
    } else {
      CRL_INVALID(pr->names, ": ", local,
                  " tasks per node, but a node runs either 1 (its launcher "
                  "spawns the ranks) or ",
                  ranks_per_node, " (--gpus-infer + --gpus-train)");
    }
  } else if (env("NNODES") || env("NODE_RANK")) {
    d.source = "torchrun";
    d.nnodes = env("NNODES") ? parse_int(env, "NNODES", 1) : 1;
    d.node_rank = env("NODE_RANK") ? parse_int(env, "NODE_RANK", 0) : 0;
  } else if (env("SLURM_NNODES") && env("SLURM_NODEID")) {
    d.source = "slurm";
    d.nnodes = parse_int(env, "SLURM_NNODES", 1);
    d.node_rank = parse_int(env, "SLURM_NODEID", 0);
  }
  if (d.node_rank >= d.nnodes) {
    CRL_INVALID("node rank ", d.node_rank, " is not below the node count ", d.nnodes);
  }

  if (auto a = env("MASTER_ADDR")) {
    d.master_addr = *a;
  } else if (d.nnodes > 1) {
    CRL_INVALID("a ", d.nnodes,
                "-node job needs MASTER_ADDR (the address of node 0; under Slurm: "
                "export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1))");
  }
  // torchrun's agent already serves a TCPStore on MASTER_PORT: use it instead of hosting one.
  if (env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    d.agent_store = true;
    // A restarted attempt must not see the failed attempt's keys in the agent's store.
    d.store_prefix = "crl/" + env("TORCHELASTIC_RUN_ID").value_or("run") + "/attempt" +
                     env("TORCHELASTIC_RESTART_COUNT").value_or("0") + "/";
  }
  if (env("MASTER_PORT")) {
    d.master_port = parse_int(env, "MASTER_PORT", 1);
    if (d.master_port > 65535) CRL_INVALID("MASTER_PORT=", d.master_port, " is not a port");
  } else if (d.nnodes > 1 || !d.spawn) {
    CRL_INVALID("a job with more than one launcher needs MASTER_PORT (a free port on node 0)");
  }
  return d;
}

std::optional<RankEnv> rank_env_from_launcher(const EnvLookup& env) {
  if (!env("CRL_RANK")) return std::nullopt;
  for (const char* name : kRankVars) {
    if (!env(name) && std::string(name) != "CRL_ERROR_FILE" &&
        std::string(name) != "CRL_STORE_PREFIX") {
      CRL_INVALID("spawned rank: environment variable ", name, " is missing");
    }
  }
  RankEnv r;
  r.rank = parse_int(env, "CRL_RANK", 0);
  r.world_size = parse_int(env, "CRL_WORLD_SIZE", 1);
  r.local_rank = parse_int(env, "CRL_LOCAL_RANK", 0);
  r.local_world_size = parse_int(env, "CRL_LOCAL_WORLD_SIZE", 1);
  r.node_rank = parse_int(env, "CRL_NODE_RANK", 0);
  r.nnodes = parse_int(env, "CRL_NNODES", 1);
  r.master_addr = *env("CRL_MASTER_ADDR");
  r.master_port = parse_int(env, "CRL_MASTER_PORT", 1);
  r.error_file = env("CRL_ERROR_FILE").value_or("");
  r.store_prefix = env("CRL_STORE_PREFIX").value_or("");
  if (r.rank >= r.world_size || r.local_rank >= r.local_world_size ||
      r.world_size != r.nnodes * r.local_world_size) {
    CRL_INVALID("spawned rank: inconsistent CRL_* variables (rank ", r.rank, " of ", r.world_size,
                ", local ", r.local_rank, " of ", r.local_world_size, ", ", r.nnodes, " nodes)");
  }
  return r;
}

std::vector<std::string> rank_env_assignments(const RankEnv& r) {
  return {"CRL_RANK=" + std::to_string(r.rank),
          "CRL_WORLD_SIZE=" + std::to_string(r.world_size),
          "CRL_LOCAL_RANK=" + std::to_string(r.local_rank),
          "CRL_LOCAL_WORLD_SIZE=" + std::to_string(r.local_world_size),
          "CRL_NODE_RANK=" + std::to_string(r.node_rank),
          "CRL_NNODES=" + std::to_string(r.nnodes),
          "CRL_MASTER_ADDR=" + r.master_addr,
          "CRL_MASTER_PORT=" + std::to_string(r.master_port),
          "CRL_ERROR_FILE=" + r.error_file,
          "CRL_STORE_PREFIX=" + r.store_prefix};
}

}  // namespace crl::sync
