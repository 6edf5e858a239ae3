// `colocated-rl bench tokenizer`: encode throughput of our tokenizer against Hugging Face's.
//
// Builds a --doc-mb document from the conformance corpus (REFERENCE_DIR/corpus.json, made by
// scripts/tokenizer_fixtures.sh; the default training corpus when there is none), shuffled with a
// fixed seed and cut in ~4 KiB chunks at string boundaries. For each tokenizer directory measures
// encode MB/s (10^6 bytes of UTF-8 per second, no special tokens) on 1 thread (each chunk in turn)
// and on --threads threads (encode_batch), and the same for Hugging Face tokenizers through its
// Node binding (bench/hf_tokenize.mjs, a child process: encode of each chunk in turn, and
// encodeBatch on RAYON_NUM_THREADS = --threads). Ours and HF's run alternately in every repeat
// (paired); medians are reported, with whether all ids of the document agree. Without node or the
// reference packages it reports our figures alone and says so.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace crl::bench {

struct TokenizerBenchOptions {
  std::string tokenizers;     // comma-separated model dirs / tokenizer.json files
  double doc_mb = 1;          // document size, 10^6 bytes
  int32_t repeats = 5;        // timed repeats per side and thread count (after a warm-up)
  int32_t threads = 0;        // NT: 0 = all cores
  std::string reference_dir;  // scripts/tokenizer_fixtures.sh OUT_DIR (corpus.json, npm/)
  std::string hf_script;      // bench/hf_tokenize.mjs (default: in the source tree)
  std::string node = "node";  // the Node.js binary
  std::string results = "tokenizer_bench.jsonl";
};

void add_tokenizer_bench_flags(CLI::App& cmd, TokenizerBenchOptions& opts);
int run_tokenizer_bench(const TokenizerBenchOptions& opts);

}  // namespace crl::bench
