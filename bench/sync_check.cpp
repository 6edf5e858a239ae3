// `colocated-rl sync-check`: weight-sync correctness on the embedded default (sync_job.h).
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/stats.h"
#include "bench/sync_job.h"
#include "bench/sync_job_util.h"
#include "common/check.h"
#include "common/units.h"
#include "engine/llm_engine.h"
#include "engine/model/config.h"
#include "engine/model/tensor_parallel.h"
#include "engine/model/transformer.h"
#include "engine/weight_buffers.h"
#include "sync/coordinator.h"
#include "sync/cuda_ipc.h"
#include "sync/groups.h"
#include "sync/nccl_communicator.h"
#include "sync/placement.h"
#include "sync/weight_sync.h"

namespace crl::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Fault {
  std::string kind;
  int rank = -1;
};

Fault parse_fault(const std::string& s) {
  if (s.empty()) return {};
  auto colon = s.find(':');
  Fault f{s.substr(0, colon), colon == std::string::npos ? -1 : std::stoi(s.substr(colon + 1))};
  if (f.kind != "never-join" && f.kind != "die-mid-sync" && f.kind != "layout-mismatch") {
    CRL_INVALID("unknown fault '", s, "' (never-join:R, die-mid-sync:R, layout-mismatch:R)");
  }
  return f;
}

[[noreturn]] void never_join() {
  spdlog::warn("fault injection: this rank never joins the rendezvous");
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// A seeded stand-in for an optimizer step: the same on every train rank (the noise is drawn on
// the CPU, whatever device the masters are on).
void perturb(const std::vector<at::Tensor>& masters, int64_t version) {
  for (size_t i = 0; i < masters.size(); ++i) {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(version) * 1000003ULL + i);
    at::Tensor noise = at::randn(masters[i].sizes(), gen, masters[i].options().device(at::kCPU));
    masters[i].add_(noise.to(masters[i].device()), 1e-2);
  }
}

std::vector<at::Tensor> tensors_of(const engine::NamedTensors& named) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : named) out.push_back(t);
  return out;
}

// Steps the engine (keeping one sampled request alive) until the senders started `version`.
void generate_until_ready(engine::LlmEngine& eng, const sync::WeightSync& ws, int64_t version,
                          std::chrono::milliseconds timeout, bool keep_busy) {
  auto deadline = Clock::now() + timeout;
  while (!ws.ready(version)) {
    if (Clock::now() > deadline) {
      throw std::runtime_error(
          fmt::format("weight sync: waited {} ms for the train ranks to start version {}",
                      timeout.count(), version));
    }
    if (keep_busy && !eng.has_unfinished()) {
      engine::GenerateRequest r;
      r.prompt_token_ids = {2, 10, 11, 12, 13};
      r.params.max_tokens = 48;
      r.params.ignore_eos = true;
      r.params.seed = static_cast<uint64_t>(version);
      eng.add_request(std::move(r));
    }
    if (eng.has_unfinished()) {
      eng.step();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

void drain(engine::LlmEngine& eng) {
  // Nothing else runs on this engine: abort what is left by stepping it to the end.
  while (eng.has_unfinished()) eng.step();
}

std::vector<int32_t> greedy_reference(const engine::Transformer& trainer,
                                      at::ScalarType engine_dtype,
                                      const std::vector<int32_t>& prompt, int n) {
  engine::NamedTensors cast;
  for (const auto& [name, t] : trainer.named_parameters()) {
    cast.emplace_back(name, t.to(engine_dtype).contiguous());
  }
  engine::TransformerOptions o;
  o.dtype = engine_dtype;
  o.device = trainer.named_parameters().front().second.device();  // where the engine runs too
  engine::Transformer model(trainer.config(), std::move(cast), o);
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    at::Tensor logits =
        model.forward_packed(at::tensor(ids, at::kLong), {static_cast<int64_t>(ids.size())});
    int64_t next = logits[-1].argmax().item<int64_t>();
    out.push_back(static_cast<int32_t>(next));
    ids.push_back(next);
  }
  return out;
}

}  // namespace

int run_sync_check_rank(const sync::RankEnv& env, const SyncJobOptions& o) {
  Fault fault = parse_fault(o.fault);
  if (fault.kind == "never-join" && fault.rank == env.rank) never_join();
  engine::EngineConfig engine_config = o.engine;
  const bool cuda = engine_config.device.rfind("cuda", 0) == 0;
  const std::string backend = sync::resolve_comm_backend(
      o.comm_backend, cuda, cuda && local_ranks_share_gpu(o.infer_per_node + o.train_per_node));
  if (cuda) {
    // One device per rank: local rank mod the device count.
    engine_config.device = fmt::format("cuda:{}", sync::select_cuda_device(env.local_rank));
  }
  const at::Device device(engine_config.device);
  sync::World world = sync::join_world(env, o.timeout, backend);
  sync::Topology topo{env.nnodes, o.infer_per_node, o.train_per_node};
  // --tp N: every engine a tensor-parallel group whose ranks take their slices over sync lanes.
  const int tp = engine_config.tensor_parallel_size;
  topo.lanes = tp;
  std::vector<int> gpu_of_local;  // local rank mod the device count, as select_cuda_device
  for (int l = 0; cuda && l < topo.ranks_per_node(); ++l) {
    gpu_of_local.push_back(l % sync::cuda_device_count());
  }
  topo.paired = sync::colocate_pairs(o.colocate, topo, gpu_of_local);
  sync::Groups groups = sync::make_groups(std::move(world.comm), topo);
  const bool train = groups.role == sync::Role::kTrain;
  const at::ScalarType edtype = engine::parse_dtype(o.engine.dtype);
  const bool reporter = train ? (topo.role_index(env.rank) == 0) : false;

  std::unique_ptr<engine::Transformer> trainer;
  std::vector<at::Tensor> trainer_buckets;  // set when the trainer sends from flat storage
  std::unique_ptr<engine::LlmEngine> eng;
  std::unique_ptr<sync::WeightLayout> layout;
  if (train) {
    engine::TransformerOptions to;
    to.dtype = at::kFloat;
    to.device = device;
    trainer =
        std::make_unique<engine::Transformer>(engine::Transformer::load(o.engine.model_dir, to));
    auto specs = engine::weight_specs(*trainer, edtype);
    for (auto& spec : specs) {  // over lanes: one engine rank's slice of each
      spec.shape = engine::tp_slice_shape(spec.name, spec.shape, engine::TpShard{0, tp});
    }
    if (fault.kind == "layout-mismatch" && fault.rank == env.rank) {
      specs.at(2).shape.at(0) += 1;  // as if this rank had loaded a different checkpoint
    }
    layout = std::make_unique<sync::WeightLayout>(sync::WeightLayout::plan(specs, o.bucket_bytes));
    if (edtype == at::kFloat && fault.kind != "layout-mismatch" && tp == 1) {
      // Same dtype on both sides: the trainer's parameters move into the layout's buckets (as
      // the engine's do) and are sent from that flat storage without a copy.
      trainer_buckets = layout->allocate_buckets(at::TensorOptions().device(device));
      std::vector<at::Tensor> current = tensors_of(trainer->named_parameters());
      for (size_t b = 0; b < layout->buckets().size(); ++b) {
        layout->pack(current, static_cast<int64_t>(b), trainer_buckets[b]);
      }
      auto views = layout->views(trainer_buckets);
      engine::NamedTensors rebound;
      for (size_t i = 0; i < views.size(); ++i) rebound.emplace_back(specs[i].name, views[i]);
      trainer->set_parameters(rebound);
    }
  } else {
    eng = std::make_unique<engine::LlmEngine>(engine_config);
    layout = std::make_unique<sync::WeightLayout>(
        tp > 1 ? eng->attach_weight_lanes(o.bucket_bytes)
               : eng->attach_weight_buffers(o.bucket_bytes).layout());
  }
  sync::WeightSyncOptions so = o.sync;
  so.device = device;
  so.lanes = tp;
  // Engine rank r's part of a trainer tensor (the tensor itself without lanes).
  auto slice_of = [&](int lane, int64_t i, const at::Tensor& full) {
    return engine::tp_slice_view(layout->specs()[i].name, full, engine::TpShard{lane, tp});
  };
  if (fault.kind == "die-mid-sync" && fault.rank == env.rank) {
    so.on_bucket_posted = [](int64_t) {
      spdlog::warn("fault injection: this rank dies in the middle of a sync");
      std::raise(SIGKILL);
    };
  }
  sync::WeightSync ws(groups, world.store, *layout, so);
  sync::Coordinator coord(world.store, "sync-check");

  json report = {
      {"rank", env.rank}, {"role", sync::role_name(groups.role)}, {"syncs", json::array()}};
  std::vector<int32_t> prompt = {2, 20, 21, 22, 23, 24, 25};
  const int greedy_tokens = 16;
  for (int64_t v = 1; v <= o.syncs; ++v) {
    json row;
    if (train) {
      auto masters = tensors_of(trainer->named_parameters());
      perturb(masters, v);
      if (reporter && groups.node == 0) {
        json sums = json::array();  // lane-major: every lane's slice of every tensor
        for (int lane = 0; lane < tp; ++lane) {
          for (size_t i = 0; i < masters.size(); ++i) {
            sums.push_back(std::to_string(
                sync::checksum_bytes(slice_of(lane, static_cast<int64_t>(i), masters[i])
                                         .to(edtype)
                                         .contiguous()
                                         .cpu())));
          }
        }
        coord.publish_result("checksums", fmt::format("v{}", v), sums.dump());
      }
      bool flat = !trainer_buckets.empty() && o.sync.mode == sync::SyncMode::kBucket;
      ws.wait_requested(v, Clock::now() + o.timeout);  // the job's handshake
      auto st = tp > 1 ? ws.send_lanes(masters, slice_of, v)
                : flat ? ws.send_buckets(trainer_buckets, v)
                       : ws.send(masters, v);
      row = stats_json(st);
    } else {
      ws.request(v);  // between two engine steps, as the RL job's engines ask
      generate_until_ready(*eng, ws, v, o.timeout, /*keep_busy=*/true);
      reset_rss_high_water();
      int64_t rss0 = current_rss_bytes();
      auto p0 = Clock::now();
      auto st = tp > 1 ? eng->receive_weight_update(ws, v) : ws.receive(eng->update_buckets(), v);
      if (tp == 1) eng->apply_weight_update(eng->weight_version() + 1);
      double pause = seconds_since(p0);
      int64_t extra_rss = std::max<int64_t>(0, rss_high_water_bytes() - rss0);
      // Bit-identity: every engine tensor against the trainer's checksum of the same tensor.
      auto want = json::parse(coord.wait_result("checksums", fmt::format("v{}", v),
                                                Clock::now() + o.timeout, "trainer checksums"));
      // Over lanes every engine rank's slices, in lane order (its own buckets).
      std::vector<at::Tensor> views;
      for (const auto& rank_buckets :
           tp > 1 ? eng->lane_buckets()
                  : std::vector<std::vector<at::Tensor>>{eng->weight_buffers()->buckets()}) {
        for (const at::Tensor& view : layout->views(rank_buckets)) views.push_back(view);
      }
      std::vector<std::string> differ;
      for (size_t i = 0; i < views.size(); ++i) {
        if (std::to_string(sync::checksum_bytes(views[i].cpu())) != want[i].get<std::string>()) {
          const size_t n = layout->specs().size();
          differ.push_back(tp > 1 ? fmt::format("{} (rank {})", layout->specs()[i % n].name, i / n)
                                  : layout->specs()[i].name);
        }
      }
      row = stats_json(st);
      row["pause_s"] = pause;
      row["extra_rss"] = extra_rss;
      row["tensors"] = views.size();
      row["identical"] = views.size() - differ.size();
      row["differ"] = differ;
      row["engine_version"] = eng->weight_version();
    }
    report["syncs"].push_back(row);
  }
  // Greedy output of the trainer's model against the engine's, after the last sync.
  if (train && reporter && groups.node == 0) {
    auto ref = greedy_reference(*trainer, edtype, prompt, greedy_tokens);
    coord.publish_result("greedy", "tokens", json(ref).dump());
  } else if (!train) {
    drain(*eng);
    engine::GenerateRequest r;
    r.prompt_token_ids = prompt;
    r.params.temperature = 0;
    r.params.max_tokens = greedy_tokens;
    r.params.ignore_eos = true;
    auto out = eng->generate({r});
    auto want = json::parse(
        coord.wait_result("greedy", "tokens", Clock::now() + o.timeout, "trainer greedy output"));
    report["greedy_equal"] = out[0].outputs[0].token_ids == want.get<std::vector<int32_t>>();
    report["greedy"] = out[0].outputs[0].token_ids;
    report["greedy_weight_version"] = out[0].weight_version;
  }
  coord.publish(0, env.rank, report.dump());
  if (env.rank != 0) return 0;

  // World rank 0 (an infer rank) prints the table.
  json all = parse_reports(coord.collect(0, env.world_size, o.timeout));
  int64_t buckets = static_cast<int64_t>(layout->buckets().size());
  bool identical = true, colls_ok = true;
  int64_t max_extra_rss = 0;
  const bool ipc = ws.transport(0) == sync::SyncTransport::kIpc;
  fmt::print(
      "sync-check: {} node(s) x ({} infer{} + {} train), {}, mode {}, transport {} ({}), {} "
      "buckets of <= {}, {} tensors, {}{}, device {}\n",
      topo.nnodes, topo.infer_per_node,
      tp > 1 ? fmt::format(" of {} tensor-parallel ranks", tp) : "", topo.train_per_node,
      topo.layout_name(), sync::sync_mode_name(o.sync.mode),
      sync::sync_transport_name(ws.transport(0)),
      ipc ? "one device copy per bucket" : groups.world->backend(), buckets,
      format_bytes(o.bucket_bytes), layout->specs().size(), format_bytes(layout->total_bytes()),
      tp > 1 ? fmt::format(" an engine rank (its slices, over a lane of its own)") : "",
      engine_config.device);
  fmt::print("{:>4} {:>6} {:>5} {:>10} {:>6} {:>11} {:>8} {:>10} {:>10} {:>12}\n", "rank", "role",
             "sync", "bytes", "colls", "transfer ms", "GB/s", "pause ms", "extra RSS", "identical");
  for (int v = 1; v <= o.syncs; ++v) {
    // Per node: fan-out, its train ranks share the buckets; paired, each sends them all.
    std::vector<int64_t> train_colls(topo.nnodes, 0);
    for (const auto& r : all) {
      const json& s = r["syncs"][v - 1];
      bool infer = r["role"] == "infer";
      double t = s["transfer_s"].get<double>();
      fmt::print(
          "{:>4} {:>6} {:>5} {:>10} {:>6} {:>11.2f} {:>8.2f} {:>10} {:>10} {:>12}\n",
          r["rank"].get<int>(), r["role"].get<std::string>(), v, s["bytes"].get<int64_t>(),
          s["collectives"].get<int64_t>(), t * 1e3,
          t > 0 ? s["bytes"].get<int64_t>() / t / 1e9 : 0.0,
          infer ? fmt::format("{:.2f}", s["pause_s"].get<double>() * 1e3) : "-",
          infer ? format_bytes(s["extra_rss"].get<double>()) : "-",
          infer ? fmt::format("{}/{}", s["identical"].get<int64_t>(), s["tensors"].get<int64_t>())
                : "-");
      if (infer) {
        identical &= s["identical"] == s["tensors"];
        max_extra_rss = std::max(max_extra_rss, s["extra_rss"].get<int64_t>());
        if (o.sync.mode == sync::SyncMode::kBucket) colls_ok &= s["collectives"] == tp * buckets;
        if (!s["differ"].empty()) {
          fmt::print("     differing tensors on rank {}: {}\n", r["rank"].get<int>(),
                     s["differ"].dump());
        }
      } else {
        train_colls[topo.node_of(r["rank"].get<int>())] += s["collectives"].get<int64_t>();
      }
    }
    for (int64_t c : train_colls) {
      if (o.sync.mode == sync::SyncMode::kBucket) {
        colls_ok &= c == (topo.paired ? topo.train_per_node : 1) * tp * buckets;
      }
    }
  }
  bool greedy = true;
  for (const auto& r : all) {
    if (r["role"] == "infer") greedy &= r["greedy_equal"].get<bool>();
  }
  bool ok = identical && colls_ok && greedy;
  fmt::print("engine weights bit-identical to the trainer's: {}\n", identical ? "yes" : "NO");
  if (o.sync.mode == sync::SyncMode::kBucket) {
    fmt::print("{} per sync == buckets ({}{}) on every rank: {}\n",
               ipc ? "ipc bucket hand-overs" : "collectives", buckets,
               tp > 1 ? fmt::format(" x {} lanes", tp) : "", colls_ok ? "yes" : "NO");
  }
  fmt::print("greedy output equal to the trainer model's: {}\n", greedy ? "yes" : "NO");
  // In-place receive: a receiver's resident memory grows by less than one bucket during a sync.
  bool memory_ok = max_extra_rss <= layout->max_bucket_nbytes();
  fmt::print("receiver peak extra memory {} <= one bucket ({}): {}\n", format_bytes(max_extra_rss),
             format_bytes(layout->max_bucket_nbytes()), memory_ok ? "yes" : "NO");
  ok &= memory_ok;
  fmt::print("sync-check: {}\n", ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  if (!ok) throw std::runtime_error("sync-check failed (see the table above)");
  return 0;
}

}  // namespace crl::bench
