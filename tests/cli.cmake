# CLI and server tests that drive the real binary (included by tests/CMakeLists.txt, which sets
# CRL_CLI_ENV).

# The real binary on the embedded default model (generated into the test cache).
add_test(NAME cli.generate_default_model
         COMMAND colocated-rl generate --prompt "Question: what is 3 plus 4? Answer:" --n 2
                 --max-tokens 8 --seed 1 --json)
set_tests_properties(cli.generate_default_model PROPERTIES LABELS unit ENVIRONMENT "${CRL_CLI_ENV}"
                     PASS_REGULAR_EXPRESSION "\"finish_reason\"")
add_test(NAME cli.make_model_qwen2_shape_then_generate
         COMMAND sh -c "$<TARGET_FILE:colocated-rl> make-model --shape qwen2-0.5b --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 600 --max-pos 256 --dtype bfloat16 --out ${CMAKE_CURRENT_BINARY_DIR}/cli-qwen2 && $<TARGET_FILE:colocated-rl> generate --model ${CMAKE_CURRENT_BINARY_DIR}/cli-qwen2 --dtype bfloat16 --max-tokens 4 --temperature 0")
set_tests_properties(cli.make_model_qwen2_shape_then_generate PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}")
# `plan` (issue 55): an 8B full fine-tune on 4 + 4 GPUs of 80 GiB fits at ZeRO-2 (the default
# with 4 train ranks, exit 0); at ZeRO-0 it does not, and the plan names the trainer's GPU and the
# flags that would fit (exit 1). A planning shape is never generated.
add_test(NAME cli.plan_an_8b_full_fine_tune_on_4_plus_4_gpus
         COMMAND sh -c "$<TARGET_FILE:colocated-rl> plan --shape llama3.1-8b --gpus-infer 4 --gpus-train 4 --dtype bfloat16 --kv-memory 20GiB --micro-batch-tokens 4096 && echo rc=$? && $<TARGET_FILE:colocated-rl> plan --shape llama3.1-8b --gpus-infer 4 --gpus-train 4 --dtype bfloat16 --kv-memory 20GiB --zero 0; echo rc=$? && $<TARGET_FILE:colocated-rl> bench train --shape llama3.1-8b 2>&1; echo rc=$?")
set_tests_properties(cli.plan_an_8b_full_fine_tune_on_4_plus_4_gpus PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}"
                     PASS_REGULAR_EXPRESSION "llama3.1-8b \\(8.03 B parameters\\), 1 node x 8 GPUs.*\\| cuda:4 \\| 1 trainer \\|.*fits: the largest peak is [0-9.]+ GiB \\(cuda:4\\).*rc=0.*does not fit: cuda:4 needs about.*  --zero 2 +largest peak.*  --offload-optimizer +largest peak.*rc=1.*is for planning.*rc=[1-9]")
# A 32B full fine-tune on 2 nodes of 4 + 4 at ZeRO-3 (issue 55): its weight updates streamed a run
# of buckets at a time (the default --sync-chunk-mb), the trainers fit with the optimizer on the
# GPU; gathered whole first (--sync-chunk-mb 0) they do not, and the plan names the offload.
add_test(NAME cli.plan_a_32b_zero3_fits_when_its_weight_updates_stream
         COMMAND sh -c "for c in 1024 0; do $<TARGET_FILE:colocated-rl> plan --shape qwen2.5-32b --nnodes 2 --gpus-infer 4 --gpus-train 4 --dtype bfloat16 --zero 3 --activation-checkpointing --micro-batch-tokens 1024 --kv-memory 16GiB --sync-chunk-mb $c; echo rc=$?; done")
set_tests_properties(cli.plan_a_32b_zero3_fits_when_its_weight_updates_stream PROPERTIES
                     LABELS unit ENVIRONMENT "${CRL_CLI_ENV}"
                     PASS_REGULAR_EXPRESSION "\\| cuda:4 \\| 1 trainer \\|[^\n]*\\(weight update: 1\\.[0-9]+ GiB gathered\\).*fits: the largest peak.*rc=0.*\\(weight update: 1[5-9]\\.[0-9]+ GiB gathered\\).*does not fit: cuda:[0-9]+ needs.*--offload-optimizer.*rc=1")
# Log-prob tokens and bytes through the official OpenAI SDK (npm, pinned with the tokenizer
# fixtures) against `serve` over a model with Qwen3's real tokenizer.
set(CRL_TOKENIZER_FIXTURES ${CMAKE_CURRENT_BINARY_DIR}/test-cache/tokenizer-fixtures)
add_test(NAME server.openai_sdk_logprob_bytes_concatenate_to_the_content
         COMMAND sh -c "${CMAKE_SOURCE_DIR}/scripts/tokenizer_fixtures.sh ${CRL_TOKENIZER_FIXTURES} && node ${CMAKE_CURRENT_SOURCE_DIR}/server/openai_sdk_logprobs.mjs $<TARGET_FILE:colocated-rl> ${CRL_TOKENIZER_FIXTURES} ${CMAKE_CURRENT_BINARY_DIR}/openai-sdk")
set_tests_properties(server.openai_sdk_logprob_bytes_concatenate_to_the_content PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}" TIMEOUT 300)
# A multi-turn tool conversation in one session through the official OpenAI SDK: the ids stay the
# session's, one segment for 10 turns with Qwen3's template too (issue 52), 409, a retry.
add_test(NAME server.openai_sdk_multi_turn_session_keeps_its_ids
         COMMAND sh -c "${CMAKE_SOURCE_DIR}/scripts/tokenizer_fixtures.sh ${CRL_TOKENIZER_FIXTURES} && node ${CMAKE_CURRENT_SOURCE_DIR}/server/openai_sdk_session.mjs $<TARGET_FILE:colocated-rl> ${CRL_TOKENIZER_FIXTURES} ${CMAKE_CURRENT_BINARY_DIR}/openai-sdk-session ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/chat_templates")
set_tests_properties(server.openai_sdk_multi_turn_session_keeps_its_ids PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}" TIMEOUT 300)
# `serve`'s RSS after large bodies (8 MiB prompts, chunked or not, 413s) stays within 2x
# --max-body-bytes of idle (issue 49). Run without a MALLOC_ARENA_MAX the server would respect.
add_test(NAME server.rss_after_large_bodies_within_twice_the_body_limit
         COMMAND env -u MALLOC_ARENA_MAX python3 ${CMAKE_CURRENT_SOURCE_DIR}/server/server_rss_bounded.py
                 $<TARGET_FILE:colocated-rl>)
set_tests_properties(server.rss_after_large_bodies_within_twice_the_body_limit PROPERTIES
                     LABELS unit ENVIRONMENT "${CRL_CLI_ENV}" TIMEOUT 180)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/bad.jsonl "{\"prompt\": \"ok\"}\n{\"prompt\": 3}\n")
add_test(NAME cli.generate_rejects_bad_jsonl_naming_the_line
         COMMAND colocated-rl generate --jsonl ${CMAKE_CURRENT_BINARY_DIR}/bad.jsonl)
set_tests_properties(cli.generate_rejects_bad_jsonl_naming_the_line PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}" PASS_REGULAR_EXPRESSION "bad.jsonl:2: ")
add_test(NAME cli.generate_rejects_missing_model_dir
         COMMAND colocated-rl generate --model ${CMAKE_CURRENT_BINARY_DIR}/no-such-model)
set_tests_properties(cli.generate_rejects_missing_model_dir PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}" PASS_REGULAR_EXPRESSION "no-such-model")
# tokenize / detokenize: one JSON line out per line in, in order; a bad line is named.
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/tok.jsonl "{\"text\": \"Question: what is 3 plus 4?\"}\n\n{\"text\": \"\"}\n")
add_test(NAME cli.tokenize_then_detokenize_round_trips
         COMMAND sh -c "$<TARGET_FILE:colocated-rl> tokenize --jsonl ${CMAKE_CURRENT_BINARY_DIR}/tok.jsonl | sed -n 1p | sed 's/.*\\(\"ids\":\\[[^]]*\\]\\).*/{\\1}/' | $<TARGET_FILE:colocated-rl> detokenize")
set_tests_properties(cli.tokenize_then_detokenize_round_trips PROPERTIES LABELS unit ENVIRONMENT "${CRL_CLI_ENV}"
                     PASS_REGULAR_EXPRESSION "^{\"text\":\"Question: what is 3 plus 4\\?\"}")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/tok_bad.jsonl "{\"text\": \"ok\"}\n{\"text\": 3}\n")
add_test(NAME cli.tokenize_rejects_bad_jsonl_naming_the_line
         COMMAND colocated-rl tokenize --jsonl ${CMAKE_CURRENT_BINARY_DIR}/tok_bad.jsonl)
set_tests_properties(cli.tokenize_rejects_bad_jsonl_naming_the_line PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}" PASS_REGULAR_EXPRESSION "tok_bad.jsonl:2: \"text\" must be a string")
# make-model --help names every shape it makes (they come from the one preset list).
add_test(NAME cli.make_model_help_lists_every_shape COMMAND colocated-rl make-model --help)
set_tests_properties(cli.make_model_help_lists_every_shape PROPERTIES LABELS unit
                     PASS_REGULAR_EXPRESSION "default, smollm2-135m, qwen2-0.5b, qwen2-1.5b,[ \n]+qwen3-0.6b")
add_test(NAME cli.make_model_tokenizer_from_must_hold_a_tokenizer
         COMMAND colocated-rl make-model --out ${CMAKE_CURRENT_BINARY_DIR}/tok-from-nothing
                 --tokenizer-from ${CMAKE_CURRENT_BINARY_DIR}/no-such-tokenizer)
set_tests_properties(cli.make_model_tokenizer_from_must_hold_a_tokenizer PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}" PASS_REGULAR_EXPRESSION "no-such-tokenizer is not a directory holding tokenizer.json")
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/not-a-model)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/not-a-model/precious.txt "keep me\n")
add_test(NAME cli.make_model_refuses_to_replace_a_non_model_directory
         COMMAND colocated-rl make-model --out ${CMAKE_CURRENT_BINARY_DIR}/not-a-model)
set_tests_properties(cli.make_model_refuses_to_replace_a_non_model_directory PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}" PASS_REGULAR_EXPRESSION "refusing to replace it"
                     FIXTURES_SETUP refused_make_model)
add_test(NAME cli.make_model_left_the_non_model_directory_intact
         COMMAND test -f ${CMAKE_CURRENT_BINARY_DIR}/not-a-model/precious.txt)
set_tests_properties(cli.make_model_left_the_non_model_directory_intact PROPERTIES LABELS unit
                     FIXTURES_REQUIRED refused_make_model)
# --reward (issue 52): a word that is neither a built-in reward nor a program is refused before
# launch (not a reward_died on every request); a program does not combine with --env or
# --answer-extract; a bad --answer-extract lists the forms.
add_test(NAME cli.train_refuses_a_reward_that_is_no_kind_and_no_program
         COMMAND colocated-rl --reward exat --steps 1)
set_tests_properties(cli.train_refuses_a_reward_that_is_no_kind_and_no_program PROPERTIES
                     LABELS unit ENVIRONMENT "${CRL_CLI_ENV}"
                     PASS_REGULAR_EXPRESSION "--reward 'exat': not a built-in reward \\(exact, numeric, regex, format\\) and 'exat' is no program")
add_test(NAME cli.train_refuses_a_reward_program_with_env
         COMMAND colocated-rl --reward "python3 x.py" --env calculator --steps 1)
set_tests_properties(cli.train_refuses_a_reward_program_with_env PROPERTIES
                     LABELS unit ENVIRONMENT "${CRL_CLI_ENV}"
                     PASS_REGULAR_EXPRESSION "--reward COMMAND scores single-turn completions; an --env's episodes are scored by the environment")
add_test(NAME cli.train_refuses_an_unknown_answer_extraction
         COMMAND colocated-rl --answer-extract last --steps 1)
set_tests_properties(cli.train_refuses_an_unknown_answer_extraction PROPERTIES
                     LABELS unit ENVIRONMENT "${CRL_CLI_ENV}"
                     PASS_REGULAR_EXPRESSION "unknown answer extraction 'last' \\(known: first-line, last-line, after:STR such as after:####, boxed, full\\)")
# Command-line mistakes (issue 52): one line naming the flag, file or command with the nearest
# known one, a non-zero exit, no stack trace; --version, bare help, option groups within 100
# columns, --config FILE.
add_test(NAME cli.mistakes_get_one_line_naming_the_flag_and_a_suggestion
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/app/cli_errors.sh $<TARGET_FILE:colocated-rl>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli-errors)
set_tests_properties(cli.mistakes_get_one_line_naming_the_flag_and_a_suggestion PROPERTIES
                     LABELS unit ENVIRONMENT "${CRL_CLI_ENV}" TIMEOUT 120)

# A tensor-parallel engine (--tp 2: the default model's 4 heads and 2 KV heads split over two
# ranks, threads of the one process) generates the unsplit engine's greedy and seeded tokens.
add_test(NAME cli.generate_tensor_parallel_equals_one_rank
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/app/tensor_parallel_generate.sh
                 $<TARGET_FILE:colocated-rl>)
set_tests_properties(cli.generate_tensor_parallel_equals_one_rank PROPERTIES LABELS unit
                     ENVIRONMENT "${CRL_CLI_ENV}" TIMEOUT 120)
