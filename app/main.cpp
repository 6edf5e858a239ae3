// colocated-rl: parse flags, dispatch to a subcommand. Thin by design (STYLE.md §1).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <exception>
#include <iostream>
#include <map>

#include "app/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"colocated-rl: RL post-training of LLMs with colocated generation engines"};
  app.require_subcommand(1);
  std::map<CLI::App*, crl::app::Runner> runners;
  auto add = [&](crl::app::Runner (*reg)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    crl::app::Runner r = reg(app);
    auto subs = app.get_subcommands({});
    if (subs.size() > before) runners[subs.back()] = std::move(r);
  };
  add(crl::app::register_make_model);
  add(crl::app::register_generate);
  add(crl::app::register_bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
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
