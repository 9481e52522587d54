"""Tessera's kernels as PyTorch custom ops (``torch.library``), callable in eager mode.

``register()`` defines ``torch.ops.tessera.{gemm, attention, rms_norm, swiglu, softmax,
rope}``. Inputs are CPU tensors (float32, float16 or bfloat16); results are new float32
tensors, written by the kernels in place through DLPack (no copy). Each op has a fake
(meta) implementation, so shapes propagate under ``torch.compile`` tracing too.

The ops' annotations name ``torch.Tensor`` and are evaluated when ``register()`` defines
them (no ``from __future__ import annotations``): ``custom_op`` infers each schema from
the annotations, and a string annotation would name a ``torch`` that is only local here.
"""

import math

from . import _tessera

_registered = False


def register() -> None:
    """Defines the ``torch.ops.tessera`` ops (once per process). Needs torch ≥ 2.4."""
    global _registered
    if _registered:
        return
    import torch
    from torch.library import custom_op

    def _out(shape):
        return torch.empty(shape, dtype=torch.float32)

    def _gemm_shape(a, b):
        if a.dim() == 2 and b.dim() == 3:
            return [b.shape[0], a.shape[0], b.shape[-1]]
        return list(a.shape[:-1]) + [b.shape[-1]]

    @custom_op("tessera::gemm", mutates_args=())
    def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = _out(_gemm_shape(a, b))
        _tessera.gemm(a.detach(), b.detach(), out)
        return out

    @gemm.register_fake
    def _(a, b):
        return a.new_empty(_gemm_shape(a, b), dtype=torch.float32)

    @custom_op("tessera::attention", mutates_args=())
    def attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float = 0.0
    ) -> torch.Tensor:
        out = _out(q.shape)
        s = scale if scale > 0 else 1.0 / math.sqrt(q.shape[-1])
        _tessera.attention(q.detach(), k.detach(), v.detach(), out, causal=causal, scale=s)
        return out

    @attention.register_fake
    def _(q, k, v, causal=False, scale=0.0):
        return q.new_empty(q.shape, dtype=torch.float32)

    @custom_op("tessera::rms_norm", mutates_args=())
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = _out(x.shape)
        _tessera.rms_norm(x.detach(), weight.detach().float(), eps, out)
        return out

    @rms_norm.register_fake
    def _(x, weight, eps):
        return x.new_empty(x.shape, dtype=torch.float32)

    @custom_op("tessera::swiglu", mutates_args=())
    def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        out = _out(gate.shape)
        _tessera.swiglu(gate.detach(), up.detach(), out)
        return out

    @swiglu.register_fake
    def _(gate, up):
        return gate.new_empty(gate.shape, dtype=torch.float32)

    @custom_op("tessera::softmax", mutates_args=())
    def softmax(x: torch.Tensor) -> torch.Tensor:
        out = _out(x.shape)
        _tessera.softmax(x.detach(), out)
        return out

    @softmax.register_fake
    def _(x):
        return x.new_empty(x.shape, dtype=torch.float32)

    @custom_op("tessera::rope", mutates_args=())
    def rope(x: torch.Tensor, positions: torch.Tensor, theta: float, interleaved: bool) -> torch.Tensor:
        out = _out(x.shape)
        style = "interleaved" if interleaved else "half_split"
        _tessera.rope(x.detach(), positions.detach(), theta=theta, style=style, out=out)
        return out

    @rope.register_fake
    def _(x, positions, theta, interleaved):
        return x.new_empty(x.shape, dtype=torch.float32)

    _registered = True
