#include "sync/dist_env.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace crl::sync {
namespace {

TEST(DistEnvTest, SingleNodeDefaultsToLoopbackAndAFreePort) {
  DistEnv d = resolve_dist_env(4, map_env({}));
  EXPECT_TRUE(d.spawn);
  EXPECT_EQ(d.nnodes, 1);
  EXPECT_EQ(d.node_rank, 0);
  EXPECT_EQ(d.world_size(), 4);
  EXPECT_EQ(d.master_addr, "127.0.0.1");
  EXPECT_EQ(d.master_port, 0);
}

TEST(DistEnvTest, TorchrunNodeVariablesMakeANodeLauncher) {
  DistEnv d = resolve_dist_env(8, map_env({{"NNODES", "2"},
                                           {"NODE_RANK", "1"},
                                           {"MASTER_ADDR", "10.0.0.1"},
                                           {"MASTER_PORT", "29500"}}));
  EXPECT_TRUE(d.spawn);
  EXPECT_EQ(d.nnodes, 2);
  EXPECT_EQ(d.node_rank, 1);
  EXPECT_EQ(d.world_size(), 16);
  EXPECT_EQ(d.master_addr, "10.0.0.1");
  EXPECT_EQ(d.master_port, 29500);
}

TEST(DistEnvTest, OneTorchrunProcessPerRankIsRankMode) {
  DistEnv d = resolve_dist_env(4, map_env({{"WORLD_SIZE", "8"},
                                           {"RANK", "6"},
                                           {"LOCAL_RANK", "2"},
                                           {"LOCAL_WORLD_SIZE", "4"},
                                           {"MASTER_ADDR", "n0"},
                                           {"MASTER_PORT", "1234"}}));
  EXPECT_FALSE(d.spawn);
  EXPECT_EQ(d.nnodes, 2);
  EXPECT_EQ(d.node_rank, 1);
  EXPECT_EQ(d.rank, 6);
  EXPECT_EQ(d.local_rank, 2);
  EXPECT_EQ(d.source, "torchrun");
}

TEST(DistEnvTest, SlurmOneTaskPerNodeIsANodeLauncher) {
  DistEnv d = resolve_dist_env(
      4, map_env({{"SLURM_NTASKS", "3"},
                  {"SLURM_PROCID", "2"},
                  {"SLURM_STEP_TASKS_PER_NODE", "1"},
                  {"SLURM_NTASKS_PER_NODE", "4"},  // job-level, stale inside this step
                  {"MASTER_ADDR", "10.1.1.1"},
                  {"MASTER_PORT", "4000"}}));
  EXPECT_TRUE(d.spawn);
  EXPECT_EQ(d.nnodes, 3);
  EXPECT_EQ(d.node_rank, 2);
  EXPECT_EQ(d.master_addr, "10.1.1.1");
  EXPECT_EQ(d.source, "slurm");
}

TEST(DistEnvTest, SlurmTasksPerNodeFormatWithRepeatCount) {
  DistEnv d = resolve_dist_env(2, map_env({{"SLURM_NTASKS", "4"},
                                           {"SLURM_PROCID", "3"},
                                           {"SLURM_LOCALID", "1"},
                                           {"SLURM_TASKS_PER_NODE", "2(x2)"},
                                           {"MASTER_ADDR", "a"},
                                           {"MASTER_PORT", "5"}}));
  EXPECT_FALSE(d.spawn);
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.node_rank, 1);
  EXPECT_EQ(d.local_rank, 1);
}

TEST(DistEnvTest, TorchrunAgentStoreIsUsedNotHosted) {
  DistEnv d = resolve_dist_env(2, map_env({{"WORLD_SIZE", "2"},
                                           {"RANK", "1"},
                                           {"LOCAL_WORLD_SIZE", "2"},
                                           {"MASTER_ADDR", "h"},
                                           {"MASTER_PORT", "29400"},
                                           {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                           {"TORCHELASTIC_RUN_ID", "abc"}}));
  EXPECT_FALSE(d.spawn);
  EXPECT_TRUE(d.agent_store);
  EXPECT_EQ(d.store_prefix, "crl/abc/attempt0/");
}

TEST(DistEnvTest, OpenMpiRankMode) {
  DistEnv d = resolve_dist_env(2, map_env({{"OMPI_COMM_WORLD_SIZE", "2"},
                                           {"OMPI_COMM_WORLD_RANK", "1"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                           {"MASTER_PORT", "7"}}));
  EXPECT_FALSE(d.spawn);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.source, "openmpi");
}

TEST(DistEnvTest, ContradictionsAreClearErrors) {
  auto message = [](int per_node, std::map<std::string, std::string> vars) {
    try {
      resolve_dist_env(per_node, map_env(std::move(vars)));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(4, {{"NNODES", "2"}, {"NODE_RANK", "0"}}).find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(
      message(4, {{"NNODES", "2"}, {"NODE_RANK", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}})
          .find("node rank 2"),
      std::string::npos);
  EXPECT_NE(
      message(4,
              {{"WORLD_SIZE", "6"}, {"RANK", "0"}, {"LOCAL_WORLD_SIZE", "3"}, {"MASTER_PORT", "1"}})
          .find("3 tasks per node"),
      std::string::npos);
  EXPECT_NE(message(4, {{"NNODES", "two"}}).find("NNODES=two"), std::string::npos);
  EXPECT_NE(message(2, {{"SLURM_NTASKS", "6"},
                        {"SLURM_PROCID", "0"},
                        {"SLURM_TASKS_PER_NODE", "4,2"},
                        {"MASTER_PORT", "1"}})
                .find("differ between nodes"),
            std::string::npos);
  EXPECT_NE(
      message(2, {{"WORLD_SIZE", "4"}, {"RANK", "0"}, {"MASTER_PORT", "1"}}).find("local size"),
      std::string::npos);
  EXPECT_NE(message(4, {{"MASTER_PORT", "70000"}}).find("MASTER_PORT"), std::string::npos);
}

TEST(DistEnvTest, LauncherVariablesRoundTrip) {
  RankEnv r{5, 8, 1, 4, 1, 2, "10.0.0.1", 29500, "/tmp/e", "crl/x/"};
  std::map<std::string, std::string> vars;
  for (const auto& a : rank_env_assignments(r)) {
    auto eq = a.find('=');
    vars[a.substr(0, eq)] = a.substr(eq + 1);
  }
  auto back = rank_env_from_launcher(map_env(vars));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->rank, 5);
  EXPECT_EQ(back->node_rank, 1);
  EXPECT_EQ(back->master_addr, "10.0.0.1");
  EXPECT_EQ(back->error_file, "/tmp/e");
  EXPECT_EQ(back->store_prefix, "crl/x/");
  EXPECT_FALSE(rank_env_from_launcher(map_env({})).has_value());
  vars["CRL_RANK"] = "9";
  EXPECT_THROW(rank_env_from_launcher(map_env(vars)), std::invalid_argument);
}

}  // namespace
}  // namespace crl::sync
