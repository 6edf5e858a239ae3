#include "app/rl_job.h"

#include <fmt/format.h>

#include <memory>
#include <thread>

#include "app/cli_style.h"
#include "engine/engine_loop.h"
#include "server/api_server.h"
#include "trainer/job_report.h"
#include "trainer/rollout_consumer.h"
#include "trainer/rollout_producer.h"

namespace crl::app {

int run_rl_rank(const sync::RankEnv& env, const RlJobOptions& o) {
  // Shared with world rank 0's reporter thread, which may outlive a failing main thread for the
  // moment it takes the rank to exit.
  auto ctx = std::make_shared<trainer::RlContext>(env, o);
  if (ctx->ranks.g.role == sync::Role::kTrain) {
    trainer::RolloutConsumer(*ctx).run();
    return 0;
  }
  trainer::RolloutProducer producer(*ctx);
  // --serve-port: infer rank k serves the OpenAI API on port + k during training, its requests
  // in the same continuous batch as the rollouts.
  std::unique_ptr<server::Server> server;
  if (o.serve_port >= 0) {
    server::ServerOptions so;
    so.host = o.serve_host;
    so.api_key = o.serve_api_key;
    so.version = version_string();
    so.port = o.serve_port == 0 ? 0 : o.serve_port + ctx->ranks.role_global;
    server = std::make_unique<server::Server>(producer.engine_loop(), so);
    int port = server->start();
    fmt::print("rank {}: serving the OpenAI API during training on http://{}:{}\n", env.rank,
               o.serve_host, port);
    std::fflush(stdout);
  }
  struct StopServer {
    std::unique_ptr<server::Server>& s;
    ~StopServer() {
      if (s) s->stop();
    }
  } stop_server{server};
  if (env.rank != 0) {
    producer.run();
    return 0;
  }
  // World rank 0 reports while its engine works: the report reads the store only, through a
  // coordinator over its own connection.
  std::shared_ptr<sync::Coordinator> coord = ctx->connect_own_coordinator();
  auto err = std::make_shared<std::exception_ptr>();
  auto learned = std::make_shared<bool>(true);
  std::thread reporter([ctx, coord, err, learned] {
    try {
      *learned = trainer::report_rl_job(*ctx, *coord);
    } catch (...) {
      *err = std::current_exception();
    }
  });
  try {
    producer.run();
  } catch (...) {
    reporter.detach();
    throw;
  }
  reporter.join();
  if (*err) std::rethrow_exception(*err);
  return *learned ? 0 : 1;
}

}  // namespace crl::app
