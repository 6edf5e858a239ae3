#!/usr/bin/env python3
"""Writes a Llama-architecture Hugging Face checkpoint (config.json + model.safetensors, float32
or bfloat16, as `colocated-rl make-model` writes them) as a GGUF file that llama.cpp loads, so
that llama.cpp can be timed on the very model the engine runs (bench/llamacpp/compare.sh).

Standard library only. The comparison feeds token ids, so the vocabulary is a placeholder of the
model's size (SentencePiece-style: <unk>, <s>, </s>, the 256 byte tokens, then `t<id>` pieces);
node-llama-cpp needs a tokenizer to load a model, and the model's own is never used. q_proj/k_proj rows are permuted per head
from Hugging Face's rotate-half rotary layout to llama.cpp's interleaved one (what llama.cpp's own
converter does), so the GGUF computes the same function, not only the same shapes.

usage: to_gguf.py MODEL_DIR OUT.gguf
"""
import json
import os
import struct
import sys

ALIGN = 32
GGUF_I32, GGUF_U32, GGUF_F32, GGUF_STRING, GGUF_ARRAY = 5, 4, 6, 8, 9
GGML_TYPES = {"F32": (0, 4), "BF16": (30, 2), "F16": (1, 2)}


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gguf_string(key) + struct.pack("<I", vtype)
    if vtype == GGUF_U32:
        return out + struct.pack("<I", value)
    if vtype == GGUF_F32:
        return out + struct.pack("<f", value)
    if vtype == GGUF_STRING:
        return out + gguf_string(value)
    elem, items = value  # an array
    out += struct.pack("<IQ", elem, len(items))
    if elem == GGUF_STRING:
        return out + b"".join(gguf_string(v) for v in items)
    return out + struct.pack("<%d%s" % (len(items), "f" if elem == GGUF_F32 else "i"), *items)


def placeholder_vocab(n):
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, byte
    tokens += ["t%d" % i for i in range(len(tokens), n)]
    types += [1] * (n - len(types))  # normal
    scores = [0.0] * 259 + [-float(i) for i in range(n - 259)]
    return [kv("tokenizer.ggml.model", GGUF_STRING, "llama"),
            kv("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
            kv("tokenizer.ggml.scores", GGUF_ARRAY, (GGUF_F32, scores)),
            kv("tokenizer.ggml.token_type", GGUF_ARRAY, (GGUF_I32, types)),
            kv("tokenizer.ggml.bos_token_id", GGUF_U32, 1),
            kv("tokenizer.ggml.eos_token_id", GGUF_U32, 2),
            kv("tokenizer.ggml.unknown_token_id", GGUF_U32, 0)]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def permute_rotary_rows(raw, n_heads, head_dim, row_bytes):
    # Per head, rows [0..d/2) hold the rotation's first halves and [d/2..d) the second ones;
    # llama.cpp's layout interleaves them: row 2i is the i-th first half, row 2i+1 its partner.
    half = head_dim // 2
    out = bytearray()
    for h in range(n_heads):
        base = h * head_dim
        for i in range(half):
            for r in (base + i, base + half + i):
                out += raw[r * row_bytes:(r + 1) * row_bytes]
    return bytes(out)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model_dir, out_path = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    if cfg.get("model_type") not in ("llama",) or cfg.get("attention_bias"):
        sys.exit(f"to_gguf.py: only bias-free Llama checkpoints are converted, not {cfg.get('model_type')}")
    st_path = os.path.join(model_dir, "model.safetensors")
    header, data_start = read_safetensors(st_path)
    n_layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim", hidden // n_heads)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for i in range(n_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    unknown = sorted(set(header) - set(names))
    if unknown:
        sys.exit(f"to_gguf.py: tensors with no GGUF name: {unknown[:5]}")

    tensors = []  # (gguf name, ggml type, dims innermost first, hf name, permute heads or 0)
    for hf, info in header.items():
        if info["dtype"] not in GGML_TYPES:
            sys.exit(f"to_gguf.py: {hf} has dtype {info['dtype']}; F32, BF16 and F16 are converted")
        heads = n_heads if hf.endswith("q_proj.weight") else n_kv if hf.endswith("k_proj.weight") else 0
        tensors.append((names[hf], info["dtype"], list(reversed(info["shape"])), hf, heads))
    tensors.sort(key=lambda t: t[0])

    meta = [kv("general.architecture", GGUF_STRING, "llama"),
            kv("general.name", GGUF_STRING, os.path.basename(os.path.normpath(model_dir))),
            kv("general.alignment", GGUF_U32, ALIGN),
            kv("llama.context_length", GGUF_U32, cfg["max_position_embeddings"]),
            kv("llama.embedding_length", GGUF_U32, hidden),
            kv("llama.block_count", GGUF_U32, n_layers),
            kv("llama.feed_forward_length", GGUF_U32, cfg["intermediate_size"]),
            kv("llama.attention.head_count", GGUF_U32, n_heads),
            kv("llama.attention.head_count_kv", GGUF_U32, n_kv),
            kv("llama.attention.key_length", GGUF_U32, head_dim),
            kv("llama.attention.value_length", GGUF_U32, head_dim),
            kv("llama.rope.dimension_count", GGUF_U32, head_dim),
            kv("llama.rope.freq_base", GGUF_F32, float(cfg.get("rope_theta", 10000.0))),
            kv("llama.attention.layer_norm_rms_epsilon", GGUF_F32, float(cfg["rms_norm_eps"])),
            kv("llama.vocab_size", GGUF_U32, cfg["vocab_size"])] + placeholder_vocab(cfg["vocab_size"])

    infos, offset = [], 0
    for name, dtype, dims, hf, _ in tensors:
        size = header[hf]["data_offsets"][1] - header[hf]["data_offsets"][0]
        infos.append(gguf_string(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) +
                     struct.pack("<IQ", GGML_TYPES[dtype][0], offset))
        offset += (size + ALIGN - 1) // ALIGN * ALIGN

    with open(st_path, "rb") as src, open(out_path, "wb") as out:
        out.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
        for m in meta + infos:
            out.write(m)
        out.write(b"\0" * (-out.tell() % ALIGN))
        for name, dtype, dims, hf, heads in tensors:
            begin, end = header[hf]["data_offsets"]
            src.seek(data_start + begin)
            raw = src.read(end - begin)
            if heads:
                raw = permute_rotary_rows(raw, heads, head_dim, dims[0] * GGML_TYPES[dtype][1])
            out.write(raw)
            out.write(b"\0" * (-len(raw) % ALIGN))
    print(f"wrote {out_path}: {len(tensors)} tensors, {n_layers} layers, hidden {hidden}")


if __name__ == "__main__":
    main()
