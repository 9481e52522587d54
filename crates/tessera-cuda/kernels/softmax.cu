// Row-wise stable softmax, one block per row: max, then Σ e^(x−max), then normalise.
// Block-wide reductions through warp shuffles and shared memory. (NVRTC has no math.h,
// hence -∞ spelled as its bit pattern.)
#define NEG_INF __int_as_float(0xff800000)
__device__ float block_reduce(float v, bool is_max) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : (is_max ? NEG_INF : 0.f);
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  __syncthreads();  // partial is reused by the next reduction
  return v;
}

extern "C" __global__ void softmax_f32(const float* __restrict__ x, float* __restrict__ out, int cols) {
  const float* xr = x + (size_t)blockIdx.x * cols;
  float* orow = out + (size_t)blockIdx.x * cols;
  float m = NEG_INF;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(xr[c] - m);
  s = block_reduce(s, false);
  float inv = 1.f / s;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = __expf(xr[c] - m) * inv;
}
