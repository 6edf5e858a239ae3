#include <malloc.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "app/cli_style.h"
#include "app/commands.h"
#include "server/api_server.h"

namespace crl::app {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

}  // namespace

Runner register_serve(CLI::App& app) {
  struct Flags {
    EngineFlags engine;
    server::ServerOptions server;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand("serve", "serve the engine over an OpenAI-compatible HTTP API");
  add_engine_flags(*cmd, f->engine);
  cmd->option_defaults()->group("HTTP server");
  auto& s = f->server;
  cmd->add_option("--host", s.host, "address to bind (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd->add_option("--port", s.port, "port to bind (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", s.api_key,
                  "require 'Authorization: Bearer KEY' on every endpoint but /health and /metrics "
                  "(401 otherwise); from $CRL_API_KEY when not given, which keeps it out of ps")
      ->envname("CRL_API_KEY");
  cmd->add_flag("--api-key-everywhere", s.key_for_health_and_metrics,
                "/health and /metrics need the API key too");
  cmd->add_flag(
      "--split-special-tokens", s.limits.split_special_tokens,
      "special-token literals in prompts and message contents are text unless a request "
      "says \"split_special_tokens\": false (for untrusted input; the chat template's own "
      "special tokens stay tokens)");
  cmd->add_option("--served-model-name", s.served_model_name,
                  "model name in the API (default: the model directory's name)");
  cmd->add_option("--max-concurrent-requests", s.max_concurrent_requests,
                  "completion requests in flight at most; more get 429")
      ->capture_default_str();
  cmd->add_option("--http-threads", s.http_threads, "HTTP worker threads")->capture_default_str();
  cmd->add_option("--max-body-bytes", s.max_body_bytes, "larger request bodies get 413")
      ->capture_default_str();
  cmd->add_option("--http-request-timeout", s.request_timeout_s,
                  "seconds a request may take to arrive, head and body (its head: 10 s at most); "
                  "408 and the connection closed after")
      ->check(positive())
      ->capture_default_str();
  cmd->add_option("--max-connections-per-client", s.max_connections_per_client,
                  "connections one remote address may hold open; more get 503 (0: no cap; "
                  "loopback clients are not capped)")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--session-idle-timeout", s.sessions.idle_timeout_s,
                  "chat sessions end after this many seconds without a request")
      ->check(positive())
      ->capture_default_str();
  cmd->add_option("--max-sessions", s.sessions.max_sessions,
                  "chat sessions held at most (the least recently used idle one ends first)")
      ->check(positive())
      ->capture_default_str();
  cmd->add_option("--max-session-tokens", s.sessions.max_tokens,
                  "token ids one chat session may hold")
      ->check(positive())
      ->capture_default_str();
  return [f]() {
    // One malloc arena for the whole server (unless the user set MALLOC_ARENA_MAX). glibc gives
    // threads their own arenas, up to 8 per core, and returns an arena's freed top to the system
    // only past a threshold that grows with the largest block freed: every HTTP worker that once
    // parsed a multi-MiB body kept it, and RSS climbed ~15 MiB per large request (issue 49). With
    // one arena malloc_trim returns it; `bench serve` measured no loss (docs/http-api.md).
    if (!std::getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 1);
    engine::EngineConfig config = f->engine.resolve();
    f->server.version = version_string();
    server::Server srv(config, f->server);
    // The model first, then the port: a model that does not load fails before anything listens,
    // and "listening" means requests are served.
    spdlog::info("loading {}", config.model_dir);
    srv.engine_loop().start();
    srv.engine_loop().wait_ready();
    // Only now: a signal while the model loads ends the process at once (nothing is served or
    // held yet), instead of being noted until the load is done.
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    spdlog::info("model loaded: {} (KV pool {} blocks x {} tokens{})", srv.model_name(),
                 srv.engine_loop().engine().runner().num_blocks(), config.block_size,
                 tensor_parallel_note(srv.engine_loop().engine()));
    const int port = srv.start();
    // One line on stdout with the bound port, for scripts and `bench serve` (port 0).
    std::cout << "listening on http://" << f->server.host << ":" << port << std::endl;
    while (!g_stop_signal) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    spdlog::info("signal {}: stopping", static_cast<int>(g_stop_signal));
    srv.stop();
    return 0;
  };
}

}  // namespace crl::app
