// The RL job (docs/design.md §5): `colocated-rl --gpus-infer I --gpus-train T`, one rank's side.
// The RL step lives in trainer/ (rl_context.h, rollout_producer.h, rollout_consumer.h,
// job_report.h); this is the wiring: a rank runs its role, and world rank 0 also reports.
#pragma once

#include "sync/dist_env.h"
#include "trainer/rl_context.h"

namespace crl::app {

using RlJobOptions = trainer::RlOptions;

int run_rl_rank(const sync::RankEnv& env, const RlJobOptions& options);

}  // namespace crl::app
