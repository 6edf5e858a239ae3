#!/usr/bin/env bash
# The CUDA path on a Linux machine with an NVIDIA GPU and a CUDA PyTorch: configures and builds
# colocated-rl against that PyTorch's libtorch and NCCL, runs the `gpu`-labelled tests, the unit
# tests on that build, the engine on the device, and the rollout benchmark against Hugging Face
# generate. Results: $OUT (default gpu-results/): build.log, tests.log, bench logs, results.json.
#
#   scripts/gpu-check.sh fetch-debs                       (on a Debian machine with apt)
#   scripts/gpu-check.sh [build] [tests] [bench] [qwen3] [rl] [unit]   (default: all, in that order)
#
# C++ dependencies the GPU machine lacks come from Debian bookworm .deb files unpacked into a
# local prefix (nothing is installed system-wide): `scripts/gpu-check.sh fetch-debs` downloads
# them into .gpu-deps/ on any Debian machine (apt-get download); carry that folder over.
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
  mkdir -p "$DEBS" && cd "$DEBS" && apt-get download $DEB_PACKAGES
  exit $?
fi
STAGES=${*:-all}
want() { [[ " $STAGES " == *" all "* || " $STAGES " == *" $1 "* ]]; }
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

# --- environment: the prefix, libtorch, NCCL, the GPU ---
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
TORCH_PREFIX=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)")
TORCH_LIB=$(python3 -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
NCCL_HOME=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null || echo /usr/local/cuda)
export NCCL_HOME
# libnccl is dlopen'ed by name: make the wheel's copy findable.
export LD_LIBRARY_PATH=$NCCL_HOME/lib:$TORCH_LIB:$LD_LIBRARY_PATH
[ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -sf "$NCCL_HOME"/lib/libnccl.so.* "$NCCL_HOME/lib/libnccl.so" 2>/dev/null
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "gpu-check: gpu: $GPU; torch $(python3 -c 'import torch; print(torch.__version__)'); nvcc $(nvcc --version | tail -1)"
note gpu "\"$GPU\""
note torch "\"$(python3 -c 'import torch; print(torch.__version__)')\""

if want build; then
  start=$(date +%s)
  mkdir -p "$PREFIX/fmt-first" && ln -sfn "$PREFIX/usr/include/fmt" "$PREFIX/fmt-first/fmt"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$PREFIX/usr" -DPKG_CONFIG_EXECUTABLE="$PKGCONF" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" \
    -DCRL_FMT_INCLUDE_FIRST="$PREFIX/fmt-first" 2>&1 | tee "$OUT/configure.log"
  cmake --build "$BUILD" -j "$(nproc)" -- -k 0 2>&1 | tee "$OUT/build.log" | grep -E "error|FAILED|warning: .*deprecated" | head -80
  rc=${PIPESTATUS[0]}
  note build "{\"rc\": $rc, \"seconds\": $(( $(date +%s) - start ))}"
  [ "$rc" -eq 0 ] || { echo "gpu-check: build failed (see $OUT/build.log)"; exit 1; }
fi
BIN=$BUILD/app/colocated-rl
export CRL_CACHE_DIR=${CRL_CACHE_DIR:-/tmp/crl-gpu-cache}

if want tests; then
  ctest --test-dir "$BUILD" -L gpu --output-on-failure 2>&1 | tee "$OUT/tests_gpu.log" | tail -40
  note tests_gpu "{\"rc\": ${PIPESTATUS[0]}}"
  "$BIN" generate --device cuda --dtype bfloat16 --prompt "Hello" --max-tokens 16 --json 2>&1 | tail -3 | tee "$OUT/generate.log"
fi

if want bench; then
  model=$CRL_CACHE_DIR/bench-qwen2-0.5b-bf16
  [ -f "$model/config.json" ] || "$BIN" make-model --shape qwen2-0.5b --dtype bfloat16 --out "$model"
  # Issue 15's workload: 256 sequences, prompt and output uniform in 100..1024, EOS ignored.
  timeout 300 "$BIN" bench rollout --model "$model" --dtype bfloat16 --device cuda --prompts 256 --n 1 \
    --prompt-len 100..1024 --output-len 100..1024 --repeats 1 --modes continuous \
    --max-seqs 256 --max-batched-tokens 8192 --kv-memory 24GiB --threads 8 \
    --workload-out "$OUT/workload.json" --json-out "$OUT/rollout.jsonl" 2>&1 | tee "$OUT/bench_rollout.log"
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/hf_generate.py --model "$model" --workload "$OUT/workload.json" \
    --batch 256 2>&1 | tee "$OUT/bench_hf.log" | tail -1
  python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
ours = json.loads(open(out + "/rollout.jsonl").read().strip().splitlines()[-1])
hf = json.loads(open(out + "/bench_hf.log").read().strip().splitlines()[-1])
c = ours["modes"]["continuous"]
print(f"engine {c['gen_tok_s']:.0f} output tok/s vs HF generate {hf['output_tok_s']:.0f}: "
      f"{c['gen_tok_s'] / hf['output_tok_s']:.1f}x")
EOF
fi
# A real tokenizer (issue 12): Qwen3-0.6B's shape, random bf16 weights, Qwen3's tokenizer.json and
# chat template (CRL_GPU_TOKENIZER: a tokenizer directory; default .gpu-tok/qwen3). Text prompts
# are encoded and decoded by the tokenizer.json implementation; same workload as `bench`.
if want qwen3; then
  tokdir=${CRL_GPU_TOKENIZER:-$ROOT/.gpu-tok/qwen3}
  model=$CRL_CACHE_DIR/bench-qwen3-0.6b-bf16-realtok
  [ -f "$model/config.json" ] || "$BIN" make-model --shape qwen3-0.6b --dtype bfloat16 \
    --tokenizer-from "$tokdir" --out "$model"
  "$BIN" generate --model "$model" --device cuda --dtype bfloat16 --prompt "The capital of France is" \
    --max-tokens 16 --json 2>&1 | tail -2 | tee "$OUT/generate_qwen3.log"
  timeout 300 "$BIN" bench rollout --model "$model" --dtype bfloat16 --device cuda --prompts 256 --n 1 \
    --prompt-len 100..1024 --output-len 100..1024 --repeats 1 --modes continuous \
    --max-seqs 256 --max-batched-tokens 8192 --kv-memory 24GiB --threads 8 \
    --workload-out "$OUT/workload_qwen3.json" --json-out "$OUT/rollout_qwen3.jsonl" 2>&1 | tee "$OUT/bench_rollout_qwen3.log"
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/hf_generate.py --model "$model" --workload "$OUT/workload_qwen3.json" \
    --batch 256 2>&1 | tee "$OUT/bench_hf_qwen3.log" | tail -1
fi

if want rl; then
  # The RL job on the one GPU: 1 engine rank + 1 trainer rank sharing it. World rank 0's placement
  # table puts both on cuda:0, the one-rank train group on NCCL, the sync_root group on Gloo.
  timeout 300 "$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --steps 4 --sft-steps 2 \
    --prompts-per-step 8 --n-samples 4 --eval-every 0 --timeout 60 --metrics "$OUT/rl_steps.jsonl" \
    2>&1 | tee "$OUT/rl.log" | tail -25
  note rl "{\"rc\": ${PIPESTATUS[0]}}"
  grep -qE '^\| 1 \| train 0 \| cuda:0 \| nccl \| root0 gloo \(one GPU\) \|$' "$OUT/rl.log"
  note rl_placement_table "{\"rc\": $?}"
  # Two trainers and the engine on the one GPU: the train group on Gloo with CUDA tensors (ZeRO-2
  # through c10d's Gloo), both sync_root groups on Gloo.
  timeout 300 "$BIN" --gpus-infer 1 --gpus-train 2 --device cuda --device-map 0,0,0 --steps 2 \
    --sft-steps 2 --prompts-per-step 8 --n-samples 4 --eval-every 0 --timeout 60 \
    2>&1 | tee "$OUT/rl_shared_gpu.log" | tail -12
  note rl_shared_gpu "{\"rc\": ${PIPESTATUS[0]}}"
  # Refused at start, naming the flag.
  out=$("$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --deterministic 2>&1)
  grep -q -- '--deterministic needs --device cpu' <<< "$out"
  note rl_refuses_deterministic "{\"rc\": $?}"
  out=$("$BIN" --gpus-infer 1 --gpus-train 1 --device cuda --comm-backend nccl 2>&1)
  grep -q -- '--comm-backend nccl: the sync_root group' <<< "$out"
  note rl_refuses_nccl_on_one_gpu "{\"rc\": $?}"
fi

if want unit; then
  # The CPU unit tests on this build (libtorch 2.x, another compiler): the API both accept.
  ctest --test-dir "$BUILD" -L unit -j "$(( $(nproc) / 2 ))" --timeout 300 > "$OUT/tests_unit.log" 2>&1
  note tests_unit "{\"rc\": $?, \"summary\": \"$(grep -E 'tests passed' "$OUT/tests_unit.log")\"}"
  grep -E "tests passed|\(Failed\)|SEGFAULT|Timeout" "$OUT/tests_unit.log" | head -30
fi
cat "$results"
