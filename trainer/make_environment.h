// make_environment: the environment --env names, "calculator" (the built-in tool environment,
// calculator_env.h) or a command line (a program over JSON lines, process_env.h; --env-procs > 1
// runs a pool of them), wrapped in DelayedEnv when EnvOptions injects step latency. Its own file
// so that environment.h, which the implementations include, includes none of them.
#pragma once

#include <memory>
#include <string>

#include "trainer/environment.h"

namespace crl::trainer {

// Throws std::invalid_argument for an empty spec or --env-procs < 1.
std::unique_ptr<Environment> make_environment(const std::string& spec, const EnvOptions& options);

}  // namespace crl::trainer
