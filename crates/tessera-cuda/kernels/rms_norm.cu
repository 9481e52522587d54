// RMSNorm, optionally fused with the residual add: one block per row.
//   x += r (when r != nullptr);  out = x / sqrt(mean(x²) + eps) * gamma
// The sum of squares is reduced per warp with shuffles, then across warps in shared
// memory; f32 throughout (the CPU kernels' numerics).
extern "C" __global__ void rms_norm_residual_f32(
    float* __restrict__ x, const float* __restrict__ r, const float* __restrict__ gamma,
    float* __restrict__ out, int cols, float eps) {
  float* xr = x + (size_t)blockIdx.x * cols;
  const float* rr = r ? r + (size_t)blockIdx.x * cols : nullptr;
  float* orow = out + (size_t)blockIdx.x * cols;
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = xr[c];
    if (rr) { v += rr[c]; xr[c] = v; }
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float warp_sums[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    int warps = (blockDim.x + 31) >> 5;
    ss = lane < warps ? warp_sums[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) warp_sums[0] = ss;
  }
  __syncthreads();
  float inv = rsqrtf(warp_sums[0] / cols + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = xr[c] * inv * gamma[c];
}
