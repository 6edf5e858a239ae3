#include "bench/sync_job.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "bench/stats.h"
#include "common/check.h"
#include "common/units.h"
#include "engine/llm_engine.h"
#include "engine/model/config.h"
#include "engine/model/model_cache.h"
#include "engine/model/transformer.h"
#include "engine/weight_buffers.h"
#include "sync/cuda_ipc.h"
#include "sync/groups.h"
#include "sync/nccl_communicator.h"
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
    at::Tensor noise =
        at::randn(masters[i].sizes(), gen, masters[i].options().device(at::kCPU));
    masters[i].add_(noise.to(masters[i].device()), 1e-2);
  }
}

// --device cuda puts local rank r on GPU r mod the device count (select_cuda_device): with fewer
// GPUs than ranks some ranks share one, which NCCL cannot serve (the job then uses Gloo groups and
// CUDA IPC weight updates). Each process sees the same device count on one node.
bool local_ranks_share_gpu(int ranks_per_node) {
  return sync::cuda_device_count() < ranks_per_node;
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
      throw std::runtime_error(fmt::format(
          "weight sync: waited {} ms for the train ranks to start version {}", timeout.count(),
          version));
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
    at::Tensor logits = model.forward_packed(at::tensor(ids, at::kLong),
                                             {static_cast<int64_t>(ids.size())});
    int64_t next = logits[-1].argmax().item<int64_t>();
    out.push_back(static_cast<int32_t>(next));
    ids.push_back(next);
  }
  return out;
}

json gather_reports(const sync::StorePtr& store, const std::string& prefix, int world,
                    std::chrono::milliseconds timeout) {
  json all = json::array();
  auto deadline = Clock::now() + timeout;
  for (int r = 0; r < world; ++r) {
    all.push_back(json::parse(sync::store_get(store, fmt::format("{}/{}", prefix, r), deadline,
                                              fmt::format("report of rank {}", r))));
  }
  return all;
}

json stats_json(const sync::SyncStats& s) {
  return {{"version", s.version},         {"bytes", s.bytes},
          {"collectives", s.collectives}, {"transfer_s", s.transfer_s},
          {"pack_s", s.pack_s},           {"load_s", s.load_s},
          {"extra_bytes", s.extra_bytes}, {"verified", s.verified}};
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
    trainer = std::make_unique<engine::Transformer>(engine::Transformer::load(o.engine.model_dir, to));
    auto specs = engine::weight_specs(*trainer, edtype);
    if (fault.kind == "layout-mismatch" && fault.rank == env.rank) {
      specs.at(2).shape.at(0) += 1;  // as if this rank had loaded a different checkpoint
    }
    layout = std::make_unique<sync::WeightLayout>(sync::WeightLayout::plan(specs, o.bucket_bytes));
    if (edtype == at::kFloat && fault.kind != "layout-mismatch") {
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
    layout = std::make_unique<sync::WeightLayout>(eng->attach_weight_buffers(o.bucket_bytes).layout());
  }
  sync::WeightSyncOptions so = o.sync;
  so.device = device;
  if (fault.kind == "die-mid-sync" && fault.rank == env.rank) {
    so.on_bucket_posted = [](int64_t) {
      spdlog::warn("fault injection: this rank dies in the middle of a sync");
      std::raise(SIGKILL);
    };
  }
  sync::WeightSync ws(groups, world.store, *layout, so);

  json report = {{"rank", env.rank}, {"role", sync::role_name(groups.role)}, {"syncs", json::array()}};
  std::vector<int32_t> prompt = {2, 20, 21, 22, 23, 24, 25};
  const int greedy_tokens = 16;
  for (int64_t v = 1; v <= o.syncs; ++v) {
    json row;
    if (train) {
      auto masters = tensors_of(trainer->named_parameters());
      perturb(masters, v);
      if (reporter && groups.node == 0) {
        json sums = json::array();
        for (const auto& m : masters) {
          sums.push_back(std::to_string(sync::checksum_bytes(m.to(edtype).contiguous().cpu())));
        }
        sync::store_set(world.store, fmt::format("check/v{}", v), sums.dump());
      }
      bool flat = !trainer_buckets.empty() && o.sync.mode == sync::SyncMode::kBucket;
      auto st = flat ? ws.send_buckets(trainer_buckets, v) : ws.send(masters, v);
      row = stats_json(st);
    } else {
      generate_until_ready(*eng, ws, v, o.timeout, /*keep_busy=*/true);
      reset_rss_high_water();
      int64_t rss0 = current_rss_bytes();
      auto p0 = Clock::now();
      auto st = ws.receive(eng->weight_buffers()->buckets(), v);
      eng->bump_weight_version();
      double pause = seconds_since(p0);
      int64_t extra_rss = std::max<int64_t>(0, rss_high_water_bytes() - rss0);
      // Bit-identity: every engine tensor against the trainer's checksum of the same tensor.
      auto want = json::parse(sync::store_get(world.store, fmt::format("check/v{}", v),
                                              Clock::now() + o.timeout, "trainer checksums"));
      auto views = layout->views(eng->weight_buffers()->buckets());
      std::vector<std::string> differ;
      for (size_t i = 0; i < views.size(); ++i) {
        if (std::to_string(sync::checksum_bytes(views[i].cpu())) != want[i].get<std::string>()) {
          differ.push_back(layout->specs()[i].name);
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
    sync::store_set(world.store, "check/greedy", json(ref).dump());
  } else if (!train) {
    drain(*eng);
    engine::GenerateRequest r;
    r.prompt_token_ids = prompt;
    r.params.temperature = 0;
    r.params.max_tokens = greedy_tokens;
    r.params.ignore_eos = true;
    auto out = eng->generate({r});
    auto want = json::parse(sync::store_get(world.store, "check/greedy", Clock::now() + o.timeout,
                                            "trainer greedy output"));
    report["greedy_equal"] = out[0].outputs[0].token_ids == want.get<std::vector<int32_t>>();
    report["greedy"] = out[0].outputs[0].token_ids;
    report["greedy_weight_version"] = out[0].weight_version;
  }
  sync::store_set(world.store, fmt::format("report/{}", env.rank), report.dump());
  if (env.rank != 0) return 0;

  // World rank 0 (an infer rank) prints the table.
  json all = gather_reports(world.store, "report", env.world_size, o.timeout);
  int64_t buckets = static_cast<int64_t>(layout->buckets().size());
  bool identical = true, colls_ok = true;
  int64_t max_extra_rss = 0;
  const bool ipc = ws.transport(0) == sync::SyncTransport::kIpc;
  fmt::print("sync-check: {} node(s) x ({} infer + {} train), mode {}, transport {} ({}), {} "
             "buckets of <= {}, {} tensors, {}, device {}\n",
             topo.nnodes, topo.infer_per_node, topo.train_per_node,
             sync::sync_mode_name(o.sync.mode), sync::sync_transport_name(ws.transport(0)),
             ipc ? "one device copy per bucket" : groups.world->backend(), buckets,
             format_bytes(o.bucket_bytes), layout->specs().size(),
             format_bytes(layout->total_bytes()), engine_config.device);
  fmt::print("{:>4} {:>6} {:>5} {:>10} {:>6} {:>11} {:>8} {:>10} {:>10} {:>12}\n", "rank", "role",
             "sync", "bytes", "colls", "transfer ms", "GB/s", "pause ms", "extra RSS",
             "identical");
  for (int v = 1; v <= o.syncs; ++v) {
    std::vector<int64_t> train_colls(topo.nnodes, 0);  // per node: they share the buckets
    for (const auto& r : all) {
      const json& s = r["syncs"][v - 1];
      bool infer = r["role"] == "infer";
      double t = s["transfer_s"].get<double>();
      fmt::print("{:>4} {:>6} {:>5} {:>10} {:>6} {:>11.2f} {:>8.2f} {:>10} {:>10} {:>12}\n",
                 r["rank"].get<int>(), r["role"].get<std::string>(), v,
                 s["bytes"].get<int64_t>(), s["collectives"].get<int64_t>(), t * 1e3,
                 t > 0 ? s["bytes"].get<int64_t>() / t / 1e9 : 0.0,
                 infer ? fmt::format("{:.2f}", s["pause_s"].get<double>() * 1e3) : "-",
                 infer ? format_bytes(s["extra_rss"].get<double>()) : "-",
                 infer ? fmt::format("{}/{}", s["identical"].get<int64_t>(),
                                     s["tensors"].get<int64_t>())
                       : "-");
      if (infer) {
        identical &= s["identical"] == s["tensors"];
        max_extra_rss = std::max(max_extra_rss, s["extra_rss"].get<int64_t>());
        if (o.sync.mode == sync::SyncMode::kBucket) colls_ok &= s["collectives"] == buckets;
        if (!s["differ"].empty()) {
          fmt::print("     differing tensors on rank {}: {}\n", r["rank"].get<int>(),
                     s["differ"].dump());
        }
      } else {
        train_colls[topo.node_of(r["rank"].get<int>())] += s["collectives"].get<int64_t>();
      }
    }
    for (int64_t c : train_colls) {
      if (o.sync.mode == sync::SyncMode::kBucket) colls_ok &= c == buckets;
    }
  }
  bool greedy = true;
  for (const auto& r : all) {
    if (r["role"] == "infer") greedy &= r["greedy_equal"].get<bool>();
  }
  bool ok = identical && colls_ok && greedy;
  fmt::print("engine weights bit-identical to the trainer's: {}\n", identical ? "yes" : "NO");
  if (o.sync.mode == sync::SyncMode::kBucket) {
    fmt::print("{} per sync == buckets ({}) on every rank: {}\n",
               ipc ? "ipc bucket hand-overs" : "collectives", buckets, colls_ok ? "yes" : "NO");
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

namespace {

void wait_ready_idle(const sync::WeightSync& ws, int64_t version, std::chrono::milliseconds timeout) {
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
  sync::World world = sync::join_world(
      env, o.timeout,
      sync::resolve_comm_backend(
          "auto", cuda, cuda && local_ranks_share_gpu(o.infer_per_node + o.train_per_node)));
  sync::Topology topo{env.nnodes, o.infer_per_node, o.train_per_node};
  sync::Groups groups = sync::make_groups(std::move(world.comm), topo);
  const bool train = groups.role == sync::Role::kTrain;
  const bool first_train = train && topo.role_index(env.rank) == 0;
  const at::ScalarType edtype = engine::parse_dtype(o.engine_dtype);
  engine::ModelConfig cfg = engine::preset_config(o.shape);

  std::vector<at::Tensor> masters;
  std::unique_ptr<engine::LlmEngine> eng;
  std::unique_ptr<sync::WeightLayout> layout;
  std::vector<at::Tensor> flat_masters;  // the trainer's parameters as bucket storage
  if (train) {
    std::vector<sync::TensorSpec> specs;
    for (const auto& p : engine::model_param_specs(cfg)) specs.push_back({p.name, p.shape, edtype});
    layout = std::make_unique<sync::WeightLayout>(sync::WeightLayout::plan(specs, o.bucket_bytes));
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
    eng = std::make_unique<engine::LlmEngine>(ec);
    layout = std::make_unique<sync::WeightLayout>(eng->attach_weight_buffers(o.bucket_bytes).layout());
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
      lora_layout = std::make_unique<sync::WeightLayout>(
          sync::WeightLayout::plan(engine::tensor_specs(engine::lora_tensors(ad), edtype), o.bucket_bytes));
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
          eng->attach_lora_buffers("policy", ad, o.bucket_bytes).layout());
    }
  }
  sync::WeightSyncOptions bucket_opts;
  bucket_opts.device = device;
  sync::WeightSyncOptions pt_opts = bucket_opts;
  pt_opts.mode = sync::SyncMode::kPerTensor;
  sync::WeightSync ws(groups, world.store, *layout, bucket_opts);
  sync::WeightSync ws_pt(groups, world.store, *layout, pt_opts);
  std::unique_ptr<sync::WeightSync> ws_lora;
  if (lora_layout) {
    sync::WeightSyncOptions lora_opts = bucket_opts;
    lora_opts.scope = "lora";
    ws_lora = std::make_unique<sync::WeightSync>(groups, world.store, *lora_layout, lora_opts);
  }
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
      } else if (mode == lora_mode) {
        if (train) {
          st = lora_flat.empty() ? ws_lora->send(lora_masters, v) : ws_lora->send_buckets(lora_flat, v);
        } else {
          wait_ready_idle(*ws_lora, v, o.timeout);
          reset_rss_high_water();
          const int64_t rss0 = current_rss_bytes();
          auto p0 = Clock::now();
          st = ws_lora->receive(eng->lora_buffers()->buckets(), v);
          eng->load_lora_buffers();  // into the adapter's slot: part of the update's pause
          eng->bump_weight_version();
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
        eng->bump_weight_version();
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
  sync::store_set(world.store, fmt::format("bench/{}", env.rank), rows.dump());
  if (env.rank != 0) return 0;

  json all = gather_reports(world.store, "bench", env.world_size, o.timeout);
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
    std::string transport = mode == "copy"        ? "-"
                            : mode == "bucket-pull" ? "ipc pull"
                            : mode == "bucket" && ipc_cast ? "ipc push"
                            : mode == "bucket"    ? sync::sync_transport_name(ws.transport(0))
                            : mode == lora_mode   ? sync::sync_transport_name(ws_lora->transport(0))
                                                  : "communicator";
    json cell = {{"shape", o.shape},
                 {"params", params},
                 {"dtype", o.engine_dtype},
                 {"topology", fmt::format("{}->{}", o.train_per_node, o.infer_per_node)},
                 {"device", device_name},
                 {"mode", mode},
                 {"transport", transport},
                 {"bytes", bytes},
                 {"buckets", (mode == lora_mode ? *lora_layout : *layout).buckets().size()},
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
      if (x["shape"] == r["shape"] && x["dtype"] == r["dtype"] &&
          x["topology"] == r["topology"] && x["mode"] == mode) {
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
    const json* model = lora ? find(r, "bucket") : nullptr;
    bool timed_pause = r["mode"] == "bucket" || r["mode"] == "per-tensor" || lora;
    out += fmt::format(
        "| {} | {:.0f}M | {} | {} | {} | {} | {:.1f} | {} | {:.2f} | {:.2f} | {} | {} | {} | {} | "
        "{} | {} | {} | {} |\n",
        r["shape"].get<std::string>(), r["params"].get<double>() / 1e6,
        r["dtype"].get<std::string>(), r["topology"].get<std::string>(),
        r["mode"].get<std::string>(), r.value("transport", std::string("communicator")),
        r["bytes"].get<double>() / 1e6, r["collectives"].get<int64_t>(), t,
        r["gb_s"].get<double>(),
        timed_pause ? fmt::format("{:.1f}", r["pause_ms"].get<double>()) : "-",
        timed_pause && t > 0 ? fmt::format("{:.2f}", r["pause_ms"].get<double>() / t) : "-",
        raw && t > 0 && !lora ? fmt::format("{:.2f}x", t / (*raw)["time_ms"].get<double>()) : "-",
        bucket && pt ? fmt::format("{:.1f}x", (*pt)["time_ms"].get<double>() / t) : "-",
        bucket && copy && t > 0
            ? fmt::format("{:.0f}%", 100 * (*copy)["time_ms"].get<double>() / t)
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
