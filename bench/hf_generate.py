#!/usr/bin/env python3
"""Hugging Face transformers `generate` on the workload `colocated-rl bench rollout --workload-out`
wrote: the baseline of the GPU rollout benchmark (scripts/gpu-check.sh).

Same checkpoint, same prompts, same requested output lengths, sampling at temperature 1 with EOS
ignored (min_new_tokens = max_new_tokens). HF pads a batch to its longest prompt (left) and runs
every sequence to the batch's longest output, so only the requested tokens are counted as output:
the wasted work is the baseline's real cost. Prints one JSON line.

  python3 bench/hf_generate.py --model DIR --workload W.json [--batch 256] [--dtype bfloat16]
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--batch", type=int, default=256, help="sequences per generate call")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    w = json.load(open(args.workload))
    seqs = []  # (prompt ids, output length), n samples per prompt as separate rows
    for p, o in zip(w["prompts"], w["output_lens"]):
        seqs += [(p, o)] * int(w.get("n", 1))
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()

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
