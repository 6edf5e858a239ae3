// `colocated-rl tokenize` and `colocated-rl detokenize`: the model's tokenizer on JSON lines, one
// output line per input line, in order (for checking a tokenizer against Hugging Face's and for
// scripts that need token counts).
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "common/check.h"
#include "engine/model/model_cache.h"
#include "server/api_types.h"
#include "text/tokenizer.h"

namespace crl::app {
namespace {

using nlohmann::json;

struct TokenizeFlags {
  std::string model;  // a model or tokenizer directory, or a tokenizer file; "" = embedded default
  std::string jsonl;  // "" or "-" = standard input
  bool add_special_tokens = false;
  bool split_special_tokens = false;
  bool skip_special_tokens = false;
};

std::unique_ptr<text::Tokenizer> open_tokenizer(const std::string& model) {
  return std::make_unique<text::Tokenizer>(model.empty() ? engine::ensure_preset_model("default")
                                                         : model);
}

// Runs `fn` on every non-empty line of the input as parsed JSON, printing what it returns;
// an error names "<file>:<line>: ".
template <typename Fn>
int for_each_line(const std::string& path, Fn fn) {
  std::ifstream file;
  std::istream* in = &std::cin;
  const std::string name = path.empty() || path == "-" ? "<stdin>" : path;
  if (name != "<stdin>") {
    file.open(path, std::ios::binary);
    if (!file) CRL_INVALID("cannot open ", path);
    in = &file;
  }
  std::string line;
  int64_t n = 0;
  while (std::getline(*in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      const json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (row.is_discarded() || !row.is_object()) {
        throw std::invalid_argument(
            std::string(row.is_discarded() ? "not JSON" : "not a JSON object") +
            ": each line is an object such as {\"text\": \"...\"} ({\"ids\": [...]} for "
            "detokenize); plain text lines become those with jq -R '{text: .}'");
      }
      std::cout << fn(row).dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    } catch (const std::exception& e) {
      std::cout.flush();
      CRL_INVALID(name, ":", n, ": ", e.what());
    }
  }
  std::cout.flush();
  return 0;
}

void add_common(CLI::App* cmd, TokenizeFlags& f) {
  cmd->add_option(
      "--model", f.model,
      "model or tokenizer directory (tokenizer.json or tokenizer.model), or a tokenizer "
      "file (default: the embedded model)");
  cmd->add_option("--jsonl", f.jsonl, "input file, one JSON object per line (default: stdin)");
}

}  // namespace

Runner register_tokenize(CLI::App& app) {
  auto f = std::make_shared<TokenizeFlags>();
  auto* cmd = app.add_subcommand(
      "tokenize",
      "text to token ids: reads {\"text\": ...} lines, prints {\"ids\", \"tokens\", "
      "\"decoded\"} lines");
  add_common(cmd, *f);
  cmd->add_flag("--add-special-tokens", f->add_special_tokens,
                "add the model's special tokens (BOS, ...) as Hugging Face's tokenizer(text) does");
  cmd->add_flag("--split-special-tokens", f->split_special_tokens,
                "treat special-token literals in the text (<|im_start|>) as plain text");
  return [f]() {
    auto tok = open_tokenizer(f->model);
    text::EncodeOptions options;
    options.add_special_tokens = f->add_special_tokens;
    options.split_special_tokens = f->split_special_tokens;
    return for_each_line(f->jsonl, [&](const json& row) {
      auto it = row.find("text");
      if (it == row.end() || !it->is_string())
        throw std::invalid_argument("\"text\" must be a string");
      const std::vector<int32_t> ids = tok->encode(it->get<std::string>(), options);
      json tokens = json::array();
      for (int32_t id : ids) tokens.push_back(tok->id_to_piece(id));
      return json{{"ids", ids}, {"tokens", tokens}, {"decoded", tok->decode(ids, false)}};
    });
  };
}

Runner register_detokenize(CLI::App& app) {
  auto f = std::make_shared<TokenizeFlags>();
  auto* cmd = app.add_subcommand(
      "detokenize",
      "token ids to text: reads {\"ids\": [...]} lines (optionally \"skip_special_tokens\": true), "
      "prints {\"text\": ...} lines; special tokens are kept by default, as in /detokenize");
  add_common(cmd, *f);
  cmd->add_flag(
      "--skip-special-tokens", f->skip_special_tokens,
      "leave special tokens (BOS, <|im_end|>, ...) out of the text unless a line says otherwise");
  return [f]() {
    auto tok = open_tokenizer(f->model);
    return for_each_line(f->jsonl, [&](const json& row) {
      return json{{"text", server::detokenize_body(*tok, row, "ids", f->skip_special_tokens)}};
    });
  };
}

}  // namespace crl::app
