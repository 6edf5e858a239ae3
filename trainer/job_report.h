// World rank 0's view of the RL job: collects every rank's per-step report (step_reports.h) through
// a coordinator (never a collective, so it runs on its own thread and store connection beside the
// rank's role), prints a progress line per step, appends the JSONL metrics file, and prints the
// summary table at the end.
#pragma once

#include "sync/coordinator.h"
#include "trainer/rl_context.h"

namespace crl::trainer {

// Returns false when the job had episodes (--env) and every one of them ended in an environment
// error (said on stdout): the job's exit status is then 1.
// REQUIRES: `coord` is over a store connection no other thread uses
// (RlContext::connect_own_coordinator).
bool report_rl_job(const RlContext& ctx, sync::Coordinator& coord);

}  // namespace crl::trainer
