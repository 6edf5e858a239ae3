// What `sync-check` (sync_check.cpp) and `bench sync` (sync_bench.cpp) share: the backend rule
// for ranks sharing a GPU, a sync's statistics as JSON, and the ranks' reports as one array.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sync/weight_sync.h"

namespace crl::bench {

// --device cuda puts local rank r on GPU r mod the device count (select_cuda_device): with fewer
// GPUs than ranks some ranks share one, which NCCL cannot serve (the job then uses Gloo groups and
// CUDA IPC weight updates). Each process sees the same device count on one node.
bool local_ranks_share_gpu(int ranks_per_node);

// The fields of a sync's statistics the tables read.
nlohmann::json stats_json(const sync::SyncStats& s);

// Each rank's report (sync::Coordinator::collect: rank order), parsed, as one array.
nlohmann::json parse_reports(const std::vector<std::string>& payloads);

}  // namespace crl::bench
