"""Type stubs for tessera (the functions live in the tessera._tessera extension)."""

from os import PathLike
from typing import Any, Iterator, Literal, Optional, Sequence, Union, overload

ArrayLike = Any  # a numpy array, a CPU tensor with __dlpack__, or a buffer

FORMATS: list[str]

def isa() -> str:
    """The instruction set the kernels run on this CPU (avx512, avx2, neon, scalar)."""

def threads() -> int:
    """Threads the kernels use (TESSERA_THREADS; default: the CPUs available)."""

def gemm(
    a: ArrayLike, b: ArrayLike, out: Optional[ArrayLike] = None, *, alpha: float = 1.0, beta: float = 0.0
) -> ArrayLike:
    """out = alpha·a·b + beta·out; a [M, K] or [batch, M, K], b [K, N] or [batch, K, N];
    float32/float16/bfloat16 inputs of one type, float32 out."""

def attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    out: Optional[ArrayLike] = None,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    window: Optional[int] = None,
) -> ArrayLike:
    """softmax(scale·q·kᵀ)·v per head: q [q_len, heads, d], k/v [kv_len, kv_heads, d]."""

def paged_attention(
    q: ArrayLike,
    k_cache: ArrayLike,
    v_cache: ArrayLike,
    block_tables: ArrayLike,
    context_lens: ArrayLike,
    out: Optional[ArrayLike] = None,
    *,
    scale: Optional[float] = None,
) -> ArrayLike:
    """Decode attention over a paged cache [num_blocks, block_size, kv_heads, d]."""

def rms_norm(
    x: ArrayLike,
    weight: ArrayLike,
    eps: float = 1e-6,
    out: Optional[ArrayLike] = None,
    *,
    residual: Optional[ArrayLike] = None,
) -> ArrayLike:
    """RMSNorm over the last dim; with residual: residual += x, then normalise residual."""

def layer_norm(
    x: ArrayLike, weight: ArrayLike, bias: ArrayLike, eps: float = 1e-5, out: Optional[ArrayLike] = None
) -> ArrayLike:
    """LayerNorm over the last dim."""

def rope(
    x: ArrayLike,
    positions: ArrayLike,
    *,
    theta: float = 10000.0,
    style: str = "half_split",
    out: Optional[ArrayLike] = None,
) -> ArrayLike:
    """Rotary embedding of x [tokens, heads, d]; style "half_split" or "interleaved"."""

def swiglu(gate: ArrayLike, up: ArrayLike, out: Optional[ArrayLike] = None) -> ArrayLike:
    """silu(gate)·up elementwise."""

def softmax(x: ArrayLike, out: Optional[ArrayLike] = None) -> ArrayLike:
    """Softmax over the last dim (2-D or 3-D)."""

class QuantizedMatrix:
    """A weight matrix W [rows, cols] in a quantized format."""

    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, int]: ...
    @property
    def nbytes(self) -> int: ...
    @staticmethod
    def from_bytes(dtype: str, rows: int, cols: int, data: bytes) -> "QuantizedMatrix":
        """A block-format matrix from its raw ggml blocks."""

def quantize(
    w: ArrayLike, dtype: str, *, int8_acts: bool = False, acts: Optional[str] = None
) -> QuantizedMatrix:
    """w float32 [rows, cols] quantized to one of FORMATS; acts ("f32" here by default,
    "a16" or "int8") is how qmatmul of up to 64 rows takes its activations."""

def dequantize(q: QuantizedMatrix, out: Optional[ArrayLike] = None) -> ArrayLike:
    """The matrix's values as float32 [rows, cols]."""

def qmatmul(x: ArrayLike, q: QuantizedMatrix, out: Optional[ArrayLike] = None) -> ArrayLike:
    """out = x·Wᵀ for x float32 [M, cols]."""

class TextIter(Iterator[str]):
    """Text pieces of a generation in progress."""

    def __next__(self) -> str: ...
    def close(self) -> None: ...
    @property
    def result(self) -> Optional[dict[str, Any]]: ...

class Engine:
    """A model loaded for generation and scoring."""

    def __init__(
        self,
        model: Union[str, PathLike[str], None] = None,
        *,
        quantize: Optional[str] = None,
        int8_acts: bool = False,
        kv_cache: str = "f16",
        acts: Optional[str] = None,
        large_pages: bool = False,
    ) -> None: ...
    @property
    def path(self) -> str: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    @overload
    def generate(
        self, prompt: Union[str, Sequence[int]], *, chat: bool = False, stream: Literal[False] = False, **kwargs: Any
    ) -> dict[str, Any]:
        """Generates; returns text, ids, prompt_ids, finish, prefill_tok_s, decode_tok_s."""
    @overload
    def generate(
        self, prompt: Union[str, Sequence[int]], *, chat: bool = False, stream: Literal[True], **kwargs: Any
    ) -> TextIter:
        """With stream=True: the text pieces as they come (as `stream`)."""
    def stream(self, prompt: Union[str, Sequence[int]], *, chat: bool = False, **kwargs: Any) -> TextIter:
        """As generate, yielding text pieces as they come."""
    def chat(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> dict[str, Any]:
        """The assistant's reply to a conversation, through the model's chat template."""
    def score(self, text: Union[str, Sequence[int]], *, top_k: int = 5) -> dict[str, Any]:
        """Teacher-forced log-probabilities: tokens, logprobs, top, perplexity."""
