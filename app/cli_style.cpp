#include "app/cli_style.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "crl_version.h"

namespace crl::app {
namespace {

// Words of `text` in lines of at most `width` columns (a word longer than that stands alone);
// the text's own line breaks are kept.
std::string wrap(const std::string& text, size_t width) {
  std::string out;
  std::istringstream paragraphs(text);
  std::string paragraph;
  bool first_paragraph = true;
  while (std::getline(paragraphs, paragraph)) {
    if (!first_paragraph) out += '\n';
    first_paragraph = false;
    std::istringstream words(paragraph);
    std::string word;
    size_t line = 0;
    while (words >> word) {
      if (line > 0 && line + 1 + word.size() > width) {
        out += '\n';
        line = 0;
      } else if (line > 0) {
        out += ' ';
        ++line;
      }
      out += word;
      line += word.size();
    }
  }
  return out;
}

class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(32); }
  std::string make_option(const CLI::Option* opt, bool is_positional) const override {
    std::stringstream out;
    const size_t width = static_cast<size_t>(kHelpColumns) - get_column_width();
    CLI::detail::format_help(out, make_option_name(opt, is_positional) + make_option_opts(opt),
                             wrap(make_option_desc(opt), width), get_column_width());
    return out.str();
  }
  std::string make_description(const CLI::App* app) const override {
    const std::string d = app->get_description();
    return d.empty() ? "" : wrap(d, kHelpColumns) + "\n";
  }
  std::string make_subcommand(const CLI::App* sub) const override {
    std::stringstream out;
    const size_t width = static_cast<size_t>(kHelpColumns) - get_column_width();
    CLI::detail::format_help(out, sub->get_display_name(), wrap(sub->get_description(), width),
                             get_column_width());
    return out.str();
  }
};

// Edits (insert, delete, replace, swap two neighbours) that turn a into b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// Prints a number as typed ("1", "0.001", "86400").
std::string plain(double x) {
  if (x == std::floor(x) && std::abs(x) < 1e15) return fmt::format("{}", static_cast<int64_t>(x));
  return fmt::format("{:g}", x);
}

// A validator that reads the value as a number and refuses it, saying `words`, unless ok(x).
template <typename Ok>
CLI::Validator number_validator(Ok ok, const std::string& words, const char* name) {
  return CLI::Validator(
      [ok, words](std::string& value) -> std::string {
        double x = 0;
        size_t used = 0;
        try {
          x = std::stod(value, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != value.size() || value.empty() || !std::isfinite(x)) {
          return "'" + value + "' is not a number";
        }
        if (!ok(x)) return value + " is out of range: give " + words;
        return "";
      },
      "", name);
}

CLI::Validator range_validator(double min, double max, const std::string& words) {
  return number_validator([min, max](double x) { return x >= min && x <= max; }, words, "range");
}

// The long names of every option of `app` ("--steps").
std::vector<std::string> flag_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
  }
  return names;
}

}  // namespace

void install_help_formatter(CLI::App& app) { app.formatter(std::make_shared<HelpFormatter>()); }

CLI::Validator at_least(double min) {
  const bool whole = min == std::floor(min);
  return range_validator(
      min, std::numeric_limits<double>::max(),
      fmt::format("{} >= {}", whole ? "a whole number" : "a number", plain(min)));
}

CLI::Validator positive() {
  return number_validator([](double x) { return x > 0; }, "a number > 0", "positive");
}

CLI::Validator in_range(double min, double max) {
  return range_validator(min, max, fmt::format("a number from {} to {}", plain(min), plain(max)));
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = word.size() / 3 + 1;
  for (const std::string& c : candidates) {
    if (c.size() > word.size() && c.compare(0, word.size(), word) == 0 && word.size() >= 3) {
      return c;  // a prefix: --lor -> --lora-rank
    }
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string unexpected_arguments_error(const CLI::App& app) {
  const std::vector<std::string> rest = app.remaining();
  if (rest.empty()) return "";
  const std::string& first = rest.front();
  std::string name = first.substr(0, first.find('='));
  std::string msg;
  if (name.rfind("--", 0) == 0) {
    msg = fmt::format("unknown flag {}", name);
    const std::string near = nearest(name, flag_names(app));
    if (!near.empty()) msg += fmt::format(" (did you mean {}?)", near);
  } else {
    msg = fmt::format("unexpected argument '{}' (a flag's value goes after the flag)", first);
  }
  if (rest.size() > 1) {
    std::string all;
    for (const std::string& r : rest) all += (all.empty() ? "" : " ") + r;
    msg += fmt::format("; not understood: {}", all);
  }
  const std::string path =
      app.get_parent() ? "colocated-rl " + app.get_name() + " --help" : "colocated-rl --help";
  return msg + fmt::format("; `{}` lists every flag", path);
}

std::string unknown_command_error(const CLI::App& app, const std::string& word) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  std::string msg = fmt::format("unknown command '{}'", word);
  const std::string near = nearest(word, names);
  if (!near.empty()) msg += fmt::format(" (did you mean '{}'?)", near);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return msg + "; commands: " + list + "; `colocated-rl --help` says what each does";
}

std::vector<std::string> expand_config_file(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  std::string path;
  bool rest = false;  // after "--": nothing is a flag
  for (size_t i = 0; i < args.size(); ++i) {
    const bool config = !rest && (args[i] == "--config" || args[i].rfind("--config=", 0) == 0);
    if (!rest && args[i] == "--") rest = true;
    if (!config) {
      out.push_back(args[i]);
      continue;
    }
    if (!path.empty()) throw std::invalid_argument("--config is given twice: give one file");
    if (args[i] == "--config") {
      if (i + 1 >= args.size()) throw std::invalid_argument("--config needs a FILE");
      path = args[++i];
    } else {
      path = args[i].substr(9);
    }
    if (path.empty()) throw std::invalid_argument("--config needs a FILE");
  }
  if (path.empty()) return out;
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("--config {}: {}", path, e.what()));
  }
  // The command's words ("bench rollout"): the file's flags go after them, and a section applies
  // when it names them ([train], [bench.rollout]).
  size_t words = 1;
  while (words < out.size() && !out[words].empty() && out[words][0] != '-') ++words;
  const std::vector<std::string> command(out.begin() + std::min<size_t>(1, out.size()),
                                         out.begin() + static_cast<std::ptrdiff_t>(words));
  auto given = [&](const std::string& flag) {
    return std::any_of(out.begin(), out.end(), [&](const std::string& a) {
      return a == flag || a.rfind(flag + "=", 0) == 0;
    });
  };
  std::vector<std::string> added;
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // section markers
    if (!item.parents.empty() && item.parents != command) continue;
    const std::string flag = "--" + item.name;
    if (given(flag)) continue;
    // --name=value: a value may start with '-', and a flag's false turns it off.
    for (const std::string& v : item.inputs) added.push_back(flag + "=" + v);
  }
  out.insert(out.begin() + static_cast<std::ptrdiff_t>(words), added.begin(), added.end());
  return out;
}

std::string version_string() {
#ifdef CRL_WITH_CUDA
  const char* cuda =
      at::hasCUDA() ? "GPU path: CUDA kernels" : "GPU path built, libtorch without CUDA";
#else
  const char* cuda = "CPU path: no CUDA";
#endif
  return fmt::format("colocated-rl {} (commit {}, {} build, {}, libtorch {})", CRL_VERSION,
                     CRL_GIT_COMMIT, CRL_BUILD_TYPE[0] ? CRL_BUILD_TYPE : "default", cuda,
                     TORCH_VERSION);
}

void check_model_dir(const std::string& flag, const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    static const std::regex kHubId(R"([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)");
    if (std::regex_match(dir, kHubId)) {
      std::string local = dir.substr(dir.find('/') + 1);
      std::transform(local.begin(), local.end(), local.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      throw std::invalid_argument(fmt::format(
          "{} {}: no such directory; it looks like a Hugging Face hub id, and models are read "
          "from local directories only: download it first (`huggingface-cli download {} "
          "--local-dir {}`) and pass {} {}",
          flag, dir, dir, local, flag, local));
    }
    throw std::invalid_argument(fmt::format("{} {}: no such directory", flag, dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    throw std::invalid_argument(
        fmt::format("{} {}: not a directory (a Hugging Face model directory: config.json, "
                    "*.safetensors, tokenizer files)",
                    flag, dir));
  }
  if (::stat((dir + "/config.json").c_str(), &st) != 0) {
    throw std::invalid_argument(
        fmt::format("{} {}: no config.json there; a Hugging Face model directory holds "
                    "config.json, *.safetensors and the tokenizer files",
                    flag, dir));
  }
}

void check_device_available(const std::string& device) {
  if (device.rfind("cuda", 0) != 0 || at::hasCUDA()) return;
#ifdef CRL_WITH_CUDA
  throw std::invalid_argument(fmt::format(
      "--device {}: no CUDA device is usable here (no GPU, or CUDA_VISIBLE_DEVICES hides them); "
      "use --device cpu",
      device));
#else
  throw std::invalid_argument(fmt::format(
      "--device {}: this build has no CUDA (the CPU path, or a libtorch without CUDA); build the "
      "GPU path (docs/building.md) or use --device cpu",
      device));
#endif
}

}  // namespace crl::app
