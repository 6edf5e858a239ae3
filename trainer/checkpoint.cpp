#include "trainer/checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/check.h"
#include "common/file_util.h"
#include "engine/model/lora.h"
#include "engine/model/model_writer.h"
#include "engine/model/safetensors.h"

namespace crl::trainer {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr int kFormat = 1;
}

void save_checkpoint(Trainer& trainer, const std::string& dir, const std::string& tokenizer_source,
                     const json& extra, bool merged) {
  const bool writer = trainer.is_group_leader();
  const LoraTrainOptions& lora = trainer.options().lora;
  if (merged && (!lora.enabled() || tokenizer_source.empty())) {
    CRL_INVALID(
        "save_checkpoint: a merged model needs a LoRA trainer and the base model directory");
  }
  engine::LoraAdapter adapter;
  engine::NamedTensors weights;
  if (lora.enabled()) {
    adapter = trainer.lora_adapter(writer);
  } else {
    weights = trainer.master_weights(writer);
  }
  int64_t adam_step = 0;
  engine::NamedTensors opt = trainer.optimizer_state(&adam_step, writer);
  if (!writer) return;
  const fs::path target = fs::absolute(dir);
  if (fs::exists(target) && !fs::is_empty(target) && !fs::exists(target / "trainer_state.json")) {
    CRL_INVALID("save_checkpoint: ", target.string(),
                " exists and is not a checkpoint (no trainer_state.json); refusing to replace it");
  }
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = target.string() + ".tmp." + pid;
  fs::remove_all(tmp);

  // A save that fails (disk full, ...) leaves nothing behind: the partial directory goes, and
  // the last good checkpoint stays where it was.
  try {
    for (auto& [name, m] : weights) m = m.to(at::kCPU, at::kFloat).contiguous();
    engine::ModelConfig config = trainer.config();
    config.torch_dtype = "float32";
    if (lora.enabled()) {  // the adapter alone, as PEFT writes it; the base stays where it is
      fs::create_directories(tmp);
      engine::save_peft_adapter(adapter, tmp.string(), tokenizer_source);
      if (merged)
        engine::write_merged_lora_model(tokenizer_source, tmp.string(), (tmp / "merged").string());
    } else if (!tokenizer_source.empty()) {
      engine::write_model_dir(tmp.string(), config, weights, tokenizer_source);
    } else {
      fs::create_directories(tmp);
      crl::write_file_atomic((tmp / "config.json").string(), engine::model_config_to_json(config));
      engine::save_checkpoint(tmp.string(), weights);
    }

    engine::write_safetensors((tmp / "optimizer.safetensors").string(), opt);
    json state = {{"format", kFormat},
                  {"step", trainer.step()},
                  {"adam_step", adam_step},
                  {"reference_model_dir", trainer.options().reference_model_dir},
                  {"zero_stage", trainer.options().zero_stage},
                  {"train_ranks", trainer.options().group ? trainer.options().group->size() : 1},
                  {"layout_hash", fmt::format("{:016x}", trainer.layout().hash())},
                  {"extra", extra}};
    if (lora.enabled()) {
      state["lora"] = {{"rank", lora.rank},
                       {"alpha", lora.alpha},
                       {"targets", lora.targets},
                       {"base_model", tokenizer_source}};
    }
    crl::write_file_atomic((tmp / "trainer_state.json").string(), state.dump(2) + "\n");

    const fs::path old = target.string() + ".old." + pid;
    std::error_code ec;
    if (fs::exists(target)) {
      fs::remove_all(old);
      fs::rename(target, old, ec);
      if (ec)
        throw std::runtime_error("cannot move " + target.string() + " aside: " + ec.message());
    }
    fs::rename(tmp, target, ec);
    if (ec) {
      std::error_code back;
      if (fs::exists(old)) fs::rename(old, target, back);  // the earlier checkpoint stays published
      throw std::runtime_error("cannot publish checkpoint " + target.string() + ": " +
                               ec.message());
    }
    fs::remove_all(old, ec);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

CheckpointState read_checkpoint_state(const std::string& dir) {
  const std::string path = dir + "/trainer_state.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
      j.value("format", 0) != kFormat) {
    throw std::runtime_error(path + ": not a format-" + std::to_string(kFormat) +
                             " trainer state (needs integer \"step\")");
  }
  CheckpointState s;
  s.step = j["step"].get<int64_t>();
  if (s.step < 0 || s.step > kMaxCheckpointStep) {
    throw std::runtime_error(path + ": \"step\" " + std::to_string(s.step) + " is outside [0, " +
                             std::to_string(kMaxCheckpointStep) + "]");
  }
  s.reference_model_dir = j.value("reference_model_dir", std::string());
  s.extra = j.value("extra", json::object());
  s.lora = j.value("lora", json());
  return s;
}

void check_resume_shape(const CheckpointState& st, const std::string& dir,
                        const LoraTrainOptions& lora) {
  if (st.lora.is_object() && !lora.enabled()) {
    throw std::invalid_argument(fmt::format(
        "--resume {}: the checkpoint is a LoRA adapter of rank {} trained on {}; resume it with "
        "--lora-rank {} and that base as --model",
        dir, st.lora.value("rank", 0), st.lora.value("base_model", std::string("?")),
        st.lora.value("rank", 0)));
  }
  if (!st.lora.is_object() && lora.enabled()) {
    throw std::invalid_argument(fmt::format(
        "--resume {}: the checkpoint holds full-model weights, not a LoRA adapter; resume it "
        "without --lora-rank",
        dir));
  }
  if (!st.lora.is_object()) return;
  // Another adapter shape: said here, before an infer rank refuses the adapter's rank with a
  // message about its slots.
  auto sorted = [](std::vector<engine::LoraTarget> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  const int64_t rank = st.lora.value("rank", int64_t{0});
  const double alpha = st.lora.value("alpha", 0.0);
  const std::string targets = st.lora.value("targets", std::string());
  if (rank != lora.rank || alpha != lora.alpha ||
      sorted(engine::parse_lora_targets(targets)) !=
          sorted(engine::parse_lora_targets(lora.targets))) {
    throw std::invalid_argument(fmt::format(
        "--resume {}: the checkpoint's adapter has rank {}, alpha {:g}, targets {}; the run asks "
        "for "
        "--lora-rank {} --lora-alpha {:g} --lora-targets {}: resume with the checkpoint's",
        dir, rank, alpha, targets, lora.rank, lora.alpha, lora.targets));
  }
}

CheckpointState load_trainer_state(Trainer& trainer, const std::string& dir) {
  CheckpointState s = read_checkpoint_state(dir);
  std::ifstream in(dir + "/trainer_state.json");
  const json j = json::parse(in);
  const int64_t adam_step = j.value("adam_step", int64_t{0});
  check_resume_shape(s, dir, trainer.options().lora);
  if (trainer.options().lora.enabled()) {
    trainer.load_master_weights(
        engine::lora_tensors(engine::load_peft_adapter(dir, trainer.config())));
  }
  // Each rank reads its own slices out of the mapping: no full copy of the moments per rank.
  auto file = engine::SafetensorsFile::open(dir + "/optimizer.safetensors");
  trainer.load_optimizer_state(*file, adam_step, s.step);
  return s;
}

}  // namespace crl::trainer
