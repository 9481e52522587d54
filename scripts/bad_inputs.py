#!/usr/bin/env python3
"""Tries the `tessera` binary on bad input and prints what happened, as the markdown table
of docs/reliability.md.

    python3 scripts/bad_inputs.py [TESSERA_BIN] > /tmp/table.md

Model-file cases are made from the default model (pulled into the cache first) by
rewriting one metadata entry with a GGUF rewriter of its own (no Tessera code), or by
cutting the file. Each row gives the input, the outcome, the exit status and the line
that says what went wrong (the innermost cause of an error). Every case must end in a
clear error (non-zero status, no panic), except those documented to go on: they must
exit 0 and print a line that names what they did instead. Anything else (a panic, a
signal, a timeout, silence) is marked **FAIL** and the script exits 1.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/tessera"
MODEL = os.path.expanduser("~/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf")
TIMEOUT_S = 300

# GGUF value types: scalar struct formats; 8 is a string, 9 an array.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}


def read_value(buf, at, vtype):
    if vtype in SCALARS:
        fmt = SCALARS[vtype]
        return struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)
    if vtype == 8:
        n = struct.unpack_from("<Q", buf, at)[0]
        return buf[at + 8:at + 8 + n].decode("utf-8"), at + 8 + n
    if vtype == 9:
        etype, n = struct.unpack_from("<IQ", buf, at)
        at += 12
        items = []
        for _ in range(n):
            v, at = read_value(buf, at, etype)
            items.append(v)
        return (etype, items), at
    raise ValueError(f"GGUF value type {vtype}")


def write_value(vtype, v):
    if vtype in SCALARS:
        return struct.pack(SCALARS[vtype], v)
    if vtype == 8:
        b = v.encode("utf-8")
        return struct.pack("<Q", len(b)) + b
    etype, items = v
    return struct.pack("<IQ", etype, len(items)) + b"".join(write_value(etype, x) for x in items)


def parse(buf):
    """(metadata as an ordered list of [key, type, value], tensor-info bytes, data bytes, alignment)."""
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF" and version == 3, "a GGUF v3 file"
    at, meta = 24, []
    for _ in range(n_kv):
        n = struct.unpack_from("<Q", buf, at)[0]
        key = buf[at + 8:at + 8 + n].decode()
        at += 8 + n
        vtype = struct.unpack_from("<I", buf, at)[0]
        value, at = read_value(buf, at + 4, vtype)
        meta.append([key, vtype, value])
    info_start = at
    for _ in range(n_tensors):
        n = struct.unpack_from("<Q", buf, at)[0]
        at += 8 + n
        dims = struct.unpack_from("<I", buf, at)[0]
        at += 4 + 8 * dims + 4 + 8
    align = next((v for k, _, v in meta if k == "general.alignment"), 32)
    data_start = (at + align - 1) // align * align
    return meta, n_tensors, buf[info_start:at], buf[data_start:], align


def build(meta, n_tensors, info, data, align):
    head = struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, len(meta))
    for key, vtype, value in meta:
        k = key.encode()
        head += struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype) + write_value(vtype, value)
    head += info
    head += b"\0" * ((-len(head)) % align)
    return head + data


def mutated(edit):
    """The default model with `edit(meta)` applied to its metadata list."""
    meta, n, info, data, align = parse(MODEL_BYTES)
    edit(meta)
    return build(meta, n, info, data, align)


def entry(meta, key):
    return next(e for e in meta if e[0] == key)


def set_value(key, vtype, value):
    def edit(meta):
        e = entry(meta, key)
        e[1], e[2] = vtype, value
    return edit


def drop(key):
    def edit(meta):
        meta.remove(entry(meta, key))
    return edit


def append(key, item):
    def edit(meta):
        etype, items = entry(meta, key)[2]
        items.append(item)
    return edit


def truncate_array(key, keep):
    def edit(meta):
        e = entry(meta, key)
        etype, items = e[2]
        e[2] = (etype, items[:keep])
    return edit


def run(args, env=None, stdin=None):
    full_env = dict(os.environ, RUST_BACKTRACE="0", **(env or {}))
    try:
        p = subprocess.run([BIN] + args, capture_output=True, text=True, env=full_env,
                           timeout=TIMEOUT_S, stdin=stdin)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {TIMEOUT_S} s"
    return p.returncode, p.stderr + p.stdout


def said(text, status, needle=None):
    """The line that says what happened: the one holding `needle`, else an error's
    innermost cause (anyhow prints the chain under "Caused by:"), else the first line."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    if needle:
        hit = [l for l in lines if needle in l]
        if hit:
            return hit[0]
    if "Caused by:" in lines:
        causes = lines[lines.index("Caused by:") + 1:]
        causes = [c for c in causes if not c.startswith("Stack backtrace")]
        if causes:
            return causes[-1].split(": ", 1)[-1] if causes[-1][:1].isdigit() else causes[-1]
    for l in lines:
        if l.startswith("Error:") or l.startswith("error:"):
            return l
    return lines[0] if lines else f"(no output, status {status})"


def verdict(status, text, goes_on):
    """'error', 'goes on' (documented), or **FAIL**."""
    if status is None or status < 0 or "panicked" in text:
        return "**FAIL**"
    if goes_on is None:
        return "error" if status != 0 else "**FAIL** (exit 0)"
    if status != 0:
        return "**FAIL** (should go on)"
    return "goes on, says so" if goes_on in text else "**FAIL** (silent)"


def main():
    global MODEL_BYTES
    subprocess.run([BIN, "pull"], check=True, capture_output=True)
    MODEL_BYTES = open(MODEL, "rb").read()
    tmp = tempfile.mkdtemp(prefix="tessera-bad-")
    gen = ["-n", "4"]
    model_cases = [
        ("`rope.freq_base` is a string", set_value("llama.rope.freq_base", 8, "100000")),
        ("norm epsilon is a string",
         set_value("llama.attention.layer_norm_rms_epsilon", 8, "1e-5")),
        ("`block_count` 1 (file has 30 layers)", set_value("llama.block_count", 4, 1)),
        ("`block_count` 31 (file has 30 layers)", set_value("llama.block_count", 4, 31)),
        ("vocabulary one token longer than the embedding",
         lambda m: [append(k, v)(m) for k, v in
                    (("tokenizer.ggml.tokens", "<extra>"), ("tokenizer.ggml.token_type", 1))]),
        ("`token_type` missing", drop("tokenizer.ggml.token_type")),
        ("`token_type` of the wrong length", truncate_array("tokenizer.ggml.token_type", 100)),
        ("BOS id 10⁹", set_value("tokenizer.ggml.bos_token_id", 4, 10**9)),
        ("EOS id 10⁹", set_value("tokenizer.ggml.eos_token_id", 4, 10**9)),
        ("`head_count` 7 (does not divide the width)", set_value("llama.attention.head_count", 4, 7)),
        ("chat template with a syntax error",
         set_value("tokenizer.chat_template", 8, "{% for m in messages %}{{ m.content }")),
        ("chat template that loops 10¹⁰ times",
         set_value("tokenizer.chat_template", 8,
                   "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}")),
    ]
    rows = []
    for i, (name, edit) in enumerate(model_cases):
        path = os.path.join(tmp, f"bad{i}.gguf")
        with open(path, "wb") as f:
            f.write(mutated(edit))
        rows.append((f"GGUF: {name}", ["run", "--model", path] + gen, None, None, None))
    for frac in (0.5, 0.001):
        path = os.path.join(tmp, f"cut{frac}.gguf")
        with open(path, "wb") as f:
            f.write(MODEL_BYTES[:int(len(MODEL_BYTES) * frac)])
        rows.append((f"GGUF cut to {frac:g} of its length", ["run", "--model", path] + gen, None, None, None))
    path = os.path.join(tmp, "magic.gguf")
    with open(path, "wb") as f:
        f.write(b"XGUF" + MODEL_BYTES[4:4096])
    rows.append(("GGUF with a wrong magic", ["run", "--model", path] + gen, None, None, None))
    empty = os.path.join(tmp, "empty-dir")
    os.makedirs(empty, exist_ok=True)
    rows += [
        ("a directory without `config.json`", ["run", "--model", empty] + gen, None, None, None),
        ("`--model /dev/stdin`", ["run", "--model", "/dev/stdin"] + gen, None, subprocess.DEVNULL, None),
        ("`--model` a missing file", ["run", "--model", os.path.join(tmp, "nope.gguf")] + gen, None, None, None),
        ("`run -n 0`", ["run", "-n", "0"], None, None, None),
        ("`run -n 18446744073709551615`", ["run", "-n", "18446744073709551615"], None, None,
         "(context)"),
        ("`run --temperature=-1`", ["run", "--temperature=-1"] + gen, None, None, None),
        ("`run --top-p 2`", ["run", "--top-p", "2"] + gen, None, None, None),
        ("`quant-error --shape 99999x99999`", ["quant-error", "--shape", "99999x99999"], None, None, None),
        ("`quant-error --shape 4294967296x4294967297`",
         ["quant-error", "--shape", "4294967296x4294967297"], None, None, None),
        ("`quant-error --batch 100000000000`", ["quant-error", "--batch", "100000000000"], None, None, None),
        ("`bench gemm --shape 0x0x0`", ["bench", "gemm", "--shape", "0x0x0"], None, None, None),
        ("`bench --profile` into a missing directory",
         ["bench", "rms_norm", "--profile", "/nonexistent-dir/t.json"], None, None, None),
        ("`TESSERA_THREADS=100000`", ["calibrate", "--threads", "1"], {"TESSERA_THREADS": "100000"}, None,
         "TESSERA_THREADS='100000'"),
        ("`TESSERA_THREADS=0`", ["calibrate", "--threads", "1"], {"TESSERA_THREADS": "0"}, None,
         "TESSERA_THREADS='0'"),
        ("`TESSERA_THREADS=abc`", ["calibrate", "--threads", "1"], {"TESSERA_THREADS": "abc"}, None,
         "TESSERA_THREADS='abc'"),
        ("`TESSERA_ISA=bogus`", ["calibrate", "--threads", "1"], {"TESSERA_ISA": "bogus"}, None,
         "TESSERA_ISA='bogus'"),
    ]
    print("| input | outcome | status | what it said |")
    print("|---|---|---|---|")
    failed = 0
    for name, args, env, stdin, goes_on in rows:
        status, text = run(args, env, stdin)
        v = verdict(status, text, goes_on)
        failed += v.startswith("**FAIL")
        line = said(text, status, goes_on).replace("|", "\\|")
        if len(line) > 160:
            line = line[:157] + "…"
        print(f"| {name} | {v} | {status} | {line} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
