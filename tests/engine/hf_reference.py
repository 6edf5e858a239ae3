#!/usr/bin/env python3
"""An independent forward of a Hugging Face model directory (Llama, Mistral, Qwen2, Qwen3), in
PyTorch and float64, written from the transformers modelling code's definitions and sharing no
code with the engine: the reference the engine's logits are tested against.

  hf_reference.py MODEL_DIR TOKEN_ID... -> prints one JSON list: the logits of the last position
"""
import json
import math
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + a:base + b]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).to(torch.float64)
    return out


def rope_inv_freq(cfg, dim):
    # transformers 5 writes rope_parameters {rope_type, rope_theta, ...} in place of the two fields.
    rp = cfg.get("rope_parameters") or {}
    base = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = cfg.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":  # transformers' _compute_llama3_parameters
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wl >= hi_wl) & (wl <= lo_wl)
        return torch.where(is_mid, mid, scaled)
    raise SystemExit(f"reference: rope type {kind} not implemented")


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(model_dir, ids):
    cfg = json.load(open(f"{model_dir}/config.json"))
    w = load_safetensors(f"{model_dir}/model.safetensors")
    eps = cfg.get("rms_norm_eps", 1e-6)
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    qk_norm = cfg["model_type"] == "qwen3"
    T = len(ids)
    pos = torch.arange(T, dtype=torch.float64)
    freqs = torch.outer(pos, rope_inv_freq(cfg, dim))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    h = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = lin(x, p + "self_attn.q_proj").view(T, heads, dim)
        k = lin(x, p + "self_attn.k_proj").view(T, kv_heads, dim)
        v = lin(x, p + "self_attn.v_proj").view(T, kv_heads, dim)
        if qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(dim) + mask
        a = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, heads * dim)
        h = h + lin(a, p + "self_attn.o_proj")
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = lin(x, p + "mlp.gate_proj")
        h = h + lin(torch.nn.functional.silu(gate) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
    h = rms_norm(h, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return (h[-1] @ head.T).tolist()


if __name__ == "__main__":
    print(json.dumps(forward(sys.argv[1], [int(t) for t in sys.argv[2:]])))
