#!/usr/bin/env python3
"""What an `echo` scoring does to the streams in flight: 8 streams decode (400 tokens
each, ignore_eos) on `tessera serve`; 3 s in, one ~2,300-token prompt is scored (echo,
logprobs=1, max_tokens=0, as lm-evaluation-harness asks). Prints one JSON line: the
scoring's latency and the streams' inter-token gaps before it and overlapping it.

    python3 scripts/echo_during_streams.py TESSERA_BIN PORT [serve options...]

Needs httpx (the openai package brings it). Loopback only; the server is started and
stopped here.
"""
import json
import subprocess
import sys
import threading
import time

import httpx

STREAMS = 8


def main():
    binary, port = sys.argv[1], int(sys.argv[2])
    srv = subprocess.Popen([binary, "serve", "--port", str(port)] + sys.argv[3:],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        arrivals = [[] for _ in range(STREAMS)]

        def stream(i):
            body = {"model": model, "prompt": f"Story {i}: once upon a time", "max_tokens": 400,
                    "ignore_eos": True, "temperature": 0, "stream": True}
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        arrivals[i].append(time.perf_counter())

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
        for t in threads:
            t.start()
        time.sleep(3)
        text = "The quick brown fox jumps over the lazy dog. " * 230
        t0 = time.perf_counter()
        r = httpx.post(base + "/v1/completions", timeout=600,
                       json={"model": model, "prompt": text, "echo": True, "logprobs": 1, "max_tokens": 0})
        t1 = time.perf_counter()
        r.raise_for_status()
        scored = len(r.json()["choices"][0]["logprobs"]["tokens"])
        for t in threads:
            t.join()
    finally:
        srv.terminate()
        srv.wait()
    before, during = [], []
    for a in arrivals:
        for x, y in zip(a, a[1:]):
            if x < t1 and y > t0:
                during.append(y - x)
            elif y <= t0:
                before.append(y - x)

    def ms(v, q):
        return round(sorted(v)[min(len(v) - 1, int(q * len(v)))] * 1e3, 1)

    print(json.dumps({"prompt_tokens": scored, "scoring_s": round(t1 - t0, 2),
                      "itl_before_p50_ms": ms(before, 0.5), "itl_before_p99_ms": ms(before, 0.99),
                      "itl_during_p50_ms": ms(during, 0.5), "itl_during_max_ms": ms(during, 1.0),
                      "gaps_during": len(during)}))


if __name__ == "__main__":
    main()
