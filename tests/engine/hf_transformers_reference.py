#!/usr/bin/env python3
"""The engine's second forward reference: Hugging Face transformers running its own modelling code
(LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM) on a model directory
the project wrote, in float32 with eager attention on the CPU. Where tests/engine/hf_reference.py
was written from a reading of those definitions (and of config.json), this one is the definitions
themselves: it catches a config field both readings got wrong.

  hf_transformers_reference.py MODEL_DIR TOKEN_ID... -> one JSON list: the last position's logits
  exit 77 when transformers cannot be imported (the test fails naming it: CRL_HF_PYTHON names a
  python that should have it; without CRL_HF_PYTHON the test skips)
"""
import json
import sys

try:
    import torch
    from transformers import AutoModelForCausalLM
except Exception as e:  # noqa: BLE001 - any import failure means "no reference here"
    print(f"transformers is not importable: {e}", file=sys.stderr)
    sys.exit(77)


def forward(model_dir, ids):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return out.logits[0, -1].double().tolist()


if __name__ == "__main__":
    print(json.dumps(forward(sys.argv[1], [int(t) for t in sys.argv[2:]])))
