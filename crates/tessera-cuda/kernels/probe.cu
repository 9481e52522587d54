// The device's own ceilings for the roofline: an f32 FMA rate (8 independent chains per
// thread so the pipes stay full; the result is stored so nothing is optimised away), the
// tensor cores' bf16 rate through the same mma.sync the gemm and flash kernels issue, and
// a streaming copy (each thread moves float4s grid-stride; read + written bytes count).
#include "common.cuh"

extern "C" __global__ void probe_fma(float* out, int iters, float a, float b) {
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = threadIdx.x * 1e-3f + j;
  for (int i = 0; i < iters; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = fmaf(v[j], a, b);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += v[j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" __global__ void probe_copy(const float4* __restrict__ src, float4* __restrict__ dst, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

// bf16 m16n8k16 MMAs with f32 accumulators: 8 independent tiles per warp, operands in
// registers (every element 2^-10), so only the tensor cores are timed. Each output element
// ends as 8 tiles x 4 elements x iters x 16 x 2^-20, which the host checks.
extern "C" __global__ void probe_mma_bf16(float* out, int iters) {
  const unsigned two = 0x3A803A80u;  // two bf16 of 2^-10
  const unsigned a[4] = {two, two, two, two};
  float d[8][4] = {};
  for (int i = 0; i < iters; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) mma16816<true>(d[j], a, two, two);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
