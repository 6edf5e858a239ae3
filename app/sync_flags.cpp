#include "app/sync_flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>

#include "app/cli_style.h"
#include "common/check.h"

namespace crl::app {
namespace {
void add_dist_flags_in_group(CLI::App& cmd, DistFlags& f, bool with_sync);
}  // namespace

std::chrono::milliseconds DistFlags::timeout() const {
  if (!(timeout_s > 0)) CRL_INVALID("--timeout must be > 0 seconds, got ", timeout_s);
  return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
}

int64_t DistFlags::bucket_bytes() const {
  if (!(bucket_mb > 0)) CRL_INVALID("--sync-bucket-mb must be > 0, got ", bucket_mb);
  return static_cast<int64_t>(bucket_mb * (1 << 20));
}

sync::WeightSyncOptions DistFlags::sync_options() const {
  sync::WeightSyncOptions o;
  o.mode = sync::parse_sync_mode(sync_mode);
  o.inflight = inflight;
  o.verify = verify;
  if (!(chunk_mb >= 0)) CRL_INVALID("--sync-chunk-mb must be >= 0, got ", chunk_mb);
  // A positive size is at least a byte (0 alone means the whole model first).
  o.stream_chunk_bytes =
      chunk_mb > 0 ? std::max<int64_t>(1, static_cast<int64_t>(chunk_mb * (1 << 20))) : 0;
  o.transport = sync::parse_sync_transport(transport);
  if (inflight < 1) CRL_INVALID("--sync-inflight must be >= 1, got ", inflight);
  if (ipc != "push" && ipc != "pull")
    CRL_INVALID("--sync-ipc must be push or pull, got '", ipc, "'");
  o.ipc_push = ipc == "push";
  return o;
}

void add_dist_flags(CLI::App& cmd, DistFlags& f, bool with_sync) {
  const std::string previous = cmd.option_defaults()->get_group();
  cmd.option_defaults()->group(kGroupDist);
  add_dist_flags_in_group(cmd, f, with_sync);
  cmd.option_defaults()->group(previous);  // what the caller adds next keeps its own group
}

void add_colocate_flag(CLI::App& cmd, DistFlags& f) {
  cmd.add_option("--colocate", f.colocate,
                 "auto (where each GPU holds one engine and one trainer, e.g. --gpus-infer N "
                 "--gpus-train N on N GPUs, each engine gets its weights from the trainer beside "
                 "it), on (pair engine i with train rank i wherever they run; needs --gpus-infer "
                 "== --gpus-train) or off (each trainer feeds every engine of its node)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->group(kGroupDist)
      ->capture_default_str();
}

namespace {

void add_dist_flags_in_group(CLI::App& cmd, DistFlags& f, bool with_sync) {
  cmd.add_option("--gpus-infer", f.infer, "infer ranks (engines) per node")
      ->capture_default_str()
      ->check(at_least(1));
  cmd.add_option("--gpus-train", f.train, "train ranks per node")
      ->capture_default_str()
      ->check(at_least(1));
  cmd.add_option("--timeout", f.timeout_s,
                 "seconds any collective or rendezvous may take before the job fails naming it")
      ->capture_default_str()
      ->check(positive());
  cmd.add_option("--comm-backend", f.backend,
                 "auto (NCCL for a group whose ranks hold CUDA tensors on distinct GPUs, Gloo "
                 "otherwise: see the placement table the RL job prints), gloo or nccl")
      ->capture_default_str();
  if (!with_sync) return;
  cmd.add_option("--sync-bucket-mb", f.bucket_mb, "weight-sync bucket cap in MiB")
      ->capture_default_str();
  cmd.add_option("--sync-chunk-mb", f.chunk_mb,
                 "ZeRO-3: a weight update gathers the parameters and sends them this many MiB of "
                 "buckets at a time, each train rank holding only its share of one run (over "
                 "tensor-parallel sync lanes every bucket of it; 0: gather the whole model first)")
      ->capture_default_str();
  cmd.add_option("--sync-mode", f.sync_mode,
                 "bucket, or per-tensor (the OpenRLHF-style baseline, for benchmarks)")
      ->capture_default_str();
  cmd.add_option("--sync-inflight", f.inflight, "send buffers in flight per sender")
      ->capture_default_str();
  cmd.add_flag("--sync-verify", f.verify, "compare a checksum per bucket after every sync");
  cmd.add_option("--sync-transport", f.transport,
                 "auto (CUDA IPC where an engine and its trainers share one GPU, the communicator "
                 "otherwise), communicator or ipc")
      ->capture_default_str();
  cmd.add_option("--sync-ipc", f.ipc,
                 "CUDA IPC updates that cast (fp32 trainer, bf16 engine): push (the trainer casts "
                 "into the engines' buckets) or pull (into send buffers the engines copy from)")
      ->capture_default_str();
}

}  // namespace

}  // namespace crl::app
