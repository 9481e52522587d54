#!/usr/bin/env python3
"""FP8 reference data from ml_dtypes (the FP8 types JAX and TensorFlow use), which
shares no code with Tessera: every code's value for E4M3 (OCP "FN") and E5M2, and the
code ml_dtypes rounds each of a set of f32 values to (random values across the range,
exact ties, subnormals, the largest finite values). Values beyond the largest finite
one are left out: ml_dtypes overflows them to NaN/∞ where Tessera saturates by design.

    pip install ml_dtypes numpy
    python3 scripts/reference_fp8.py > crates/tessera-kernels/tests/data/fp8_reference.json
"""
import json

import ml_dtypes
import numpy as np

out = {}
rng = np.random.default_rng(8)
for name, t in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(t).astype(np.float32)
    finite = values[np.isfinite(values)]
    top = float(np.max(finite))
    # Random magnitudes over the whole exponent range, both signs, plus every midpoint
    # between neighbouring codes (ties, which round to even) and points just off them.
    xs = list(np.float32(2.0) ** rng.uniform(-22, np.log2(top), 2000) * rng.choice([-1, 1], 2000))
    pos = np.sort(np.unique(finite[finite >= 0]))
    mids = (pos[:-1].astype(np.float64) + pos[1:]) / 2
    xs += list(mids) + list(-mids) + list(np.nextafter(mids.astype(np.float32), np.float32(np.inf)))
    xs += list(pos) + [0.0, -0.0, top, -top]
    xs = np.array([x for x in xs if abs(x) <= top], dtype=np.float32)
    enc = xs.astype(t).view(np.uint8)
    out[name] = {
        "decode_bits": [int(b) for b in values.view(np.uint32)],
        "decode_nan": [bool(v) for v in np.isnan(values)],
        "encode": [[int(x), int(c)] for x, c in zip(xs.view(np.uint32), enc)],
    }
print(json.dumps(out))
