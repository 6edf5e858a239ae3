#include "trainer/make_environment.h"

#include <stdexcept>

#include "trainer/calculator_env.h"
#include "trainer/process_env.h"

namespace crl::trainer {

std::unique_ptr<Environment> make_environment(const std::string& spec, const EnvOptions& options) {
  if (spec.empty())
    throw std::invalid_argument("--env: empty environment (calculator, or a command)");
  std::unique_ptr<Environment> env;
  if (spec == "calculator") {
    env = std::make_unique<CalculatorEnv>(options);
  } else {
    if (options.processes < 1) throw std::invalid_argument("--env-procs must be >= 1");
    if (options.processes == 1) {
      env = std::make_unique<ProcessEnv>(spec, options);
    } else {
      env = std::make_unique<ProcessEnvPool>(spec, options);
    }
  }
  if (options.latency_max_ms > 0) env = std::make_unique<DelayedEnv>(std::move(env), options);
  return env;
}

}  // namespace crl::trainer
