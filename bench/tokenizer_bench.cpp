#include "bench/tokenizer_bench.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "bench/stats.h"
#include "common/strings.h"
#include "common/units.h"
#include "engine/kernels/cpu_isa.h"
#include "engine/model/model_cache.h"
#include "engine/model/model_writer.h"
#include "text/tokenizer.h"

extern char** environ;

namespace crl::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

// The reference directory: --reference-dir, else $CRL_TOKENIZER_FIXTURES, else the test cache's
// (what the conformance test makes), when it holds a corpus.
std::string find_reference_dir(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::vector<std::string> candidates;
  if (const char* d = std::getenv("CRL_TOKENIZER_FIXTURES"); d && *d) candidates.push_back(d);
  candidates.push_back(engine::cache_dir() + "/tokenizer-fixtures");
  for (const auto& c : candidates) {
    if (fs::exists(c + "/corpus.json")) return c;
  }
  return "";
}

// The document: corpus strings (those under 2 KB, so no single one dominates) drawn with a fixed
// seed, each followed by "\n", cut into chunks of about 4 KiB at string boundaries.
std::vector<std::string> build_chunks(const std::vector<std::string>& strings, size_t doc_bytes) {
  std::vector<const std::string*> pool;
  for (const auto& s : strings) {
    if (!s.empty() && s.size() < 2000) pool.push_back(&s);
  }
  if (pool.empty()) throw std::runtime_error("bench tokenizer: the corpus has no usable strings");
  uint64_t state = 0x5eed1234abcdULL;
  auto next = [&] {  // splitmix64: the same sequence everywhere
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::vector<std::string> chunks;
  std::string cur;
  size_t total = 0;
  while (total < doc_bytes) {
    const std::string& s = *pool[next() % pool.size()];
    cur += s;
    cur += '\n';
    total += s.size() + 1;
    if (cur.size() >= 4096) chunks.push_back(std::move(cur)), cur.clear();
  }
  if (!cur.empty()) chunks.push_back(std::move(cur));
  return chunks;
}

// bench/hf_tokenize.mjs as a child process, answering one command per line.
class HfReference {
 public:
  HfReference(const std::string& node, const std::string& script, const std::string& npm_dir,
              const std::string& tokenizer_json, const std::string& chunks_json, int threads) {
    int in_fds[2], out_fds[2];
    if (pipe(in_fds) != 0 || pipe(out_fds) != 0) throw std::runtime_error("pipe failed");
    std::vector<std::string> args = {node,    script,         "--npm-dir",
                                     npm_dir, tokenizer_json, chunks_json};
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (kv.rfind("RAYON_NUM_THREADS=", 0) != 0 && kv.rfind("TOKENIZERS_PARALLELISM=", 0) != 0) {
        env_strings.push_back(kv);
      }
    }
    env_strings.push_back("RAYON_NUM_THREADS=" + std::to_string(threads));
    env_strings.push_back("TOKENIZERS_PARALLELISM=true");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(in_fds[0], STDIN_FILENO);
      dup2(out_fds[1], STDOUT_FILENO);
      close(in_fds[0]), close(in_fds[1]), close(out_fds[0]), close(out_fds[1]);
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& e : env_strings) envp.push_back(e.data());
      envp.push_back(nullptr);
      execvpe(argv[0], argv.data(), envp.data());
      std::fprintf(stderr, "bench tokenizer: cannot run %s\n", argv[0]);
      _exit(127);
    }
    close(in_fds[0]);
    close(out_fds[1]);
    to_ = fdopen(in_fds[1], "w");
    from_ = fdopen(out_fds[0], "r");
    try {
      json ready = reply();
      if (!ready.value("ready", false)) throw std::runtime_error("no ready line: " + ready.dump());
      load_s_ = ready.value("load_s", 0.0);
    } catch (...) {
      stop();
      throw;
    }
  }
  ~HfReference() { stop(); }
  HfReference(const HfReference&) = delete;
  HfReference& operator=(const HfReference&) = delete;

  double load_seconds() const { return load_s_; }
  double run(const char* mode) {
    json r = command(mode);
    if (!r.contains("seconds")) throw std::runtime_error(r.dump());
    return r["seconds"].get<double>();
  }
  std::vector<Ids> ids(const std::string& path) {
    json r = command("ids " + path);
    if (!r.value("ok", false)) throw std::runtime_error(r.dump());
    std::ifstream in(path);
    return json::parse(in).get<std::vector<Ids>>();
  }

 private:
  void stop() {
    if (to_) {
      std::fputs("quit\n", to_);
      std::fclose(to_);  // EOF on its stdin ends it too
      to_ = nullptr;
    }
    if (from_) std::fclose(from_), from_ = nullptr;
    if (pid_ > 0) waitpid(pid_, nullptr, 0), pid_ = -1;
  }
  json command(const std::string& cmd) {
    std::fputs((cmd + "\n").c_str(), to_);
    std::fflush(to_);
    return reply();
  }
  json reply() {
    std::string line;
    int c;
    while ((c = std::fgetc(from_)) != EOF && c != '\n') line += static_cast<char>(c);
    if (line.empty()) throw std::runtime_error("hf_tokenize.mjs exited (see its message above)");
    return json::parse(line);
  }
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  double load_s_ = 0;
};

std::string default_hf_script() {
#ifdef CRL_SOURCE_DIR
  return std::string(CRL_SOURCE_DIR) + "/bench/hf_tokenize.mjs";
#else
  return "bench/hf_tokenize.mjs";
#endif
}

// The tokenizer.json HF would load for `path` ("" when it is not a tokenizer.json one).
std::string hf_tokenizer_json(const std::string& path) {
  std::string file = fs::is_directory(path) ? text::Tokenizer::tokenizer_file_in(path) : path;
  return fs::path(file).extension() == ".json" ? file : "";
}

std::string display_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (!fs::is_directory(p)) p = p.parent_path();
  std::string name = p.filename().string();
  return name.empty() ? path : name;
}

std::string fmt_rate(std::optional<double> v) { return v ? fmt::format("{:.2f}", *v) : "n/a"; }
std::string fmt_ratio(double ours, std::optional<double> hf) {
  return hf && *hf > 0 ? fmt::format("{:.2f}x", ours / *hf) : "n/a";
}

}  // namespace

void add_tokenizer_bench_flags(CLI::App& cmd, TokenizerBenchOptions& o) {
  cmd.add_option("--tokenizers", o.tokenizers,
                 "comma-separated model directories or tokenizer.json files, e.g. "
                 "OUT/qwen3,OUT/llama3_1 from scripts/tokenizer_fixtures.sh OUT")
      ->required();
  cmd.add_option("--doc-mb", o.doc_mb, "document size in MB (10^6 bytes)")->capture_default_str();
  cmd.add_option("--repeats", o.repeats, "timed repeats (medians), after one warm-up")
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "threads for the NT columns (0: all cores)")
      ->capture_default_str();
  cmd.add_option("--reference-dir", o.reference_dir,
                 "scripts/tokenizer_fixtures.sh OUT_DIR: corpus.json and npm/ (HF's Node binding); "
                 "default $CRL_TOKENIZER_FIXTURES, else the test cache's tokenizer-fixtures");
  cmd.add_option("--hf-script", o.hf_script,
                 "the Node side (default: bench/hf_tokenize.mjs in the "
                 "source tree)");
  cmd.add_option("--node", o.node, "the Node.js binary")->capture_default_str();
  cmd.add_option("--results", o.results, "JSONL file the rows go to")->capture_default_str();
}

int run_tokenizer_bench(const TokenizerBenchOptions& o) {
  auto paths = crl::split_list(o.tokenizers);
  if (paths.empty()) throw std::invalid_argument("bench tokenizer: --tokenizers is empty");
  if (o.repeats < 1) throw std::invalid_argument("bench tokenizer: --repeats must be >= 1");
  if (o.doc_mb <= 0) throw std::invalid_argument("bench tokenizer: --doc-mb must be > 0");
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  signal(SIGPIPE, SIG_IGN);  // a dead node child must not kill us

  // The document.
  std::string ref_dir = find_reference_dir(o.reference_dir);
  std::vector<std::string> strings;
  std::string corpus_source;
  if (!ref_dir.empty() && fs::exists(ref_dir + "/corpus.json")) {
    std::ifstream in(ref_dir + "/corpus.json");
    strings = json::parse(in)["strings"].get<std::vector<std::string>>();
    corpus_source = ref_dir + "/corpus.json";
  } else {
    std::stringstream ss(engine::default_corpus_text());
    for (std::string line; std::getline(ss, line);) strings.push_back(line);
    corpus_source = "the default training corpus (no reference dir with corpus.json)";
  }
  auto chunks = build_chunks(strings, static_cast<size_t>(o.doc_mb * 1e6));
  size_t bytes = 0;
  for (const auto& c : chunks) bytes += c.size();
  const double mb = static_cast<double>(bytes) / 1e6;

  // HF's side: node, the script and the packages, or why not.
  std::string hf_script = o.hf_script.empty() ? default_hf_script() : o.hf_script;
  std::string npm_dir = ref_dir.empty() ? "" : ref_dir + "/npm";
  std::string hf_missing;
  if (std::system((o.node + " --version > /dev/null 2>&1").c_str()) != 0) {
    hf_missing = "'" + o.node + "' does not run";
  } else if (!fs::exists(hf_script)) {
    hf_missing = hf_script + " not found (--hf-script)";
  } else if (npm_dir.empty() || !fs::exists(npm_dir + "/node_modules/tokenizers")) {
    hf_missing =
        "no Hugging Face tokenizers package (run scripts/tokenizer_fixtures.sh OUT_DIR and "
        "pass --reference-dir OUT_DIR)";
  }
  std::string tmp_dir =
      (fs::temp_directory_path() / fmt::format("crl-tokbench-{}", getpid())).string();
  fs::create_directories(tmp_dir);
  const std::string chunks_json = tmp_dir + "/chunks.json";
  const std::string ids_json = tmp_dir + "/ids.json";
  if (hf_missing.empty()) std::ofstream(chunks_json, std::ios::binary) << json(chunks).dump();

  fmt::print("CPU: {} ({} hardware threads)\n", engine::kernels::cpu_model_name(),
             std::thread::hardware_concurrency());
  fmt::print(
      "document: {:.3f} MB in {} chunks from {}; encode without special tokens; NT = {} "
      "threads; medians of {} paired repeats\n",
      mb, chunks.size(), corpus_source, threads, o.repeats);
  if (!hf_missing.empty()) fmt::print("Hugging Face's figures were not measured: {}\n", hf_missing);
  fmt::print(
      "\n| tokenizer | ours 1T MB/s | HF 1T MB/s | ratio | ours {}T MB/s | HF {}T MB/s | ratio | "
      "ids equal |\n|---|---|---|---|---|---|---|---|\n",
      threads, threads);
  std::fflush(stdout);
  std::remove(o.results.c_str());

  int failures = 0;
  for (const auto& path : paths) {
    const std::string name = display_name(path);
    try {
      auto t_load = Clock::now();
      text::Tokenizer tok(path);
      double load_s = seconds_since(t_load);

      std::unique_ptr<HfReference> hf;
      std::string hf_note = hf_missing;
      std::string hf_json = hf_tokenizer_json(path);
      if (hf_note.empty() && hf_json.empty()) hf_note = "not a tokenizer.json tokenizer";
      if (hf_note.empty()) {
        try {
          hf = std::make_unique<HfReference>(o.node, hf_script, npm_dir, hf_json, chunks_json,
                                             threads);
        } catch (const std::exception& e) {
          hf_note = std::string("hf_tokenize.mjs failed: ") + e.what();
        }
      }

      auto ours_1t = [&] {
        auto t0 = Clock::now();
        for (const auto& c : chunks) tok.encode(c);
        return seconds_since(t0);
      };
      auto ours_nt = [&] {
        auto t0 = Clock::now();
        tok.encode_batch(chunks, {}, threads);
        return seconds_since(t0);
      };
      std::vector<double> o1, on, h1, hn;
      ours_1t(), ours_nt();  // warm-up
      try {
        if (hf) hf->run("1t"), hf->run("nt");
      } catch (const std::exception& e) {
        hf_note = std::string("hf_tokenize.mjs failed: ") + e.what(), hf.reset();
      }
      for (int r = 0; r < o.repeats; ++r) {
        o1.push_back(ours_1t());
        if (hf) h1.push_back(hf->run("1t"));
        on.push_back(ours_nt());
        if (hf) hn.push_back(hf->run("nt"));
      }

      std::optional<bool> ids_equal;
      size_t n_ids = 0;
      std::string first_diff;
      auto ours_ids = tok.encode_batch(chunks, {}, threads);
      for (const auto& v : ours_ids) n_ids += v.size();
      if (hf) {
        auto theirs = hf->ids(ids_json);
        ids_equal = theirs == ours_ids;
        for (size_t i = 0; !*ids_equal && i < chunks.size() && first_diff.empty(); ++i) {
          if (i >= theirs.size() || theirs[i] != ours_ids[i])
            first_diff = fmt::format("chunk {}", i);
        }
      }

      const double ours1 = mb / median(o1), oursn = mb / median(on);
      std::optional<double> hf1, hfn;
      if (hf) hf1 = mb / median(h1), hfn = mb / median(hn);
      std::string eq = ids_equal ? (*ids_equal ? "yes" : "NO (" + first_diff + ")") : "n/a";
      fmt::print("| {} | {:.2f} | {} | {} | {:.2f} | {} | {} | {} |\n", name, ours1, fmt_rate(hf1),
                 fmt_ratio(ours1, hf1), oursn, fmt_rate(hfn), fmt_ratio(oursn, hfn), eq);
      if (!hf_note.empty() && hf_note != hf_missing)
        fmt::print("  ({}: HF not measured: {})\n", name, hf_note);
      std::fflush(stdout);

      json row = {{"tokenizer", name},
                  {"path", path},
                  {"cpu", engine::kernels::cpu_model_name()},
                  {"doc_bytes", bytes},
                  {"chunks", chunks.size()},
                  {"ids", n_ids},
                  {"threads", threads},
                  {"repeats", o.repeats},
                  {"load_s", load_s},
                  {"ours_1t_mb_s", ours1},
                  {"ours_nt_mb_s", oursn},
                  {"hf_1t_mb_s", hf1 ? json(*hf1) : json(nullptr)},
                  {"hf_nt_mb_s", hfn ? json(*hfn) : json(nullptr)},
                  {"ratio_1t", hf1 ? json(ours1 / *hf1) : json(nullptr)},
                  {"ratio_nt", hfn ? json(oursn / *hfn) : json(nullptr)},
                  {"hf_load_s", hf ? json(hf->load_seconds()) : json(nullptr)},
                  {"ids_equal", ids_equal ? json(*ids_equal) : json(nullptr)},
                  {"hf_not_measured", hf ? json(nullptr) : json(hf_note)}};
      std::ofstream(o.results, std::ios::app) << row.dump() << "\n";
    } catch (const std::exception& e) {
      ++failures;
      fmt::print("| {} | failed: {} | | | | | | |\n", name, e.what());
      std::fflush(stdout);
    }
  }
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fmt::print("(MB = 10^6 bytes of UTF-8 text; ratio = ours / HF; rows also in {})\n", o.results);
  return failures ? 1 : 0;
}

}  // namespace crl::bench
