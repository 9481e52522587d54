"""torch.library registration and DLPack zero-copy on CPU tensors; skipped, saying why,
where torch is not installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI installs the CPU wheel when its index is reachable)")

import tessera  # noqa: E402
from tessera import torch_ops  # noqa: E402

torch_ops.register()


def rel(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def test_dlpack_zero_copy_out():
    x = torch.randn(4, 64)
    out = torch.empty(4, 64)
    tessera.softmax(x, out)
    assert rel(out, torch.softmax(x.double(), -1)) < 1e-5


def test_registered_ops_match_torch():
    a, b = torch.randn(17, 33), torch.randn(33, 9)
    assert rel(torch.ops.tessera.gemm(a, b), a.double() @ b.double()) < 1e-5
    x, w = torch.randn(3, 40), torch.randn(40)
    ref = x.double() / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert rel(torch.ops.tessera.rms_norm(x, w, 1e-5), ref) < 1e-5
    g, u = torch.randn(5, 20), torch.randn(5, 20)
    assert rel(torch.ops.tessera.swiglu(g, u), torch.nn.functional.silu(g.double()) * u.double()) < 1e-5
    q, k, v = torch.randn(6, 4, 16), torch.randn(6, 2, 16), torch.randn(6, 2, 16)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(0, 1), k.double().repeat_interleave(2, 1).transpose(0, 1),
        v.double().repeat_interleave(2, 1).transpose(0, 1), is_causal=True,
    ).transpose(0, 1)
    assert rel(torch.ops.tessera.attention(q, k, v, True), ref) < 1e-4


def test_bf16_and_grad_tensors():
    a = torch.randn(8, 16, dtype=torch.bfloat16)
    b = torch.randn(16, 4, dtype=torch.bfloat16)
    assert rel(torch.ops.tessera.gemm(a, b), a.double() @ b.double()) < 1e-3
    x = torch.randn(2, 8, requires_grad=True)
    out = torch.ops.tessera.softmax(x)
    assert out.shape == (2, 8)


def test_numpy_and_torch_agree():
    x = np.random.rand(3, 10).astype(np.float32)
    assert np.allclose(tessera.softmax(x), torch.ops.tessera.softmax(torch.from_numpy(x)).numpy(), atol=1e-7)
