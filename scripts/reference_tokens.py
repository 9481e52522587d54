#!/usr/bin/env python3
"""Reference token ids from llama.cpp's own tokenizer, for the tokenizer test and for the
inputs of the float64 model reference.

    python3 scripts/reference_tokens.py LLAMA_TOKENIZE MODEL.gguf OUT.json
    python3 scripts/reference_tokens.py LLAMA_TOKENIZE MODEL.gguf OUT.json --cases CASES.json

The first form tokenizes the corpus below (tests/data/tokenizer_reference.json). The
second fills in "tokens" for each {"name", "text", "greedy"} case of CASES.json and
writes the result, the input scripts/reference_model.py takes
(tests/data/smollm2_cases.json).

LLAMA_TOKENIZE is the `llama-tokenize` binary of a llama.cpp build (a peer built for
measurement, never part of this repository). Each text is passed verbatim through a file
(no escape processing; special tokens such as <|im_start|> are parsed, as tessera does).
"""

import json
import os
import subprocess
import sys
import tempfile

CORPUS = [
    "Hello, world!",
    "The capital of France is Paris.",
    "  leading spaces, trailing spaces   ",
    "multiple\n\nnewlines\n\n\nand\ttabs\t\there",
    "Numbers: 0 7 42 1234567 3.14159 -273.15 1e-9 2026-11-22",
    "Ünïcödé: naïve café résumé Straße Ελληνικά русский язык",
    "中文测试：你好，世界！日本語のテキスト。한국어 문장.",
    "Emoji 🚀🔥👍🏽 and symbols ∑∫√∞ ≠ ≤ ≥ → ← ©®™",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!("{v:?}"); }',
    '<html><body><p class="x">Tags &amp; entities</p></body></html>',
    "I'm, you're, they've, we'll, she'd, it's — contractions' edge-cases.",
    "URL: https://example.com/path?q=1&r=two#frag and e-mail: a.b@c.org",
    "                                    (a run of spaces)",
    "x" * 64,
    "Mixed CASE words ALLCAPS camelCase snake_case kebab-case PascalCase",
    "The year 1999 had 365 days; 2000 had 366.\r\nWindows line endings too.",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


def ids(binary, model, text):
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(text.encode("utf-8"))
    try:
        out = subprocess.run(
            [binary, "-m", model, "-f", f.name, "--ids", "--log-disable", "--no-escape"],
            capture_output=True, text=True, check=True,
        ).stdout
    finally:
        os.unlink(f.name)
    return json.loads([l for l in out.splitlines() if l.startswith("[")][-1])


def main():
    binary, model, out_path = sys.argv[1:4]
    if sys.argv[4:5] == ["--cases"]:
        cases = json.load(open(sys.argv[5], encoding="utf-8"))["cases"]
        for case in cases:
            case["tokens"] = ids(binary, model, case["text"])
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump({"generator": "llama.cpp llama-tokenize via scripts/reference_tokens.py --cases",
                       "cases": cases}, f, indent=1, ensure_ascii=False)
            f.write("\n")
        return
    cases = [{"text": t, "ids": ids(binary, model, t)} for t in CORPUS]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"generator": "llama.cpp llama-tokenize via scripts/reference_tokens.py",
                   "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
