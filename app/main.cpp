// colocated-rl: parse flags, dispatch to a subcommand. Thin by design (STYLE.md §1).
#include <dlfcn.h>
#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <vector>

#include "app/cli_style.h"
#include "app/commands.h"
#include "app/launcher.h"
#include "engine/kernels/cpu_isa.h"

// Settings libgomp and OpenBLAS read once, when they are loaded: the process re-executes itself
// once with them (the launcher's ranks inherit them), unless the user set them.
// - libgomp's default spin (~300k iterations before sleeping) makes idle OpenMP threads compete
//   with OpenBLAS's own threads for the cores: decode was 6x slower on 2 cores. Fully passive
//   threads cost a futex wake-up per parallel region (batch-1 decode 1.7x slower). A short spin
//   (GOMP_SPINCOUNT=5000) measured best for both (unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set).
// - OpenBLAS's kernels where it chose ones below the CPU's path (kernels::openblas_core_for: SSE3
//   on Intel Xeons Debian's OpenBLAS does not know), unless OPENBLAS_CORETYPE is set; the RL job
//   and the benchmarks say so (kernels::openblas_raise_note, from CRL_OPENBLAS_RAISED), a pipe's
//   output stays clean.
void tune_loaded_libraries(char** argv) {
  bool changed = false;
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT") &&
      setenv("GOMP_SPINCOUNT", "5000", 1) == 0) {  // set, or the next process would exec again
    changed = true;
  }
  using CoreName = char* (*)();
  const auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!std::getenv("OPENBLAS_CORETYPE") && corename != nullptr && corename() != nullptr) {
    crl::engine::kernels::CpuIsa isa = crl::engine::kernels::CpuIsa::kScalar;
    try {
      isa = crl::engine::kernels::active_cpu_isa();
    } catch (const std::exception&) {  // a bad CRL_CPU_ISA: said where the kernels first run
    }
    const std::string chosen = corename();
    const std::string core = crl::engine::kernels::openblas_core_for(chosen, isa);
    if (!core.empty() && setenv("OPENBLAS_CORETYPE", core.c_str(), 1) == 0 &&
        setenv("CRL_OPENBLAS_RAISED", (chosen + ":" + core).c_str(), 1) == 0) {
      changed = true;
    }
  }
  if (!changed) return;
  execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are, saying nothing
  unsetenv("CRL_OPENBLAS_RAISED");
}

// glibc serves a request over its mmap threshold with a fresh mmap and hands freed heap memory
// back to the kernel above 128 KiB; its dynamic threshold never rises above 32 MiB. Every engine
// step and training step allocates activations of a few MiB to tens of MiB, so by default the
// process page-faults the same memory in again each step, and on virtual machines a fault is
// expensive: on a 2-core cloud VM, 8 x 512-token prefill ran 1.23-1.40x faster, with half the page
// faults, once freed memory stayed in the process (measured side by side with GLIBC_TUNABLES;
// jemalloc and tcmalloc measured slower or no better). The cost: up to 1 GiB of freed memory stays
// mapped per arena for the next step. A user's own GLIBC_TUNABLES malloc settings win.
void tune_malloc() {
  if (const char* t = std::getenv("GLIBC_TUNABLES"); t && std::strstr(t, "glibc.malloc.")) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum; larger blocks are still mmapped
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int main(int argc, char** argv) {
  tune_loaded_libraries(argv);
  tune_malloc();
  // `colocated-rl --gpus-infer I --gpus-train T ...` (flags, no subcommand) is the RL job.
  std::vector<char*> args(argv, argv + argc);
  static char train[] = "train";
  if (argc > 1 && std::strncmp(argv[1], "--", 2) == 0 && std::strcmp(argv[1], "--help") != 0 &&
      std::strcmp(argv[1], "--version") != 0) {
    args.insert(args.begin() + 1, train);
  }
  // `bench rollout --multi-turn ...` is `bench multi-turn ...` (its own flags).
  static char multi_turn[] = "multi-turn";
  if (args.size() > 2 && std::strcmp(args[1], "bench") == 0 &&
      std::strcmp(args[2], "rollout") == 0) {
    auto flag = std::find_if(args.begin() + 3, args.end(),
                             [](char* a) { return std::strcmp(a, "--multi-turn") == 0; });
    if (flag != args.end()) {
      args.erase(flag);
      args[2] = multi_turn;
    }
  }
  // --config FILE: its flags, after the command.
  std::vector<std::string> expanded;
  try {
    expanded = crl::app::expand_config_file(std::vector<std::string>(args.begin(), args.end()));
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  args.clear();
  for (std::string& a : expanded) args.push_back(a.data());
  argc = static_cast<int>(args.size());
  args.push_back(nullptr);
  argv = args.data();
  crl::app::set_process_args(argc, argv);
  // A peer that died closes its sockets: report that as the failed collective, not as SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{"colocated-rl: RL post-training of LLMs with colocated generation engines"};
  app.name("colocated-rl");
  crl::app::install_help_formatter(app);  // before the subcommands: they copy it
  app.failure_message([&app](const CLI::App*, const CLI::Error& e) {
    std::string command = "colocated-rl";
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->parsed()) command += " " + sub->get_name();
    }
    return fmt::format("{} (`{} --help` lists the flags)\n", e.what(), command);
  });
  app.set_version_flag("--version", [] { return crl::app::version_string(); });
  app.require_subcommand(0, 1);
  app.footer(
      "`colocated-rl --gpus-infer I --gpus-train T [FLAGS]` (flags, no command) runs train: the "
      "RL job.\n`colocated-rl COMMAND --help` lists a command's flags.");
  std::map<CLI::App*, crl::app::Runner> runners;
  auto add = [&](crl::app::Runner (*reg)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    crl::app::Runner r = reg(app);
    auto subs = app.get_subcommands({});
    if (subs.size() > before) runners[subs.back()] = std::move(r);
  };
  add(crl::app::register_make_model);
  add(crl::app::register_merge_lora);
  add(crl::app::register_generate);
  add(crl::app::register_serve);
  add(crl::app::register_bench);
  add(crl::app::register_sync_check);
  add(crl::app::register_train);
  add(crl::app::register_plan);
  add(crl::app::register_tokenize);
  add(crl::app::register_detokenize);
  // Arguments no option takes are errors said here, in the order typed, with the nearest flag.
  app.allow_extras();
  std::string config_file;  // listed in help; read before parsing (expand_config_file)
  for (CLI::App* cmd : app.get_subcommands({})) {
    cmd->allow_extras();
    cmd->add_option("--config", config_file, crl::app::kConfigHelp);
  }
  if (argc == 1) {  // bare: what there is to do
    std::cout << app.help();
    return 0;
  }
  const std::vector<CLI::App*> commands = app.get_subcommands({});
  if (argv[1][0] != '-' && std::none_of(commands.begin(), commands.end(),
                                        [&](CLI::App* s) { return s->get_name() == argv[1]; })) {
    spdlog::error("{}", crl::app::unknown_command_error(app, argv[1]));
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (CLI::App* cmd : app.get_subcommands({})) {
    if (!cmd->parsed()) continue;
    if (const std::string err = crl::app::unexpected_arguments_error(*cmd); !err.empty()) {
      spdlog::error("{}", err);
      return 2;
    }
  }
  if (const std::string err = crl::app::unexpected_arguments_error(app); !err.empty()) {
    spdlog::error("{}", err);
    return 2;
  }
  try {
    for (auto& [cmd, run] : runners) {
      if (cmd->parsed()) return run();
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 1;
}
