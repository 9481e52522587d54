// Fused SwiGLU: out = silu(gate) * up, elementwise; silu(g) = g / (1 + e^-g).
// NaN and Inf propagate as in the CPU kernel (no clamping).
extern "C" __global__ void swiglu_f32(
    const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out, long n) {
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    float g = gate[i];
    out[i] = g / (1.f + __expf(-g)) * up[i];
  }
}
