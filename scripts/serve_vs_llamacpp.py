#!/usr/bin/env python3
"""Same-run serving comparison: `tessera serve` against llama.cpp's `llama-server`, the
same client (the official `openai` package, streaming), the same prompts, one server
at a time on loopback, alternating per concurrency level so drift hits both.

    python3 scripts/serve_vs_llamacpp.py --llama-server PATH --model MODEL.gguf \
        [--tessera target/release/tessera] [--levels 1,4,16,64] [--rounds 2] \
        [--tessera-args "--int8-acts"] [--out serve_vs_llamacpp]

llama-server is a peer built for measurement (e.g. from the llama.cpp vendored in the
llama-cpp-python source package), never part of this repository; it runs with
--parallel 16 as the issue asks. Every request asks for --max-tokens tokens with
ignore_eos, so both generate the same amount. Reports aggregate output tokens/s, TTFT
p50/p99 and ITL p50/p99 per level (medians over rounds), writes OUT.json and OUT.svg.
"""
import argparse
import asyncio
import json
import platform
import shlex
import socket
import statistics
import subprocess
import time

import httpx
import openai

QUESTIONS = [
    "What is the capital of France?", "Explain why the sky is blue.",
    "Write a short poem about the sea.", "List five animals that live in the forest.",
    "Describe how bread is made, step by step, for a beginner baker who has never baked.",
    "What are the main differences between a river and a lake? " * 3,
    "Tell me a story about a dragon and a knight.", "How do airplanes stay in the air?",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, port):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {shlex.join(cmd)}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server did not start: {shlex.join(cmd)}")


async def one(ac, model, q, max_tokens):
    t0 = time.perf_counter()
    times = []
    stream = await ac.chat.completions.create(
        model=model, messages=[{"role": "user", "content": q}], max_tokens=max_tokens,
        temperature=0, stream=True, extra_body={"ignore_eos": True})
    async for c in stream:
        if c.choices and c.choices[0].delta.content:
            times.append(time.perf_counter())
    if not times:
        raise RuntimeError("a stream produced no text")
    return t0, times


async def load(base, model, concurrency, requests, max_tokens):
    ac = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=2, timeout=600)
    sem = asyncio.Semaphore(concurrency)

    async def bounded(i):
        async with sem:
            return await one(ac, model, QUESTIONS[i % len(QUESTIONS)], max_tokens)

    t0 = time.perf_counter()
    res = await asyncio.gather(*(bounded(i) for i in range(requests)))
    wall = time.perf_counter() - t0
    await ac.close()
    # Output tokens: the usage is not streamed by every server, so count as both
    # generate max_tokens (ignore_eos).
    ttft = sorted(ts[0] - s for s, ts in res)
    itl = sorted(b - a for _, ts in res for a, b in zip(ts, ts[1:]))
    pct = lambda v, p: v[min(len(v) - 1, round((len(v) - 1) * p))] if v else float("nan")
    return {"output_tok_s": requests * max_tokens / wall, "ttft_p50_ms": pct(ttft, 0.5) * 1e3,
            "ttft_p99_ms": pct(ttft, 0.99) * 1e3, "itl_p50_ms": pct(itl, 0.5) * 1e3,
            "itl_p99_ms": pct(itl, 0.99) * 1e3, "wall_s": wall}


def host():
    """CPU model and thread count: the label every figure carries."""
    try:
        model = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.machine()
    flags = open("/proc/cpuinfo").read() if platform.system() == "Linux" else ""
    isa = "AVX-512+VNNI" if "avx512_vnni" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    return f"{model}, {isa}, 2 threads".replace(", ,", ",")


def svg(levels, med, path):
    w, h, m = 560, 360, 60
    ymax = max(med[s][l]["output_tok_s"] for s in med for l in levels) * 1.15
    xs = {l: m + i * (w - 2 * m) / max(1, len(levels) - 1) for i, l in enumerate(levels)}
    y = lambda v: h - m + (v / ymax) * -(h - 2 * m)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">concurrent streams</text>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">output tokens/s</text>',
           f'<text x="{w / 2}" y="25" text-anchor="middle">{host()}: output tokens/s</text>']
    for l in levels:
        out.append(f'<text x="{xs[l]}" y="{h - m + 18}" text-anchor="middle">{l}</text>')
    for k in range(5):
        v = ymax * k / 4
        out.append(f'<text x="{m - 6}" y="{y(v) + 4}" text-anchor="end">{v:.0f}</text>')
    for (name, color), dy in zip((("tessera", "#1f77b4"), ("llama.cpp", "#d62728")), (0, 18)):
        pts = " ".join(f"{xs[l]},{y(med[name][l]['output_tok_s'])}" for l in levels)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{xs[l]}" cy="{y(med[name][l]["output_tok_s"])}" r="3" fill="{color}"/>' for l in levels]
        out.append(f'<text x="{m + 10}" y="{m + dy}" fill="{color}">{name}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tessera", default="target/release/tessera")
    ap.add_argument("--tessera-args", default="")
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="serve_vs_llamacpp")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    runs = {"tessera": {l: [] for l in levels}, "llama.cpp": {l: [] for l in levels}}
    for r in range(a.rounds):
        for name in ("tessera", "llama.cpp"):
            port = free_port()
            if name == "tessera":
                cmd = [a.tessera, "serve", "--model", a.model, "--model-name", "m", "--port", str(port),
                       "--max-seqs", str(max(levels))] + shlex.split(a.tessera_args)
            else:
                cmd = [a.llama_server, "-m", a.model, "--port", str(port), "-t", "2", "--parallel", "16",
                       "-c", str(16 * 2048), "--alias", "m"]
            proc = start(cmd, port)
            try:
                for l in levels:
                    res = asyncio.run(load(f"http://127.0.0.1:{port}", "m", l, max(2 * l, 8), a.max_tokens))
                    runs[name][l].append(res)
                    print(f"round {r + 1} {name:9} c={l:<3} {res['output_tok_s']:7.1f} tok/s  TTFT p50 "
                          f"{res['ttft_p50_ms']:7.1f} ms  ITL p50 {res['itl_p50_ms']:6.1f} p99 {res['itl_p99_ms']:6.1f} ms",
                          flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    med = {n: {l: {k: statistics.median(x[k] for x in runs[n][l]) for k in runs[n][l][0]} for l in levels}
           for n in runs}
    print("\nmedians over rounds; throughput ratio = tessera ÷ llama.cpp, TTFT ratio = tessera ÷ llama.cpp")
    for l in levels:
        t, p = med["tessera"][l], med["llama.cpp"][l]
        print(f"c={l:<3} throughput {t['output_tok_s']:7.1f} vs {p['output_tok_s']:7.1f} "
              f"({t['output_tok_s'] / p['output_tok_s']:.2f}x)  TTFT p50 {t['ttft_p50_ms']:.0f} vs "
              f"{p['ttft_p50_ms']:.0f} ms ({t['ttft_p50_ms'] / p['ttft_p50_ms']:.2f}x)  ITL p50/p99 "
              f"{t['itl_p50_ms']:.1f}/{t['itl_p99_ms']:.1f} vs {p['itl_p50_ms']:.1f}/{p['itl_p99_ms']:.1f} ms")
    json.dump({"levels": levels, "runs": runs, "medians": med, "host": host()},
              open(a.out + ".json", "w"), indent=1)
    svg(levels, med, a.out + ".svg")
    print(f"wrote {a.out}.json and {a.out}.svg")


if __name__ == "__main__":
    main()
