#include "bench/serve_bench.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <thread>

#include "server/http_client.h"

namespace crl::bench {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

// `colocated-rl serve --port 0 ...` as a child; its first stdout line names the port.
class ServerProcess {
 public:
  explicit ServerProcess(const ServeBenchOptions& o) {
    std::vector<std::string> args = {"colocated-rl",
                                     "serve",
                                     "--host",
                                     "127.0.0.1",
                                     "--port",
                                     "0",
                                     "--threads",
                                     std::to_string(o.threads),
                                     "--max-seqs",
                                     std::to_string(o.max_seqs),
                                     "--kv-memory",
                                     o.kv_memory,
                                     "--max-concurrent-requests",
                                     "1024",
                                     "--http-threads",
                                     "256"};
    if (!o.model_dir.empty()) {
      args.push_back("--model");
      args.push_back(o.model_dir);
    }
    // The child requires the key; it goes through the environment, not its argv.
    if (!o.api_key.empty()) setenv("CRL_API_KEY", o.api_key.c_str(), 1);
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    close(fds[1]);
    FILE* out = fdopen(fds[0], "r");
    char line[512];
    const std::string marker = "listening on ";
    while (out && std::fgets(line, sizeof(line), out)) {
      std::string l(line);
      const size_t at = l.find(marker);
      if (at == std::string::npos) continue;
      url_ = l.substr(at + marker.size());
      while (!url_.empty() && (url_.back() == '\n' || url_.back() == '\r')) url_.pop_back();
      break;
    }
    if (url_.empty()) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      if (out) std::fclose(out);
      throw std::runtime_error("the server child process did not start");
    }
    // Keep draining its stdout so it never blocks on a full pipe.
    drain_ = std::thread([out] {
      while (std::fgets(line_buffer(), 512, out)) {
      }
      std::fclose(out);
    });
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    if (drain_.joinable()) drain_.join();
  }
  const std::string& url() const { return url_; }

 private:
  static char* line_buffer() {
    static thread_local char buf[512];
    return buf;
  }
  pid_t pid_ = -1;
  std::string url_;
  std::thread drain_;
};

struct LevelResult {
  int32_t concurrency = 0;
  double seconds = 0;
  int64_t requests = 0;
  int64_t errors = 0;
  int64_t output_tokens = 0;
  std::vector<double> ttft, itl, e2e;
};

// One streaming request; appends its TTFT, per-token gaps and e2e. False on failure.
bool run_request(server::HttpClient& client, const std::string& body, LevelResult& local) {
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true;
  int64_t tokens = 0;
  std::string buffer;
  bool done = false;
  auto on_data = [&](const char* data, size_t n) {
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json chunk = json::parse(payload, nullptr, false);
      if (!chunk.is_object() || !chunk.contains("choices") || chunk["choices"].empty()) continue;
      const auto& ids = chunk["choices"][0]["token_ids"];
      const int64_t k = ids.is_array() ? static_cast<int64_t>(ids.size()) : 0;
      if (k == 0) continue;
      const auto now = Clock::now();
      if (first) {
        local.ttft.push_back(std::chrono::duration<double>(now - t0).count());
        first = false;
      } else {
        const double gap =
            std::chrono::duration<double>(now - last).count() / static_cast<double>(k);
        for (int64_t i = 0; i < k; ++i) local.itl.push_back(gap);
      }
      last = now;
      tokens += k;
    }
    return true;
  };
  auto res = client.post_stream("/v1/completions", body, on_data);
  if (res.status != 200 || !done) return false;
  local.e2e.push_back(since(t0));
  local.output_tokens += tokens;
  return true;
}

LevelResult run_level(const std::string& url, const ServeBenchOptions& o, int32_t concurrency) {
  LevelResult total;
  total.concurrency = concurrency;
  std::mutex mu;
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration<double>(o.seconds);
  std::vector<std::thread> clients;
  for (int32_t c = 0; c < concurrency; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(c));
      std::uniform_int_distribution<int32_t> tok(4, 255);
      server::HttpClient client(url);
      client.set_api_key(o.api_key);
      LevelResult local;
      while (Clock::now() < deadline) {
        std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_len));
        for (auto& t : prompt) t = tok(rng);
        json body = {{"prompt", prompt},   {"max_tokens", o.max_tokens},
                     {"temperature", 1.0}, {"ignore_eos", true},
                     {"stream", true},     {"return_token_ids", true},
                     {"seed", rng()}};
        if (run_request(client, body.dump(), local))
          local.requests++;
        else
          local.errors++;
      }
      std::lock_guard<std::mutex> lock(mu);
      total.requests += local.requests;
      total.errors += local.errors;
      total.output_tokens += local.output_tokens;
      total.ttft.insert(total.ttft.end(), local.ttft.begin(), local.ttft.end());
      total.itl.insert(total.itl.end(), local.itl.begin(), local.itl.end());
      total.e2e.insert(total.e2e.end(), local.e2e.begin(), local.e2e.end());
    });
  }
  for (auto& t : clients) t.join();
  total.seconds = since(t0);
  return total;
}

struct EpisodeResult {
  int64_t turns = 0, errors = 0;
  int64_t later_prompt_tokens = 0, later_cached_tokens = 0;  // turns after the first
  int64_t later_held_tokens = 0;  // of those prompts, the previous turn's prompt and reply
  std::vector<double> later_cached_share, turn_seconds;
  std::string first_error;  // status and body of the first refused turn
};

// --multi-turn: `clients` clients, each running `o.episodes` chat episodes of `o.multi_turn`
// turns: a random user message, the reply as returned, another user message, ...
EpisodeResult run_episodes(const std::string& url, const ServeBenchOptions& o, int32_t clients,
                           bool sessions) {
  static const char* kWords[] = {"the",    "tool", "says",  "42",   "then", "add",  "seven", "and",
                                 "divide", "by",   "three", "what", "is",   "left", "over",  "now"};
  EpisodeResult total;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int32_t c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(c));
      auto text = [&] {
        std::string s;
        for (int32_t i = 0; i < o.prompt_len; ++i)
          s += std::string(i ? " " : "") + kWords[rng() % 16];
        return s;
      };
      server::HttpClient client(url);
      client.set_api_key(o.api_key);
      EpisodeResult local;
      for (int32_t e = 0; e < o.episodes; ++e) {
        json messages = json::array({{{"role", "user"}, {"content", text()}}});
        int64_t held = 0;
        const std::string session = fmt::format("bench-{}-{}-{}-{}", clients, sessions, c, e);
        for (int32_t t = 0; t < o.multi_turn; ++t) {
          json body = {{"messages", messages},
                       {"max_tokens", o.max_tokens},
                       {"temperature", 1.0},
                       {"ignore_eos", true},
                       {"seed", rng()}};
          if (sessions) body["session_id"] = session;
          const auto t0 = Clock::now();
          auto res = client.post("/v1/chat/completions", body.dump());
          if (res.status != 200) {
            if (local.first_error.empty()) {
              local.first_error =
                  fmt::format("turn {}: HTTP {}: {}", t + 1, res.status, res.body.substr(0, 300));
            }
            local.errors++;
            break;
          }
          local.turn_seconds.push_back(since(t0));
          local.turns++;
          const json r = json::parse(res.body);
          const int64_t prompt = r["usage"]["prompt_tokens"].get<int64_t>();
          if (t > 0) {
            const int64_t cached =
                r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
            local.later_prompt_tokens += prompt;
            local.later_cached_tokens += cached;
            local.later_held_tokens += std::min(held, prompt);
            local.later_cached_share.push_back(prompt > 0 ? static_cast<double>(cached) / prompt
                                                          : 0);
          }
          held = prompt + r["usage"]["completion_tokens"].get<int64_t>();
          messages.push_back(r["choices"][0]["message"]);
          messages.push_back({{"role", "user"}, {"content", text()}});
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      total.turns += local.turns;
      total.errors += local.errors;
      if (total.first_error.empty()) total.first_error = local.first_error;
      total.later_prompt_tokens += local.later_prompt_tokens;
      total.later_cached_tokens += local.later_cached_tokens;
      total.later_held_tokens += local.later_held_tokens;
      total.later_cached_share.insert(total.later_cached_share.end(),
                                      local.later_cached_share.begin(),
                                      local.later_cached_share.end());
      total.turn_seconds.insert(total.turn_seconds.end(), local.turn_seconds.begin(),
                                local.turn_seconds.end());
    });
  }
  for (auto& t : threads) t.join();
  return total;
}

int run_multi_turn(const std::string& url, const ServeBenchOptions& o) {
  std::cout << fmt::format(
      "{} turns per episode, {} episodes per client, {} user words a turn, {} reply "
      "tokens; later turns = turns 2..{}\n",
      o.multi_turn, o.episodes, o.prompt_len, o.max_tokens, o.multi_turn);
  std::cout << fmt::format("{:>8} {:>9} {:>6} {:>7} | {:>14} {:>14} {:>14} {:>16} | {:>9}\n",
                           "clients", "mode", "turns", "errors", "cached (all)", "cached p10",
                           "of seen ids", "prefilled/turn", "turn p50");
  json levels = json::array();
  int failures = 0;
  for (int32_t c : o.concurrency) {
    for (bool sessions : {true, false}) {
      EpisodeResult r = run_episodes(url, o, c, sessions);
      failures += r.errors > 0;
      const double share = r.later_prompt_tokens > 0
                               ? static_cast<double>(r.later_cached_tokens) / r.later_prompt_tokens
                               : 0;
      const double of_held = r.later_held_tokens > 0
                                 ? static_cast<double>(r.later_cached_tokens) / r.later_held_tokens
                                 : 0;
      const size_t later = r.later_cached_share.size();
      const double prefilled =
          later ? static_cast<double>(r.later_prompt_tokens - r.later_cached_tokens) / later : 0;
      const char* mode = sessions ? "session" : "resend";
      std::cout << fmt::format(
          "{:>8} {:>9} {:>6} {:>7} | {:>13.1f}% {:>13.1f}% {:>13.1f}% {:>16.1f} | {:>7.1f}ms\n", c,
          mode, r.turns, r.errors, 100 * share, 100 * percentile(r.later_cached_share, 0.1),
          100 * of_held, prefilled, 1e3 * percentile(r.turn_seconds, 0.5));
      // A refused turn ends its episode; say why (resending re-encodes the replies, so a prompt
      // can outgrow the context, which sessions never do).
      if (!r.first_error.empty()) std::cout << "         first error: " << r.first_error << "\n";
      std::cout.flush();
      levels.push_back({{"clients", c},
                        {"mode", mode},
                        {"turns", r.turns},
                        {"errors", r.errors},
                        {"first_error", r.first_error},
                        {"later_cached_share", share},
                        {"later_cached_share_p10", percentile(r.later_cached_share, 0.1)},
                        {"later_cached_of_seen", of_held},
                        {"later_prefilled_tokens_per_turn", prefilled},
                        {"turn_s_p50", percentile(r.turn_seconds, 0.5)}});
    }
  }
  json line = {{"bench", "serve_multi_turn"}, {"turns", o.multi_turn},
               {"episodes", o.episodes},      {"user_words", o.prompt_len},
               {"max_tokens", o.max_tokens},  {"levels", levels}};
  if (o.json) std::cout << line.dump() << "\n";
  if (!o.json_out.empty()) std::ofstream(o.json_out, std::ios::app) << line.dump() << "\n";
  return failures ? 1 : 0;
}

}  // namespace

void add_serve_bench_flags(CLI::App& cmd, ServeBenchOptions& o) {
  cmd.add_option("--url", o.url, "benchmark a running server (default: start `serve` as a child)");
  cmd.add_option("--model", o.model_dir, "child server's model (default: the embedded default)");
  cmd.add_option("--threads", o.threads, "child server's intra-op threads")->capture_default_str();
  cmd.add_option("--max-seqs", o.max_seqs, "child server's running-batch cap")
      ->capture_default_str();
  cmd.add_option("--kv-memory", o.kv_memory, "child server's KV pool")->capture_default_str();
  cmd.add_option("--concurrency", o.concurrency, "client counts, one level each")
      ->capture_default_str();
  cmd.add_option("--seconds", o.seconds, "duration of each level")->capture_default_str();
  cmd.add_option("--prompt-len", o.prompt_len, "prompt tokens per request")->capture_default_str();
  cmd.add_option("--max-tokens", o.max_tokens, "output tokens per request")->capture_default_str();
  cmd.add_option("--seed", o.seed, "workload seed")->capture_default_str();
  cmd.add_option("--json-out", o.json_out, "also append the JSON line to this file");
  cmd.add_flag("--json", o.json, "print the JSON result line after the table");
  cmd.add_option("--api-key", o.api_key,
                 "the server's API key, sent with every request (a child server requires it); "
                 "from $CRL_API_KEY when not given")
      ->envname("CRL_API_KEY");
  cmd.add_option("--multi-turn", o.multi_turn,
                 "chat episodes of this many turns, with a session and without (the prompt words "
                 "per user message: --prompt-len; reply tokens: --max-tokens)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--episodes", o.episodes, "--multi-turn: episodes per client")
      ->capture_default_str();
}

int run_serve_bench(const ServeBenchOptions& o) {
  std::unique_ptr<ServerProcess> child;
  std::string url = o.url;
  if (url.empty()) {
    child = std::make_unique<ServerProcess>(o);
    url = child->url();
  }
  {  // Wait until the model is loaded.
    server::HttpClient probe(url, 10);
    probe.set_api_key(o.api_key);
    const auto t0 = Clock::now();
    while (probe.get("/health").status != 200) {
      if (since(t0) > 600)
        throw std::runtime_error("the server at " + url + " never became healthy");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (o.multi_turn > 0) return run_multi_turn(url, o);
  std::cout << fmt::format(
      "server {} ({}); prompt {} tokens, {} output tokens, streaming, {} s per level\n", url,
      child ? "child process" : "external", o.prompt_len, o.max_tokens, o.seconds);
  {  // Warm-up: one short request.
    ServeBenchOptions w = o;
    w.seconds = 0.5;
    run_level(url, w, 1);
  }
  std::cout << fmt::format(
      "{:>8} {:>9} {:>8} {:>8} {:>10} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8}\n", "clients",
      "requests", "errors", "req/s", "out_tok/s", "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50",
      "itl_p90", "itl_p99");
  json levels = json::array();
  for (int32_t c : o.concurrency) {
    LevelResult r = run_level(url, o, c);
    const double rps = static_cast<double>(r.requests) / r.seconds;
    const double tps = static_cast<double>(r.output_tokens) / r.seconds;
    auto ms = [](double s) { return s * 1e3; };
    std::cout << fmt::format(
        "{:>8} {:>9} {:>8} {:>8.2f} {:>10.1f} | {:>6.1f}ms {:>6.1f}ms {:>6.1f}ms | {:>6.1f}ms "
        "{:>6.1f}ms {:>6.1f}ms\n",
        c, r.requests, r.errors, rps, tps, ms(percentile(r.ttft, 0.5)), ms(percentile(r.ttft, 0.9)),
        ms(percentile(r.ttft, 0.99)), ms(percentile(r.itl, 0.5)), ms(percentile(r.itl, 0.9)),
        ms(percentile(r.itl, 0.99)));
    std::cout.flush();
    levels.push_back({{"clients", c},
                      {"requests", r.requests},
                      {"errors", r.errors},
                      {"seconds", r.seconds},
                      {"requests_per_s", rps},
                      {"output_tokens_per_s", tps},
                      {"ttft_s",
                       {{"p50", percentile(r.ttft, 0.5)},
                        {"p90", percentile(r.ttft, 0.9)},
                        {"p99", percentile(r.ttft, 0.99)}}},
                      {"itl_s",
                       {{"p50", percentile(r.itl, 0.5)},
                        {"p90", percentile(r.itl, 0.9)},
                        {"p99", percentile(r.itl, 0.99)}}},
                      {"e2e_s_p50", percentile(r.e2e, 0.5)}});
  }
  json line = {{"bench", "serve"},
               {"prompt_len", o.prompt_len},
               {"max_tokens", o.max_tokens},
               {"seconds_per_level", o.seconds},
               {"server_threads", o.threads},
               {"levels", levels}};
  if (o.json) std::cout << line.dump() << "\n";
  if (!o.json_out.empty()) std::ofstream(o.json_out, std::ios::app) << line.dump() << "\n";
  return 0;
}

}  // namespace crl::bench
