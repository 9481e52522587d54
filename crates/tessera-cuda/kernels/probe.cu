// The device's own ceilings for the roofline: an f32 FMA rate (8 independent chains per
// thread so the pipes stay full; the result is stored so nothing is optimised away) and
// a streaming copy (each thread moves float4s grid-stride; read + written bytes count).
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
