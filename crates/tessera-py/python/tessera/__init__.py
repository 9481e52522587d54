"""Tessera: verified CPU kernels for LLM inference, and an inference engine.

Kernels take numpy arrays, PyTorch CPU tensors (DLPack) or any buffer, without copying
them, and write float32 results into ``out=`` when given (else a new numpy array)::

    import numpy as np, tessera
    x = np.random.rand(4, 576).astype(np.float32)
    y = tessera.rms_norm(x, np.ones(576, np.float32), eps=1e-5)

The engine::

    eng = tessera.Engine()               # the default model, downloaded on first use
    print(eng.generate("What is 2+2?", chat=True, max_tokens=32)["text"])
    for piece in eng.stream("Once upon a time", max_tokens=32):
        print(piece, end="", flush=True)

``tessera.torch_ops.register()`` registers the main kernels as ``torch.ops.tessera.*``.
"""

from ._tessera import (  # noqa: F401
    FORMATS,
    Engine,
    QuantizedMatrix,
    TextIter,
    attention,
    dequantize,
    gemm,
    isa,
    layer_norm,
    paged_attention,
    qmatmul,
    quantize,
    rms_norm,
    rope,
    softmax,
    swiglu,
    threads,
)

__all__ = [
    "FORMATS",
    "Engine",
    "QuantizedMatrix",
    "TextIter",
    "attention",
    "dequantize",
    "gemm",
    "isa",
    "layer_norm",
    "paged_attention",
    "qmatmul",
    "quantize",
    "rms_norm",
    "rope",
    "softmax",
    "swiglu",
    "threads",
]
