// Elementwise add: out = a + b, the residual stream's add (grid-stride over n).
extern "C" __global__ void add_f32(
    const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, long n) {
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}
