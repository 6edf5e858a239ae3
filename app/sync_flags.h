// Flags shared by every distributed subcommand: the rank counts, the weight-sync knobs and the
// collective timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "sync/weight_sync.h"

namespace CLI {
class App;
}

namespace crl::app {

struct DistFlags {
  int infer = 1;
  int train = 1;
  double timeout_s = 60;
  double bucket_mb = 256;
  double chunk_mb = 1024;
  std::string sync_mode = "bucket";
  int inflight = 2;
  bool verify = false;
  std::string transport = "auto";
  std::string ipc = "push";
  std::string backend = "auto";
  std::string colocate = "auto";

  std::chrono::milliseconds timeout() const;
  int64_t bucket_bytes() const;
  sync::WeightSyncOptions sync_options() const;
};

// --gpus-infer, --gpus-train, --timeout; with_sync adds --sync-bucket-mb, --sync-chunk-mb,
// --sync-mode, --sync-inflight, --sync-verify, --sync-transport, --sync-ipc.
void add_dist_flags(CLI::App& cmd, DistFlags& flags, bool with_sync);
// --colocate (the commands whose placement pairs engines with trainers: train, sync-check).
void add_colocate_flag(CLI::App& cmd, DistFlags& flags);

}  // namespace crl::app
