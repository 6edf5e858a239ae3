// World rank 0's view of the RL job: reads every rank's per-step metrics from the store (never a
// collective, so it runs on its own thread and store connection beside the rank's role), prints a
// progress line per step, appends the JSONL metrics file, and prints the summary table at the end.
#pragma once

#include "sync/store.h"
#include "trainer/rl_context.h"

namespace crl::trainer {

// REQUIRES: `store` is a connection no other thread uses.
void report_rl_job(const RlContext& ctx, const sync::StorePtr& store);

}  // namespace crl::trainer
