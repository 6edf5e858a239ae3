#!/usr/bin/env bash
# The CUDA path on a Linux machine with an NVIDIA GPU and a CUDA PyTorch, in one call: builds
# colocated-rl with the GPU build path's own command (`scripts/bootstrap.sh --cuda`, the one CI
# compiles on every commit), against that PyTorch's libtorch and NCCL, then runs the `gpu`-labelled
# tests, the rollout benchmark against Hugging Face generate on the same requests (nano-vllm's
# protocol), the RL job on the one GPU (1 engine + 1 trainer rank, weights over CUDA IPC, the KV
# pool handed over while the trainer trains; and without the hand-over, side by side) and the
# same-GPU weight-sync benchmark. Results: $OUT (default gpu-results/): logs, results.json, and the
# figures printed as they come.
#
#   scripts/gpu-check.sh fetch-debs                              (on a Debian machine with apt)
#   scripts/gpu-check.sh [build] [cudatests] [bench] [rl] [sync] [tests] [qwen3] [unit]
#                                     (default: build tests bench rl sync; stages run in this order)
# cudatests: crl_tests' Cuda suites alone (quicker than `tests`, the whole gpu label).
# CRL_GPU_TARGETS: the build targets (default: all). CRL_CUDA_ARCHS: the CUDA architectures
# (default: the device's own, e.g. 90). CRL_GPU_PROFILE=1: the benchmark's first mode also writes a
# per-step trace and Kineto traces of the steps in CRL_GPU_PROFILE_STEPS, summarised by
# scripts/profile_summary.py.
#
# C++ dependencies the GPU machine lacks come from Debian bookworm .deb files unpacked into a
# local prefix (nothing is installed system-wide): `scripts/gpu-check.sh fetch-debs` downloads
# them into .gpu-deps/ on any Debian machine (apt-get download); carry that folder over. Where
# there is no .gpu-deps/ (a development machine with the packages installed) the system's are
# used, so `scripts/gpu-check.sh build` here is the dry run of everything before the device. The
# benchmark's Hugging Face baseline needs only the model's config.json in .gpu-work/qwen2-0.5b/
# (`colocated-rl make-model --shape qwen2-0.5b` writes it): it runs on random weights of that
# shape while colocated-rl builds, on two cores of its own.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-results}
DEBS=$ROOT/.gpu-deps
PREFIX=${CRL_GPU_PREFIX:-/tmp/crl-gpu-prefix}
BUILD=${CRL_GPU_BUILD:-$ROOT/build-gpu}
DEB_PACKAGES="libsentencepiece-dev libsentencepiece0 libprotobuf-lite32 libcpp-httplib-dev
  libcpp-httplib0.11 nlohmann-json3-dev libcli11-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libgtest-dev libbenchmark-dev libbenchmark1debian libgloo-dev libpcre2-dev libpcre2-8-0
  libutf8proc-dev libutf8proc2 pkgconf pkgconf-bin libpkgconf3
  libssl-dev libssl3 zlib1g-dev zlib1g libbrotli-dev libbrotli1"

if [ "${1:-}" = fetch-debs ]; then
  # And FlashInfer's headers (the machine has no flashinfer-python): the version bootstrap.sh pins.
  fi_ver=$(sed -n 's/^CRL_FLASHINFER_VERSION=${CRL_FLASHINFER_VERSION:-\(.*\)}$/\1/p' scripts/bootstrap.sh)
  mkdir -p "$DEBS/flashinfer" && rm -rf "$DEBS/flashinfer/include" \
    && python3 -m pip download -q --no-deps "flashinfer-python==$fi_ver" -d "$DEBS/flashinfer" \
    && (cd "$DEBS/flashinfer" && unzip -q -o ./*.whl 'flashinfer/data/include/*' \
        && mv flashinfer/data/include include && rm -rf flashinfer ./*.whl) || exit 1
  mkdir -p "$DEBS" && cd "$DEBS" && apt-get download $DEB_PACKAGES
  exit $?
fi
STAGES=${*:-build tests bench rl sync}
want() { [[ " $STAGES " == *" $1 "* ]]; }
mkdir -p "$OUT"
results=$OUT/results.json
echo '{}' > "$results"
note() {  # note KEY JSON-VALUE: merges one entry into results.json
  python3 - "$results" "$1" "$2" <<'EOF'
import json, sys
p, k, v = sys.argv[1:]
d = json.load(open(p)); d[k] = json.loads(v); json.dump(d, open(p, "w"), indent=1)
EOF
}
T0=$(date +%s)
stamp() { echo "gpu-check: [$(( $(date +%s) - T0 )) s] $*"; }

# --- environment: the prefix, the GPU ---
if [ -d "$DEBS" ]; then
mkdir -p "$PREFIX" "$PREFIX/runtime"
LIBDIR=$PREFIX/usr/lib/x86_64-linux-gnu
SYSLIB=/usr/lib/x86_64-linux-gnu
for f in "$DEBS"/*.deb; do
  case $(basename "$f") in
    # Runtime libraries the system has its own (newer) copy of must not shadow it.
    libssl3_*|zlib1g_*|libbrotli1_*) dpkg -x "$f" "$PREFIX/runtime" ;;
    *) dpkg -x "$f" "$PREFIX" ;;
  esac
done
# A -dev package's lib*.so link to a runtime library left out above: point it at the system's
# copy, or at the Debian one where the system has none.
for l in "$LIBDIR"/lib*.so; do
  [ -L "$l" ] && [ ! -e "$l" ] || continue
  t=$(basename "$(readlink "$l")") found=""
  while [[ "$t" == *.so.* ]]; do  # libz.so.1.2.13, then libz.so.1.2, libz.so.1
    for d in "$SYSLIB" /lib/x86_64-linux-gnu; do [ -e "$d/$t" ] && found=$d/$t && break 2; done
    t=${t%.*}
  done
  if [ -n "$found" ]; then ln -sf "$found" "$l"
  else t=$(basename "$(readlink "$l")")
       cp -a "$(find "$PREFIX/runtime" -name "$t" | head -1)" "$LIBDIR/$t" && ln -sf "$t" "$l"; fi
done
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$PREFIX
export PKG_CONFIG_LIBDIR=$LIBDIR/pkgconfig
PKGCONF=$(command -v pkg-config || echo "$PREFIX/usr/bin/pkgconf")
export CRL_GPU_PREFIX=$PREFIX
export CRL_GPU_CMAKE_ARGS="-DPKG_CONFIG_EXECUTABLE=$PKGCONF"
fi
NPROC=$(nproc)
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
export CRL_CUDA_ARCHS=${CRL_CUDA_ARCHS:-${CAP:-90}}
stamp "gpu: ${GPU:-none}; $NPROC cores"
note gpu "\"$GPU\""
BIN=$BUILD/app/colocated-rl
export CRL_CACHE_DIR=${CRL_CACHE_DIR:-/tmp/crl-gpu-cache}

# The Hugging Face baseline on cores 0-1 while the build takes the others (it needs only the GPU
# and a config): the same workload file feeds `bench rollout --workload-in` afterwards.
HF_PID=""
if want bench; then
  python3 bench/hf_generate.py --make-workload --workload "$OUT/workload.json" --prompts 256 \
    --prompt-len 100..1024 --output-len 100..1024 --vocab 151936 --seed 7
  if [ "${CRL_GPU_SKIP_HF:-0}" != 1 ]; then
    PYTHONUNBUFFERED=1 taskset -c 0,1 timeout 400 python3 bench/hf_generate.py \
      --model "$ROOT/.gpu-work/qwen2-0.5b" --workload "$OUT/workload.json" --batch 256 \
      > "$OUT/bench_hf.log" 2>&1 &
    HF_PID=$!
    stamp "hf generate started (pid $HF_PID)"
  fi
fi
BUILD_CORES=$([ -n "$HF_PID" ] && echo "2-$((NPROC - 1))" || echo "0-$((NPROC - 1))")

if want build; then
  start=$(date +%s)
  # The GPU build path's own command: the CUDA PyTorch of this machine's python3 (or CRL_GPU_PYTHON),
  # its NCCL, nvcc; the configure fails unless the CUDA kernels, NCCL and CUDA IPC are all built.
  CRL_GPU_BUILD=$BUILD taskset -c "$BUILD_CORES" scripts/bootstrap.sh --cuda 2>&1 | tee "$OUT/configure.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { note build "{\"rc\": $rc, \"stage\": \"configure\"}"; exit 1; }
  targets=""
  for t in ${CRL_GPU_TARGETS:-}; do targets="$targets --target $t"; done
  taskset -c "$BUILD_CORES" cmake --build "$BUILD" $targets -j "$(taskset -c "$BUILD_CORES" nproc)" -- -k 0 > "$OUT/build.log" 2>&1
  rc=$?
  grep -E "error|FAILED" "$OUT/build.log" | head -40
  note build "{\"rc\": $rc, \"seconds\": $(( $(date +%s) - start ))}"
  stamp "build rc=$rc"
  if [ "$rc" -ne 0 ]; then
    echo "gpu-check: build failed (see $OUT/build.log)"
    [ -n "$HF_PID" ] && wait "$HF_PID" && tail -1 "$OUT/bench_hf.log"
    exit 1
  fi
fi
# The run time of the GPU build: libtorch, its CUDA libraries and NCCL (the binary dlopens NCCL by
# name), as bootstrap.sh found them.
[ -f "$BUILD/gpu-env.sh" ] && . "$BUILD/gpu-env.sh"
note torch "\"${CRL_TORCH_VERSION_FOUND:-unknown}\""
if [ -z "$GPU" ]; then
  stamp "no GPU here: the build was the dry run; the device stages need one"
  cat "$results"
  exit 0
fi
if [ -n "$HF_PID" ]; then
  wait "$HF_PID"
  note hf "$(tail -1 "$OUT/bench_hf.log" | grep '^{' || echo '{"error": "see bench_hf.log"}')"
  stamp "hf generate: $(tail -1 "$OUT/bench_hf.log")"
fi

if want cudatests; then
  timeout 300 "$BUILD/tests/crl_tests" --gtest_filter='Cuda*:*/*Cuda*' > "$OUT/tests_cuda.log" 2>&1
  rc=$?
  note tests_cuda "{\"rc\": $rc}"
  grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |Failure|Expected|Which is|error" "$OUT/tests_cuda.log" | cut -c1-250 | head -60
  stamp "cuda tests rc=$rc"
  # The engines again with FlashInfer's decode attention (CUDA graphs, bf16 engines, LoRA graphs).
  CRL_PAGED_ATTENTION=flashinfer timeout 240 "$BUILD/tests/crl_tests" \
    --gtest_filter="${CRL_GPU_FLASHINFER_TESTS:-Cuda*Engine*:*/*Cuda*Engine*:CudaLora*:CudaGraph*}" \
    > "$OUT/tests_cuda_flashinfer.log" 2>&1
  rc=$?
  note tests_cuda_flashinfer "{\"rc\": $rc}"
  grep -E "^\[  (PASSED|FAILED) |Failure|Expected|Which is|error" "$OUT/tests_cuda_flashinfer.log" | cut -c1-250 | head -30
  stamp "cuda tests with flashinfer attention rc=$rc"
fi

if want bench; then
  # nano-vllm's protocol: 256 sequences, prompt and output lengths uniform in 100..1024, EOS ignored.
  # CRL_GPU_BENCH_RUNS: shape:attention-kernel[:waves][:VAR=VALUE] (kv::CudaAttentionKernel; waves:
  # FlashInfer's split-KV bound, CRL_FLASHINFER_WAVES, 0 = no split; VAR=VALUE another variable,
  # e.g. CRL_FLASHINFER_PREFILL=0), one process each; the first also runs CRL_GPU_BENCH_MODES (and
  # the profile, with CRL_GPU_PROFILE=1), the others `continuous` alone.
  first=1
  for run in ${CRL_GPU_BENCH_RUNS:-qwen2-0.5b:v4 qwen2-0.5b:auto qwen3-0.6b:v4 qwen3-0.6b:flashinfer}; do
    IFS=: read -r shape kern waves extra <<< "$run"
    if [[ $waves == *=* ]]; then extra=$waves waves=""; fi
    tag=$kern${waves:+-w$waves}${extra:+-${extra//[^A-Za-z0-9]/-}}
    model=$CRL_CACHE_DIR/bench-$shape-bf16
    [ -f "$model/config.json" ] || "$BIN" make-model --shape "$shape" --dtype bfloat16 --out "$model" > /dev/null
    modes=continuous profile=""
    if [ $first = 1 ]; then
      modes=${CRL_GPU_BENCH_MODES:-continuous,eager,merged}
      [ -n "${CRL_GPU_PROFILE:-}" ] && profile=1
    fi
    env ${extra:+"$extra"} CRL_PAGED_ATTENTION=$kern CRL_FLASHINFER_WAVES=$waves timeout 300 "$BIN" bench rollout --model "$model" --dtype bfloat16 \
      --device cuda --workload-in "$OUT/workload.json" --n 1 --repeats 1 \
      --modes "$modes" --max-seqs 256 --max-batched-tokens 8192 \
      --kv-memory 64GiB --threads 8 --json-out "$OUT/rollout.jsonl" \
      ${profile:+--step-trace "$OUT/steps_$shape.jsonl" --profile "$OUT/prof_$shape" --profile-steps "${CRL_GPU_PROFILE_STEPS:-3:2,60:3,700:3}"} \
      > "$OUT/bench_rollout_${shape}_$tag.log" 2>&1
    note "bench_rc_${shape}_$tag" "$?"
    grep -E '^(continuous|eager|merged|host-sampler|libtorch) |roofline|time of|attention kernel|rror' "$OUT/bench_rollout_${shape}_$tag.log" | sed "s/^/$shape $tag: /" | cut -c1-300
    if [ -n "$profile" ]; then
      python3 scripts/profile_summary.py --top "${CRL_GPU_PROFILE_TOP:-22}" --steps "$OUT/steps_$shape.jsonl" "$OUT"/prof_"$shape".*.json \
        > "$OUT/profile_$shape.txt" 2>&1
      cat "$OUT/profile_$shape.txt"
      rm -f "$OUT"/prof_"$shape".*.json; gzip -f "$OUT/steps_$shape.jsonl"
    fi
    first=0
  done
  python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
runs, hf = [], None
try:
    runs = [json.loads(l) for l in open(out + "/rollout.jsonl").read().strip().splitlines()]
    hf = json.loads(open(out + "/bench_hf.log").read().strip().splitlines()[-1])
except Exception as e:
    print("gpu-check: benchmark comparison incomplete:", e)
for r in runs:
    for mode, m in r["modes"].items():
        vs = ""
        if hf and "qwen2" in r["model"]:
            vs = f"; HF generate {hf['output_tok_s']:.0f}: {m['gen_tok_s'] / hf['output_tok_s']:.1f}x"
        roof = r.get("roofline", {})
        print(f"engine {r['model'].rsplit('/', 1)[-1]} {r.get('attention_kernel')} "
              f"w{r.get('flashinfer_split_waves')} {mode}: "
              f"{m['gen_tok_s']:.0f} output tok/s ({m['seconds']:.2f} s, {m['steps']:.0f} steps), "
              f"{100 * roof.get('share_of_roofline', 0):.1f}% of roofline, "
              f"{m['d2h_bytes_per_step']:.0f} B/step device->host; host phases (s) {m.get('host_phase_s')}{vs}")
EOF
  stamp "bench done"
fi

if want rl; then
  # The RL job on the one GPU: 1 engine rank + 1 trainer rank sharing it (weights over CUDA IPC).
  timeout 300 "$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --steps "${CRL_GPU_RL_STEPS:-20}" --eval-every 10 \
    --timeout 120 --metrics "$OUT/rl_steps.jsonl" > "$OUT/rl.log" 2>&1
  rc=$?
  note rl "{\"rc\": $rc}"
  grep -E "placement|cuda|transport|colocated|^step (1|2|10|20)/|held-out accuracy|GRPO:|rror" "$OUT/rl.log" | cut -c1-300 | head -30
  # By default the pair takes turns (issue 54): synchronous steps, the engine's KV pool freed while
  # the trainer trains (its decode graphs captured again after); the hand-over rows time it.
  sed -n '/phase (mean per step)/,/memory hand-over: trainer/p' "$OUT/rl.log"
  # The same job as before the hand-over (--colocate off: fan-out, --max-staleness 1), side by side.
  timeout 300 "$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --colocate off --steps "${CRL_GPU_RL_STEPS:-20}" \
    --eval-every 10 --timeout 120 > "$OUT/rl_no_handover.log" 2>&1
  note rl_no_handover "{\"rc\": $?}"
  grep -E "^summary|held-out accuracy 0|GRPO:" "$OUT/rl_no_handover.log" | cut -c1-300
  # World rank 0's placement table: both on cuda:0, the one-rank train group on NCCL, the
  # sync_root group on Gloo (its weights over CUDA IPC).
  grep -qE '^\| 1 \| train 0 \| cuda:0 \| nccl \| root0 gloo \(one GPU\) \|$' "$OUT/rl.log"
  note rl_placement_table "{\"rc\": $?}"
  # Two trainers and the engine on the one GPU: the train group on Gloo with CUDA tensors (ZeRO-2
  # through c10d's Gloo), both sync_root groups on Gloo. CRL_GPU_RL_QUICK=1 skips it and the
  # refusals below.
  [ "${CRL_GPU_RL_QUICK:-0}" = 1 ] || {
  timeout 200 "$BIN" --gpus-infer 1 --gpus-train 2 --device cuda --device-map 0,0,0 --steps 2 \
    --sft-steps 2 --prompts-per-step 8 --n-samples 4 --eval-every 0 --timeout 60 \
    > "$OUT/rl_shared_gpu.log" 2>&1
  note rl_shared_gpu "{\"rc\": $?}"
  tail -3 "$OUT/rl_shared_gpu.log" | cut -c1-300
  # The same with --zero 3 (issue 55): parameters sharded over the two trainers, gathered for
  # each layer group's forward and backward, over Gloo with CUDA tensors.
  timeout 200 "$BIN" --gpus-infer 1 --gpus-train 2 --device cuda --device-map 0,0,0 --zero 3 \
    --steps 2 --sft-steps 2 --prompts-per-step 8 --n-samples 4 --eval-every 0 --timeout 60 \
    > "$OUT/rl_zero3_shared_gpu.log" 2>&1
  note rl_zero3_shared_gpu "{\"rc\": $?}"
  grep -E "ZeRO|rror" "$OUT/rl_zero3_shared_gpu.log" | head -3 | cut -c1-300; tail -2 "$OUT/rl_zero3_shared_gpu.log" | cut -c1-300
  # The hand-over at Qwen2-0.5B's shape (issue 54's target: <= 50 ms each way): random bf16
  # weights, a 16 GiB KV pool freed for every train phase and taken back (decode graphs captured
  # again), fp32 masters cast into the engine's buckets over CUDA IPC (push) each step.
  model=$CRL_CACHE_DIR/bench-qwen2-0.5b-bf16
  [ -f "$model/config.json" ] || "$BIN" make-model --shape qwen2-0.5b --dtype bfloat16 --out "$model" > /dev/null
  timeout 240 "$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --model "$model" --dtype bfloat16 \
    --sft-steps 0 --steps "${CRL_GPU_HANDOVER_STEPS:-6}" --eval-every 0 --kv-memory 16GiB \
    --timeout 120 --verbose --metrics "$OUT/rl_handover_qwen2.jsonl" > "$OUT/rl_handover_qwen2.log" 2>&1
  note rl_handover_qwen2 "{\"rc\": $?}"
  grep -E "^plan|^\| cuda|transport|^step [0-9]+/|rror" "$OUT/rl_handover_qwen2.log" | cut -c1-400 | head -16
  sed -n '/phase (mean per step)/,/memory hand-over: trainer/p' "$OUT/rl_handover_qwen2.log"
  # Tensor parallelism needs a GPU a rank: refused on one, naming the GPU it lacks.
  out=$("$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --infer-tp 2 --steps 1 2>&1)
  grep -qE -- 'needs GPU 1|GPU' <<< "$out"; note rl_tp_on_one_gpu "{\"rc\": $?}"
  tail -2 <<< "$out" | cut -c1-300
  # Refused at start, naming the flag.
  out=$("$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --deterministic 2>&1)
  grep -q -- '--deterministic needs --device cpu' <<< "$out"
  note rl_refuses_deterministic "{\"rc\": $?}"
  out=$("$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --comm-backend nccl 2>&1)
  grep -q -- '--comm-backend nccl: the sync_root group' <<< "$out"
  note rl_refuses_nccl_on_one_gpu "{\"rc\": $?}"
  # A KV pool larger than the GPU: refused by the memory plan before any rank starts.
  out=$("$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --kv-memory 400GiB 2>&1)
  grep -q -- 'memory plan: cuda:0 (1 engine, 1 trainer) needs about' <<< "$out"
  note rl_refuses_what_does_not_fit "{\"rc\": $?}"
  }
  stamp "rl rc=$rc"
fi

if want sync; then
  # Same-GPU weight updates: the IPC bucket update against the device's own copy of the same bytes
  # (target >= 80%); the IPC tests ran with `tests` (gpu.sync_check_ipc_*).
  timeout 240 "$BIN" bench sync --device cuda --shapes qwen2-0.5b --dtypes float32,bfloat16 \
    --topologies 1-1 --repeats 5 --results "$OUT/sync_bench_ipc.jsonl" > "$OUT/bench_sync_ipc.log" 2>&1
  note bench_sync_ipc "{\"rc\": $?}"
  tail -10 "$OUT/bench_sync_ipc.log"
  stamp "sync done"
fi

if want tests; then
  # With `cudatests` in the same call, its suites are not run twice.
  excl=""; want cudatests && excl="-E ^gpu\.cuda_tests$"
  timeout 300 ctest --test-dir "$BUILD" -L gpu $excl --output-on-failure > "$OUT/tests_gpu.log" 2>&1
  rc=$?
  note tests_gpu "{\"rc\": $rc}"
  grep -E "tests passed|\(Failed\)|Timeout|\[  FAILED  \]|transport ipc|sync-check: (PASS|FAIL)" "$OUT/tests_gpu.log" | head -30
  stamp "gpu tests rc=$rc"
fi

# A real tokenizer (issue 12): Qwen3-0.6B's shape, random bf16 weights, Qwen3's tokenizer.json and
# chat template (CRL_GPU_TOKENIZER: a tokenizer directory; default .gpu-tok/qwen3).
if want qwen3; then
  tokdir=${CRL_GPU_TOKENIZER:-$ROOT/.gpu-tok/qwen3}
  model=$CRL_CACHE_DIR/bench-qwen3-0.6b-bf16-realtok
  [ -f "$model/config.json" ] || "$BIN" make-model --shape qwen3-0.6b --dtype bfloat16 \
    --tokenizer-from "$tokdir" --out "$model"
  "$BIN" generate --model "$model" --device cuda --dtype bfloat16 --prompt "The capital of France is" \
    --max-tokens 16 --json 2>&1 | tail -2 | tee "$OUT/generate_qwen3.log"
fi

if want unit; then
  # The CPU unit tests on this build (libtorch 2.x, another compiler): the API both accept.
  ctest --test-dir "$BUILD" -L unit -j "$(( NPROC / 2 ))" --timeout 300 > "$OUT/tests_unit.log" 2>&1
  note tests_unit "{\"rc\": $?, \"summary\": \"$(grep -E 'tests passed' "$OUT/tests_unit.log")\"}"
  grep -E "tests passed|\(Failed\)|SEGFAULT|Timeout" "$OUT/tests_unit.log" | head -30
fi
stamp "done"
cat "$results"
