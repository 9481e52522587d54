#!/usr/bin/env python3
"""Independent float64 reference for a Llama-family GGUF model (numpy only).

Written separately from the Rust engine (its own GGUF parser, its own dequantizers, its
own forward pass) so that the engine's tests compare against something that shares no
code with it. It writes the test data in crates/tessera-engine/tests/data/:

    python3 scripts/reference_model.py MODEL.gguf CASES.json OUT.json

CASES.json: {"cases": [{"name": ..., "text": ..., "tokens": [ids...], "greedy": N}, ...]};
the committed one, crates/tessera-engine/tests/data/smollm2_cases.json, has its ids from
llama.cpp's llama-tokenize (scripts/reference_tokens.py --cases). For each
case the output holds the last position's logits in float64 (a strided sample, the top
entries and the norm of the whole vector, to keep the file small) and N greedy tokens
with each step's top-1 margin (logit gap to the runner-up), so a test can insist on
identical tokens only where the reference's choice is clear.
"""

import hashlib
import json
import struct
import sys

import numpy as np

SAMPLE_STRIDE = 97
TOP = 20

# GGUF metadata value types -> struct formats (8: string, 9: array handled apart).
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.at)[0]
        self.at += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.buf[self.at:self.at + n].decode("utf-8")
        self.at += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        return self.take(SCALARS[t])


def parse_gguf(buf):
    r = Reader(buf)
    assert buf[:4] == b"GGUF", "not a GGUF file"
    r.at = 4
    version = r.take("<I")
    assert version in (2, 3), version
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = r.string()
        meta[k] = r.value(r.take("<I"))
    tensors = {}
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        ttype, off = r.take("<I"), r.take("<Q")
        tensors[name] = (dims, ttype, off)
    align = meta.get("general.alignment", 32)
    base = (r.at + align - 1) // align * align
    return meta, tensors, base


def dequant(buf, base, dims, ttype, off):
    """The tensor as float64, shape [rows, cols] (ggml lists the fastest dim first)."""
    count = int(np.prod(dims))
    start = base + off
    if ttype == 0:  # F32
        x = np.frombuffer(buf, np.float32, count, start).astype(np.float64)
    elif ttype == 1:  # F16
        x = np.frombuffer(buf, np.float16, count, start).astype(np.float64)
    elif ttype in (2, 3, 8):  # Q4_0, Q4_1, Q8_0: blocks of 32 values
        nb = count // 32
        size = {2: 18, 3: 20, 8: 34}[ttype]
        raw = np.frombuffer(buf, np.uint8, nb * size, start).reshape(nb, size)
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float64)
        if ttype == 8:
            q = raw[:, 2:].copy().view(np.int8).astype(np.float64)
            x = d * q
        else:
            qs = raw[:, size - 16:]
            # Element j < 16 is the low nibble of byte j, element j + 16 its high nibble.
            q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
            if ttype == 2:
                x = d * (q - 8.0)
            else:
                m = raw[:, 2:4].copy().view(np.float16).astype(np.float64)
                x = d * q + m
        x = x.reshape(-1)
    else:
        raise SystemExit(f"tensor type {ttype} not handled by this reference")
    return x.reshape(list(reversed(dims)))


class Model:
    def __init__(self, path):
        buf = open(path, "rb").read()
        self.sha256 = hashlib.sha256(buf).hexdigest()
        meta, tensors, base = parse_gguf(buf)
        arch = meta["general.architecture"]
        self.layers = meta[f"{arch}.block_count"]
        self.heads = meta[f"{arch}.attention.head_count"]
        self.kv_heads = meta.get(f"{arch}.attention.head_count_kv", self.heads)
        self.eps = meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
        # The engine computes in f32 with an f32 epsilon; use that same number.
        self.eps = float(np.float32(self.eps))
        self.theta = meta.get(f"{arch}.rope.freq_base", 10000.0)
        self.w = {n: dequant(buf, base, *t) for n, t in tensors.items()}
        self.dim = self.w["token_embd.weight"].shape[1]
        self.hd = self.dim // self.heads

    def norm(self, x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * g

    def rope(self, x, n_heads):
        """Interleaved pairs (x[2i], x[2i+1]) rotated by pos·theta^(-2i/d)."""
        n = x.shape[0]
        x = x.reshape(n, n_heads, self.hd // 2, 2)
        inv = self.theta ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0], x[..., 1]
        return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(n, -1)

    def logits(self, tokens):
        """All positions' logits for a sequence starting at position 0."""
        w, n = self.w, len(tokens)
        x = w["token_embd.weight"][tokens]
        mask = np.triu(np.full((n, n), -np.inf), 1)
        group = self.heads // self.kv_heads
        for l in range(self.layers):
            p = lambda s: w[f"blk.{l}.{s}.weight"]
            h = self.norm(x, p("attn_norm"))
            q = self.rope(h @ p("attn_q").T, self.heads).reshape(n, self.heads, self.hd)
            k = self.rope(h @ p("attn_k").T, self.kv_heads).reshape(n, self.kv_heads, self.hd)
            v = (h @ p("attn_v").T).reshape(n, self.kv_heads, self.hd)
            out = np.empty((n, self.heads, self.hd))
            for hq in range(self.heads):
                kh = hq // group
                s = q[:, hq] @ k[:, kh].T / np.sqrt(self.hd) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, hq] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kh]
            x = x + out.reshape(n, -1) @ p("attn_output").T
            h = self.norm(x, p("ffn_norm"))
            g, u = h @ p("ffn_gate").T, h @ p("ffn_up").T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ p("ffn_down").T
        head = w.get("output.weight", w["token_embd.weight"])
        return self.norm(x, w["output_norm.weight"]) @ head.T


def case_output(model, case):
    tokens = list(case["tokens"])
    last = model.logits(tokens)[-1]
    order = np.argsort(-last)
    out = {
        "name": case["name"],
        "text": case.get("text"),
        "tokens": tokens,
        "logits_l2": float(np.linalg.norm(last)),
        "sample_stride": SAMPLE_STRIDE,
        "logits_sampled": [float(v) for v in last[::SAMPLE_STRIDE]],
        "top": [[int(i), float(last[i])] for i in order[:TOP]],
        "greedy": [],
        "greedy_margins": [],
    }
    seq = tokens
    for step in range(case.get("greedy", 0)):
        lg = last if step == 0 else model.logits(seq)[-1]
        o = np.argsort(-lg)[:2]
        out["greedy"].append(int(o[0]))
        out["greedy_margins"].append(float(lg[o[0]] - lg[o[1]]))
        seq = seq + [int(o[0])]
    return out


def main():
    model_path, cases_path, out_path = sys.argv[1:4]
    model = Model(model_path)
    cases = json.load(open(cases_path))["cases"]
    result = {
        "generator": "scripts/reference_model.py (numpy float64)",
        "model_sha256": model.sha256,
        "cases": [case_output(model, c) for c in cases],
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
