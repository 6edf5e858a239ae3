#include "bench/sync_job_util.h"

#include "sync/cuda_ipc.h"

namespace crl::bench {

using nlohmann::json;

bool local_ranks_share_gpu(int ranks_per_node) {
  return sync::cuda_device_count() < ranks_per_node;
}

json stats_json(const sync::SyncStats& s) {
  return {{"version", s.version},         {"bytes", s.bytes},      {"collectives", s.collectives},
          {"transfer_s", s.transfer_s},   {"pack_s", s.pack_s},    {"load_s", s.load_s},
          {"extra_bytes", s.extra_bytes}, {"verified", s.verified}};
}

json parse_reports(const std::vector<std::string>& payloads) {
  json all = json::array();
  for (const std::string& p : payloads) all.push_back(json::parse(p));
  return all;
}

}  // namespace crl::bench
