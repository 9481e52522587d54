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


def ref_rope(x, pos, theta, interleaved):
    """Rotary embedding in float64, written here from its definition."""
    x = x.double()
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)
    ang = pos.double()[:, None] * inv[None, :]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_op_both_conventions(interleaved):
    x = torch.randn(7, 3, 16)
    pos = torch.tensor([0, 1, 2, 5, 9, 100, 4096])
    got = torch.ops.tessera.rope(x, pos, 10000.0, interleaved)
    assert rel(got, ref_rope(x, pos, 10000.0, interleaved)) < 1e-5


def test_softmax_op_on_strided_and_half_inputs():
    x = torch.randn(4, 3, 77)[:, 1:, :]
    assert not x.is_contiguous()
    assert rel(torch.ops.tessera.softmax(x), torch.softmax(x.double(), -1)) < 1e-5
    h = torch.randn(5, 33, dtype=torch.float16)
    assert rel(torch.ops.tessera.softmax(h), torch.softmax(h.double(), -1)) < 1e-5


def test_ops_pass_torch_opcheck():
    """Schema, fake (meta) implementation and dispatch of every op, as torch checks them."""
    cases = [
        (torch.ops.tessera.gemm, (torch.randn(5, 7), torch.randn(7, 3))),
        (torch.ops.tessera.gemm, (torch.randn(5, 7), torch.randn(2, 7, 3))),
        (torch.ops.tessera.attention, (torch.randn(6, 4, 16), torch.randn(6, 2, 16), torch.randn(6, 2, 16), True)),
        (torch.ops.tessera.rms_norm, (torch.randn(3, 40), torch.randn(40), 1e-5)),
        (torch.ops.tessera.swiglu, (torch.randn(5, 20), torch.randn(5, 20))),
        (torch.ops.tessera.softmax, (torch.randn(2, 9),)),
        (torch.ops.tessera.rope, (torch.randn(4, 2, 8), torch.arange(4), 10000.0, False)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_bad_tensors_raise_python_errors():
    with pytest.raises(ValueError):
        torch.ops.tessera.gemm(torch.randn(4, 5), torch.randn(6, 3))
    with pytest.raises(TypeError):
        torch.ops.tessera.softmax(torch.randint(0, 9, (2, 3)))


def test_numpy_and_torch_agree():
    x = np.random.rand(3, 10).astype(np.float32)
    assert np.allclose(tessera.softmax(x), torch.ops.tessera.softmax(torch.from_numpy(x)).numpy(), atol=1e-7)
