# What needs an NVIDIA GPU (scripts/gpu-check.sh runs `ctest -L gpu` there); each test skips
# itself where no CUDA device is present. Included by tests/CMakeLists.txt.

add_test(NAME gpu.cuda_tests COMMAND crl_tests --gtest_filter=Cuda*:*/*Cuda*)
set_tests_properties(gpu.cuda_tests PROPERTIES LABELS gpu TIMEOUT 600
                     ENVIRONMENT "CRL_CACHE_DIR=${CMAKE_CURRENT_BINARY_DIR}/test-cache")

# Same-GPU colocation (issue 30): engine and trainer processes share the one GPU, so the job uses
# Gloo groups and the weights move over CUDA IPC, one device copy per bucket; sync-check checks every
# engine tensor bit-identical to the trainer's (and --sync-verify's per-bucket checksums) and the
# engine's greedy output equal to the trainer model's. fp32: the trainer's flat storage handed over
# in one batch; bf16: cast bucket by bucket into one send buffer, reused once acknowledged. The
# bench entry runs `bench sync` on the GPU: the IPC bucket update next to the device's copy.
set(CRL_SKIP_WITHOUT_GPU "nvidia-smi -L >/dev/null 2>&1 || exit 77")
set(CRL_IPC_PASS "transport ipc ;; bit-identical to the trainer.s: yes ;; ipc bucket hand-overs per sync == buckets .*: yes ;; greedy output equal to the trainer model.s: yes ;; sync-check: PASS")
add_test(NAME gpu.sync_check_ipc_one_gpu_fp32
         COMMAND sh -c "${CRL_SKIP_WITHOUT_GPU}; exec ${CRL_RUN_JOB} pass 240 '${CRL_IPC_PASS}' -- $<TARGET_FILE:colocated-rl> sync-check --device cuda --gpus-infer 1 --gpus-train 1 --sync-verify --syncs 3 --timeout 60")
add_test(NAME gpu.sync_check_ipc_one_gpu_bf16_reused_send_buffer
         COMMAND sh -c "${CRL_SKIP_WITHOUT_GPU}; exec ${CRL_RUN_JOB} pass 240 '${CRL_IPC_PASS}' -- $<TARGET_FILE:colocated-rl> sync-check --device cuda --dtype bfloat16 --gpus-infer 1 --gpus-train 1 --sync-bucket-mb 1 --sync-inflight 1 --sync-ipc pull --sync-verify --syncs 3 --timeout 60")
# bf16 engines, fp32 trainers: the trainers cast straight into the engines' buckets (push), two of
# each on the one GPU (every engine opens its buckets to both senders).
add_test(NAME gpu.sync_check_ipc_one_gpu_bf16_push_two_engines
         COMMAND sh -c "${CRL_SKIP_WITHOUT_GPU}; exec ${CRL_RUN_JOB} pass 240 '${CRL_IPC_PASS}' -- $<TARGET_FILE:colocated-rl> sync-check --device cuda --dtype bfloat16 --gpus-infer 2 --gpus-train 2 --sync-bucket-mb 1 --sync-ipc push --sync-verify --syncs 3 --timeout 60")
add_test(NAME gpu.bench_sync_ipc_one_gpu
         COMMAND sh -c "${CRL_SKIP_WITHOUT_GPU}; cd ${CMAKE_CURRENT_BINARY_DIR} && exec ${CRL_RUN_JOB} pass 300 '[|] bucket [|] ipc [|] ;; [|] copy [|] - [|] ;; of device copy' -- $<TARGET_FILE:colocated-rl> bench sync --device cuda --shapes default --dtypes float32 --topologies 1-1 --repeats 3 --results gpu_sync_bench.jsonl")
set_tests_properties(gpu.sync_check_ipc_one_gpu_fp32 gpu.sync_check_ipc_one_gpu_bf16_reused_send_buffer
                     gpu.sync_check_ipc_one_gpu_bf16_push_two_engines
                     gpu.bench_sync_ipc_one_gpu PROPERTIES LABELS gpu SKIP_RETURN_CODE 77
                     ENVIRONMENT "${CRL_CLI_ENV}" TIMEOUT 400 RESOURCE_LOCK gpu_device)
