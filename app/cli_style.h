// How every subcommand's command line looks and fails (issue 52): help in option groups wrapped
// at 100 columns, ranges said in words, unknown commands and flags answered with the nearest
// known one, `--version`, `--config FILE`, and the model directory checked once with a hint for
// Hugging Face hub ids.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace crl::app {

// Help lines at most this wide (descriptions wrap under their column).
inline constexpr int kHelpColumns = 100;

// The formatter every (sub)command uses: install on the app before subcommands are added (they
// copy it).
void install_help_formatter(CLI::App& app);

// Range checks whose error says the range in words ("--gpus-infer: 0 is out of range: give a
// whole number >= 1") and whose help adds nothing to the type.
CLI::Validator at_least(double min);
CLI::Validator positive();  // > 0
CLI::Validator in_range(double min, double max);

// The option group titles, one per kind of flag, in the order help shows them.
inline constexpr const char* kGroupModel = "Model and devices";
inline constexpr const char* kGroupData = "Data and rewards";
inline constexpr const char* kGroupRl = "RL (SFT warm-up, GRPO, optimizer)";
inline constexpr const char* kGroupEngine = "Engine and sampling";
inline constexpr const char* kGroupDist = "Distributed and weight sync";
inline constexpr const char* kGroupOutput = "Output, checkpoints and serving";
inline constexpr const char* kGroupEnv = "Multi-turn environments";
inline constexpr const char* kGroupLora = "LoRA";

// The name of `candidates` closest to `word` (edit distance, at most a third of its length, or a
// prefix), or "" when none is close.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

// After a parse with allow_extras: the first argument no option of the parsed (sub)command took,
// as an error naming it (in the order typed) and the nearest flag; "" when every argument was
// taken.
std::string unexpected_arguments_error(const CLI::App& app);

// "colocated-rl trian": the error for an unknown command, with the nearest one.
std::string unknown_command_error(const CLI::App& app, const std::string& word);

// `--config FILE` (or --config=FILE) anywhere in `args` before a "--" (argv, the command words
// from [1]): the flags of the TOML or INI file, one `name = value` a line without the dashes
// (`steps = 60`, `data = "task.jsonl"`, `deterministic = true`, `env-pass = ["A", "B"]`; a
// [COMMAND] section, [bench.rollout] for a nested one, applies to that command only), put after
// the command words as --name=value; a flag also given on the command line keeps the command
// line's value. Throws std::invalid_argument naming the file when it cannot be read, or when
// --config is given twice.
std::vector<std::string> expand_config_file(const std::vector<std::string>& args);
inline constexpr const char* kConfigHelp =
    "FILE: flags from a TOML or INI file, one a line without the dashes (steps = 60, data = "
    "\"task.jsonl\"); flags on the command line win";

// "colocated-rl <version> (commit ..., <build type>, CUDA on|off)".
std::string version_string();

// A --model value that is no model directory: an error naming the flag and what is wrong (no such
// directory, a hub id to download first, no config.json); nothing when it is one.
void check_model_dir(const std::string& flag, const std::string& dir);

// --device cuda on a build without CUDA: one line saying so and what to do.
void check_device_available(const std::string& device);

}  // namespace crl::app
