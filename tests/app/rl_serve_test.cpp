// The RL job with --serve-port, run as the real binary: HTTP completions succeed while training
// proceeds, and the weight version in the responses increases (issue 5, in-training part).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "engine/model/model_cache.h"
#include "server/http_client.h"

namespace crl {
namespace {

TEST(RlServeTest, CompletionsSucceedDuringTrainingAndTheWeightVersionIncreases) {
  const std::string model = engine::ensure_preset_model("default");
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  std::vector<std::string> args = {
      CRL_BINARY, "--gpus-infer", "1",  "--gpus-train", "1", "--model",
      model,      "--steps",      "60", "--sft-steps",  "2", "--prompts-per-step",
      "4",        "--n-samples",  "4",  "--eval-every", "0", "--eval-rows",
      "8",        "--serve-port", "0",  "--timeout",    "60"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execv(CRL_BINARY, argv.data());
    _exit(127);
  }
  close(out[1]);
  // Read the job's stdout on a thread (the pipe must not fill up); find the served port.
  std::string text;
  std::mutex mu;
  std::thread reader([&] {
    char buf[4096];
    ssize_t n;
    while ((n = read(out[0], buf, sizeof(buf))) > 0) {
      std::lock_guard<std::mutex> lock(mu);
      text.append(buf, static_cast<size_t>(n));
    }
  });
  std::string url;
  std::regex served(R"(serving the OpenAI API during training on (http://[0-9.]+:[0-9]+))");
  for (int i = 0; i < 600 && url.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> lock(mu);
    std::smatch m;
    if (std::regex_search(text, m, served)) url = m[1];
  }
  ASSERT_FALSE(url.empty()) << text;

  server::HttpClient client(url, 60);
  std::vector<int64_t> versions;
  int ok = 0, requests = 0;
  nlohmann::json body = {
      {"prompt", "Copy: red tree big. Answer:"}, {"max_tokens", 6}, {"temperature", 0}};
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      break;
    }
    auto r = client.post("/v1/completions", body.dump());
    if (r.status == -1) break;  // the job ended between the check and the request
    ++requests;
    EXPECT_EQ(r.status, 200) << r.body;
    if (r.status == 200) {
      ++ok;
      auto j = nlohmann::json::parse(r.body);
      versions.push_back(j.at("weight_version").get<int64_t>());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  if (pid > 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  reader.join();
  close(out[0]);
  ASSERT_GE(ok, 3) << text;
  EXPECT_TRUE(std::is_sorted(versions.begin(), versions.end()));
  EXPECT_GT(versions.back(), versions.front()) << "weight version never increased";
  EXPECT_NE(text.find("summary:"), std::string::npos) << text;
}

}  // namespace
}  // namespace crl
