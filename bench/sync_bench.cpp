// `colocated-rl bench sync`: bucket vs per-tensor vs raw broadcast (and CUDA IPC, LoRA) weight
// sync, one (shape, dtype, topology) cell per run (sync_job.h).
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench/stats.h"
#include "bench/sync_job.h"
#include "bench/sync_job_util.h"
#include "common/check.h"
#include "common/units.h"
#include "engine/llm_engine.h"
#include "engine/model/config.h"
#include "engine/model/model_cache.h"
#include "engine/model/tensor_parallel.h"
#include "engine/model/transformer.h"
#include "engine/weight_buffers.h"
#include "sync/coordinator.h"
#include "sync/cuda_ipc.h"
#include "sync/groups.h"
#include "sync/nccl_communicator.h"
#include "sync/weight_sync.h"

namespace crl::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

void wait_ready_idle(const sync::WeightSync& ws, int64_t version,
                     std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!ws.ready(version)) {
    if (Clock::now() > deadline) {
      throw std::runtime_error(fmt::format("bench sync: version {} never became ready", version));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

int run_sync_bench_rank(const sync::RankEnv& env, const SyncBenchOptions& o) {
  const bool cuda = o.device.rfind("cuda", 0) == 0;
  std::string device_name = "cpu";
  int cuda_index = -1;
  if (cuda) {
    cuda_index = sync::select_cuda_device(env.local_rank);
    device_name = fmt::format("cuda:{}", cuda_index);
  }
  const at::Device device(device_name);
  const auto on_device = at::TensorOptions().device(device);
  const int tp = o.infer_tp;
  if (tp > 1 && (cuda || o.lora_rank > 0)) {
    CRL_INVALID("bench sync --infer-tp runs on the CPU without --lora-rank (sync lanes are Gloo)");
  }
  sync::World world = sync::join_world(
      env, o.timeout,
      sync::resolve_comm_backend(
          "auto", cuda, cuda && local_ranks_share_gpu(o.infer_per_node + o.train_per_node)));
  sync::Topology topo{env.nnodes, o.infer_per_node, o.train_per_node};
  topo.lanes = tp;
  sync::Groups groups = sync::make_groups(std::move(world.comm), topo);
  const bool train = groups.role == sync::Role::kTrain;
  const bool first_train = train && topo.role_index(env.rank) == 0;
  const at::ScalarType edtype = engine::parse_dtype(o.engine_dtype);
  engine::ModelConfig cfg = engine::preset_config(o.shape);

  std::vector<at::Tensor> masters;
  std::unique_ptr<engine::LlmEngine> eng;
  std::unique_ptr<sync::WeightLayout> layout;
  std::vector<at::Tensor> flat_masters;  // the trainer's parameters as bucket storage
  // Tensor-parallel engines (--infer-tp): the "lanes" row's engine and its layout (one rank's).
  std::unique_ptr<engine::LlmEngine> lanes_eng;
  std::unique_ptr<sync::WeightLayout> lane_layout;
  if (train) {
    std::vector<sync::TensorSpec> specs, lane_specs;
    for (const auto& p : engine::model_param_specs(cfg)) {
      specs.push_back({p.name, p.shape, edtype});
      lane_specs.push_back(
          {p.name, engine::tp_slice_shape(p.name, p.shape, engine::TpShard{0, tp}), edtype});
    }
    layout = std::make_unique<sync::WeightLayout>(sync::WeightLayout::plan(specs, o.bucket_bytes));
    if (tp > 1) {
      lane_layout = std::make_unique<sync::WeightLayout>(
          sync::WeightLayout::plan(lane_specs, o.bucket_bytes));
    }
    if (edtype == at::kFloat) {
      // Same dtype on both sides: the fp32 masters live in the layout's buckets and are sent
      // from there without a copy.
      flat_masters = layout->allocate_buckets(on_device);
      masters = layout->views(flat_masters);
      for (auto& m : masters) m.normal_(0, 0.02);
    } else {
      for (const auto& sp : specs) {
        masters.push_back(at::randn(sp.shape, on_device.dtype(at::kFloat)).mul_(0.02));
      }
    }
  } else {
    engine::EngineConfig ec;
    ec.model_dir = engine::ensure_preset_model(o.shape, "bfloat16");
    ec.dtype = o.engine_dtype;
    ec.device = device_name;
    ec.num_kv_blocks = 64;
    ec.max_model_len = 256;
    if (o.lora_rank > 0) {
      ec.max_loras = 1;
      ec.max_lora_rank = static_cast<int32_t>(o.lora_rank);
    }
    ec.tensor_parallel_size = tp;
    eng = std::make_unique<engine::LlmEngine>(ec);
    if (tp > 1) {
      // Two engines, one per way of taking an update (an engine takes one).
      layout = std::make_unique<sync::WeightLayout>(eng->attach_weight_layout(o.bucket_bytes));
      lanes_eng = std::make_unique<engine::LlmEngine>(ec);
      lane_layout =
          std::make_unique<sync::WeightLayout>(lanes_eng->attach_weight_lanes(o.bucket_bytes));
    } else {
      layout =
          std::make_unique<sync::WeightLayout>(eng->attach_weight_buffers(o.bucket_bytes).layout());
    }
  }
  // The LoRA row: the adapter's tensors alone, fp32 masters on the train ranks (sent from their
  // flat storage when the dtypes match), the engine's LoRA receive buffers on the infer ranks.
  const std::string lora_mode = fmt::format("lora-r{}", o.lora_rank);
  std::unique_ptr<sync::WeightLayout> lora_layout;
  std::vector<at::Tensor> lora_masters, lora_flat;
  if (o.lora_rank > 0) {
    const engine::LoraAdapter ad = engine::make_lora_adapter(
        cfg, o.lora_rank, 32, engine::parse_lora_targets("all-linear"), 1, /*random_b=*/true);
    if (train) {
      lora_layout = std::make_unique<sync::WeightLayout>(sync::WeightLayout::plan(
          engine::tensor_specs(engine::lora_tensors(ad), edtype), o.bucket_bytes));
      if (edtype == at::kFloat) {
        lora_flat = lora_layout->allocate_buckets(on_device);
        lora_masters = lora_layout->views(lora_flat);
        const auto src = engine::lora_tensors(ad);
        for (size_t i = 0; i < src.size(); ++i) lora_masters[i].copy_(src[i].second);
      } else {
        for (const auto& [name, t] : engine::lora_tensors(ad)) lora_masters.push_back(t.to(device));
      }
    } else {
      lora_layout = std::make_unique<sync::WeightLayout>(
          eng->loras()
              .attach_policy("policy", ad, o.bucket_bytes, 1, eng->weight_version())
              .layout());
    }
  }
  sync::WeightSyncOptions bucket_opts;
  bucket_opts.device = device;
  sync::WeightSyncOptions pt_opts = bucket_opts;
  pt_opts.mode = sync::SyncMode::kPerTensor;
  sync::WeightSync ws(groups, world.store, *layout, bucket_opts);
  sync::WeightSync ws_pt(groups, world.store, *layout, pt_opts);
  // Another sync on the same groups: bucket mode, its own store keys, `lanes` lanes.
  auto another_sync = [&](const sync::WeightLayout& l, const char* scope, int lanes = 1) {
    sync::WeightSyncOptions so = bucket_opts;
    so.scope = scope;
    so.lanes = lanes;
    return std::make_unique<sync::WeightSync>(groups, world.store, l, so);
  };
  std::unique_ptr<sync::WeightSync> ws_lora, ws_lanes;
  if (lora_layout) ws_lora = another_sync(*lora_layout, "lora");
  if (lane_layout) ws_lanes = another_sync(*lane_layout, "lanes", tp);
  // Ranks sharing one GPU hand buckets over through CUDA IPC: the per-tensor and raw baselines
  // (communicator broadcasts) give way to the device's own copy bandwidth, measured on each
  // receiver as one plain device-to-device copy of the same bytes.
  const bool ipc = ws.transport(0) == sync::SyncTransport::kIpc;
  std::vector<std::string> modes = ipc ? std::vector<std::string>{"bucket", "copy"}
                                       : std::vector<std::string>{"bucket", "per-tensor", "raw"};
  // A cast over CUDA IPC pushes into the engines' buckets; "bucket-pull" is the same update the
  // other way (cast into send buffers the engines copy from), beside it.
  const bool ipc_cast = ipc && edtype != at::kFloat;  // fp32 masters are sent from flat storage
  std::unique_ptr<sync::WeightSync> ws_pull;
  if (ipc_cast) {
    sync::WeightSyncOptions pull_opts = bucket_opts;
    pull_opts.ipc_push = false;
    pull_opts.scope = "pull";
    ws_pull = std::make_unique<sync::WeightSync>(groups, world.store, *layout, pull_opts);
    modes.insert(modes.begin() + 1, "bucket-pull");
  }
  if (ws_lora) modes.insert(modes.begin() + 1, lora_mode);
  if (ws_lanes) modes = {"staged", "lanes"};
  // The baselines' flat buffers exist outside the timed region, on their senders and receivers.
  at::Tensor flat, copy_src;
  if (!train || (first_train && !ipc)) {
    flat = at::empty({layout->total_bytes()}, on_device.dtype(at::kByte));
    flat.zero_();
  }
  if (!train && ipc) copy_src = at::full({layout->total_bytes()}, 7, on_device.dtype(at::kByte));
  auto device_synchronize = [&] {
    if (cuda) sync::cuda_synchronize_device(cuda_index);
  };

  json rows = json::array();
  int64_t v = 0;
  for (const std::string& mode : modes) {
    for (int rep = -1; rep < o.repeats; ++rep) {  // rep -1: warm-up, not recorded
      groups.world->barrier();
      ++v;
      sync::SyncStats st;
      double pause = 0;
      int64_t extra_rss = 0;
      if (mode == "copy") {
        if (!train) {
          device_synchronize();
          auto c0 = Clock::now();
          flat.copy_(copy_src);
          device_synchronize();
          st.transfer_s = pause = seconds_since(c0);
          st.bytes = layout->total_bytes();
        }
      } else if (mode == "staged" || mode == "lanes") {
        const bool lanes = mode == "lanes";
        if (train) {
          const auto& lspecs = lane_layout->specs();
          const sync::LaneSlicer slice = [&](int lane, int64_t i, const at::Tensor& full) {
            return engine::tp_slice_view(lspecs[i].name, full, engine::TpShard{lane, tp});
          };
          st = lanes                  ? ws_lanes->send_lanes(masters, slice, v)
               : flat_masters.empty() ? ws.send(masters, v)
                                      : ws.send_buckets(flat_masters, v);
        } else {
          sync::WeightSync& which = lanes ? *ws_lanes : ws;
          wait_ready_idle(which, v, o.timeout);
          reset_rss_high_water();
          const int64_t rss0 = current_rss_bytes();
          auto p0 = Clock::now();
          st = (lanes ? *lanes_eng : *eng).receive_weight_update(which, v);
          pause = seconds_since(p0);
          extra_rss = std::max<int64_t>(0, rss_high_water_bytes() - rss0);
          // What the engine rank receiving the most received: the leader all of it when staged.
          if (lanes) st.bytes = *std::max_element(st.lane_bytes.begin(), st.lane_bytes.end());
        }
      } else if (mode == lora_mode) {
        if (train) {
          st = lora_flat.empty() ? ws_lora->send(lora_masters, v)
                                 : ws_lora->send_buckets(lora_flat, v);
        } else {
          wait_ready_idle(*ws_lora, v, o.timeout);
          reset_rss_high_water();
          const int64_t rss0 = current_rss_bytes();
          auto p0 = Clock::now();
          st = ws_lora->receive(eng->update_buckets(), v);
          // Into the adapter's slot: part of the update's pause.
          eng->apply_weight_update(eng->weight_version() + 1);
          pause = seconds_since(p0);
          extra_rss = std::max<int64_t>(0, rss_high_water_bytes() - rss0);
        }
      } else if (train) {
        if (mode == "bucket") {
          st = flat_masters.empty() ? ws.send(masters, v) : ws.send_buckets(flat_masters, v);
        }
        if (mode == "bucket-pull") st = ws_pull->send(masters, v);
        if (mode == "per-tensor") st = ws_pt.send(masters, v);
        if (mode == "raw" && first_train) st = ws.raw_broadcast(flat, v);
      } else {
        sync::WeightSync& which = mode == "bucket" ? ws : mode == "bucket-pull" ? *ws_pull : ws_pt;
        wait_ready_idle(which, v, o.timeout);
        reset_rss_high_water();
        int64_t rss0 = current_rss_bytes();
        auto p0 = Clock::now();
        if (mode == "bucket" || mode == "bucket-pull") {
          st = which.receive(eng->weight_buffers()->buckets(), v);
        } else if (mode == "per-tensor") {
          // OpenRLHF's loop: receive one tensor, then one load_weights call for it.
          const auto& params = eng->model().named_parameters();
          st = ws_pt.receive(eng->weight_buffers()->buckets(), v,
                             [&](int64_t i, const at::Tensor& t) { params[i].second.copy_(t); });
        } else {
          st = ws.raw_broadcast(flat, v);
        }
        // The model's weights changed (the LoRA row's policy adapter, when there is one, did not).
        eng->set_weight_version(eng->weight_version() + 1);
        pause = seconds_since(p0);
        extra_rss = std::max<int64_t>(0, rss_high_water_bytes() - rss0);
      }
      if (rep < 0) continue;
      json row = stats_json(st);
      row["mode"] = mode;
      row["pause_s"] = pause;
      row["extra_rss"] = extra_rss;
      rows.push_back(row);
    }
  }
  sync::Coordinator coord(world.store, "bench-sync");
  coord.publish(0, env.rank, rows.dump());
  if (env.rank != 0) return 0;

  json all = parse_reports(coord.collect(0, env.world_size, o.timeout));
  int64_t params = 0;
  for (const auto& p : engine::model_param_specs(cfg)) {
    int64_t n = 1;
    for (auto d : p.shape) n *= d;
    params += n;
  }
  json cells = json::array();
  for (const std::string& mode : modes) {
    std::vector<double> times, pauses;
    int64_t recv_extra = 0, send_extra = 0, colls = 0, bytes = 0;
    for (int rep = 0; rep < o.repeats; ++rep) {
      double t = 0, p = 0;
      for (int r = 0; r < env.world_size; ++r) {
        int idx = 0;
        for (const auto& row : all[r]) {
          if (row["mode"] != mode) continue;
          if (idx++ != rep) continue;
          if (topo.role_of(r) == sync::Role::kInfer) {
            t = std::max(t, row["transfer_s"].get<double>());
            p = std::max(p, row["pause_s"].get<double>());
            recv_extra = std::max(recv_extra, row["extra_rss"].get<int64_t>());
            colls = row["collectives"].get<int64_t>();
            bytes = row["bytes"].get<int64_t>();
          } else {
            send_extra = std::max(send_extra, row["extra_bytes"].get<int64_t>());
          }
        }
      }
      times.push_back(t);
      pauses.push_back(p);
    }
    double tm = median(times);
    std::string transport = mode == "copy"                 ? "-"
                            : mode == "bucket-pull"        ? "ipc pull"
                            : mode == "bucket" && ipc_cast ? "ipc push"
                            : mode == "bucket"  ? sync::sync_transport_name(ws.transport(0))
                            : mode == lora_mode ? sync::sync_transport_name(ws_lora->transport(0))
                                                : "communicator";
    json cell = {
        {"shape", o.shape},
        {"params", params},
        {"dtype", o.engine_dtype},
        {"topology", tp > 1 ? fmt::format("{}->{} (tp {})", o.train_per_node, o.infer_per_node, tp)
                            : fmt::format("{}->{}", o.train_per_node, o.infer_per_node)},
        {"device", device_name},
        {"mode", mode},
        {"transport", transport},
        {"bytes", bytes},
        {"buckets", (mode == lora_mode ? *lora_layout
                     : mode == "lanes" ? *lane_layout
                                       : *layout)
                        .buckets()
                        .size()},
        {"collectives", colls},
        {"time_ms", tm * 1e3},
        {"gb_s", tm > 0 ? bytes / tm / 1e9 : 0},
        {"pause_ms", median(pauses) * 1e3},
        {"recv_extra", recv_extra},
        {"send_extra", send_extra},
        {"repeats", o.repeats}};
    cells.push_back(cell);
  }
  std::string text;
  for (const auto& c : cells) text += c.dump() + "\n";
  if (!o.results_file.empty()) {
    std::ofstream out(o.results_file, std::ios::app);
    out << text;
  }
  std::fflush(stdout);
  return 0;
}

std::string format_sync_bench_table(const std::string& results_file) {
  std::ifstream in(results_file);
  std::vector<json> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(json::parse(line));
  }
  auto find = [&](const json& r, const char* mode) -> const json* {
    for (const auto& x : rows) {
      if (x["shape"] == r["shape"] && x["dtype"] == r["dtype"] && x["topology"] == r["topology"] &&
          x["mode"] == mode) {
        return &x;
      }
    }
    return nullptr;
  };
  std::string out = fmt::format(
      "| model | params | dtype | train->infer | mode | transport | MB | colls | time ms | GB/s "
      "per receiver | pause ms | pause/transfer | vs raw | per-tensor/bucket | of device copy | "
      "recv extra | send extra | of model sync |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& r : rows) {
    if (r.contains("skipped")) {
      out += fmt::format("| {} | | {} | {} | skipped: {} | | | | | | | | | | | | | |\n",
                         r["shape"].get<std::string>(), r["dtype"].get<std::string>(),
                         r["topology"].get<std::string>(), r["skipped"].get<std::string>());
      continue;
    }
    const json* raw = find(r, "raw");
    const json* pt = find(r, "per-tensor");
    const json* copy = find(r, "copy");
    double t = r["time_ms"].get<double>();
    bool bucket = r["mode"] == "bucket";
    const bool lora = r["mode"].get<std::string>().rfind("lora", 0) == 0;
    // The LoRA row against the whole model's, the lanes row against the staged update.
    const json* model = lora                   ? find(r, "bucket")
                        : r["mode"] == "lanes" ? find(r, "staged")
                                               : nullptr;
    bool timed_pause = r["mode"] == "bucket" || r["mode"] == "per-tensor" || lora ||
                       r["mode"] == "staged" || r["mode"] == "lanes";
    out += fmt::format(
        "| {} | {:.0f}M | {} | {} | {} | {} | {:.1f} | {} | {:.2f} | {:.2f} | {} | {} | {} | {} | "
        "{} | {} | {} | {} |\n",
        r["shape"].get<std::string>(), r["params"].get<double>() / 1e6,
        r["dtype"].get<std::string>(), r["topology"].get<std::string>(),
        r["mode"].get<std::string>(), r.value("transport", std::string("communicator")),
        r["bytes"].get<double>() / 1e6, r["collectives"].get<int64_t>(), t, r["gb_s"].get<double>(),
        timed_pause ? fmt::format("{:.1f}", r["pause_ms"].get<double>()) : "-",
        timed_pause && t > 0 ? fmt::format("{:.2f}", r["pause_ms"].get<double>() / t) : "-",
        raw && t > 0 && !lora ? fmt::format("{:.2f}x", t / (*raw)["time_ms"].get<double>()) : "-",
        bucket && pt ? fmt::format("{:.1f}x", (*pt)["time_ms"].get<double>() / t) : "-",
        bucket && copy && t > 0 ? fmt::format("{:.0f}%", 100 * (*copy)["time_ms"].get<double>() / t)
                                : "-",
        format_bytes(r["recv_extra"].get<double>()), format_bytes(r["send_extra"].get<double>()),
        model && (*model)["time_ms"].get<double>() > 0
            ? fmt::format("{:.1f}% of the time, {:.2f}% of the bytes",
                          100 * t / (*model)["time_ms"].get<double>(),
                          100 * r["bytes"].get<double>() / (*model)["bytes"].get<double>())
            : "-");
  }
  return out;
}

}  // namespace crl::bench
