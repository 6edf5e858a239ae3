#!/usr/bin/env python3
"""Hugging Face transformers `generate` on the workload `colocated-rl bench rollout --workload-out`
wrote: the baseline of the GPU rollout benchmark (scripts/gpu-check.sh).

Same checkpoint, same prompts, same requested output lengths, sampling at temperature 1 with EOS
ignored (min_new_tokens = max_new_tokens). HF pads a batch to its longest prompt (left) and runs
every sequence to the batch's longest output, so only the requested tokens are counted as output:
the wasted work is the baseline's real cost. Prints one JSON line.

  python3 bench/hf_generate.py --model DIR --workload W.json [--batch 256] [--dtype bfloat16]

A DIR with config.json and no weights gets random weights of that shape (throughput does not
depend on their values with EOS ignored), so this baseline can run while colocated-rl builds.
--make-workload writes a workload instead of reading one (prompt and output lengths uniform in
the given ranges, random ids): `colocated-rl bench rollout --workload-in W.json` runs the same.
"""
import argparse
import json
import os
import random
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="model directory (required unless --make-workload)")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--batch", type=int, default=256, help="sequences per generate call")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--make-workload", action="store_true",
                    help="write --workload (with --prompts, --prompt-len, --output-len, --vocab, "
                         "--seed) and exit")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--prompt-len", default="100..1024")
    ap.add_argument("--output-len", default="100..1024")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    if args.make_workload:
        rng = random.Random(args.seed)
        span = lambda r: tuple(int(x) for x in r.split(".."))
        (pa, pb), (oa, ob) = span(args.prompt_len), span(args.output_len)
        prompts = [[rng.randrange(4, args.vocab) for _ in range(rng.randint(pa, pb))]
                   for _ in range(args.prompts)]
        outputs = [rng.randint(oa, ob) for _ in range(args.prompts)]
        json.dump({"prompts": prompts, "output_lens": outputs, "n": 1}, open(args.workload, "w"))
        return

    w = json.load(open(args.workload))
    seqs = []  # (prompt ids, output length), n samples per prompt as separate rows
    for p, o in zip(w["prompts"], w["output_lens"]):
        seqs += [(p, o)] * int(w.get("n", 1))
    dtype = getattr(torch, args.dtype)
    if any(f.endswith(".safetensors") for f in os.listdir(args.model)):
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model)).to(dtype)
    model = model.to(args.device).eval()

    def run(batch):
        longest = max(len(p) for p, _ in batch)
        ids = torch.zeros((len(batch), longest), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (p, _) in enumerate(batch):
            ids[i, longest - len(p):] = torch.tensor(p)
            mask[i, longest - len(p):] = 1
        new = max(o for _, o in batch)
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(args.device), attention_mask=mask.to(args.device),
                                 max_new_tokens=new, min_new_tokens=new, do_sample=True,
                                 temperature=1.0, top_k=None, top_p=None, pad_token_id=0,
                                 eos_token_id=None)
        return out.shape[1] - longest

    run(seqs[:8])  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in range(0, len(seqs), args.batch):
        run(seqs[b:b + args.batch])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    useful = sum(o for _, o in seqs)
    print(json.dumps({"bench": "hf_generate", "device": torch.cuda.get_device_name(),
                      "transformers_batch": args.batch, "sequences": len(seqs),
                      "output_tokens": useful, "seconds": seconds,
                      "output_tok_s": useful / seconds}))


if __name__ == "__main__":
    main()
