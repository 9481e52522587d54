// Rotary position embedding, both pairings, from a precomputed cos/sin table
// ([tokens, d/2], built in f64 on the host as the CPU kernel does).
//   interleaved: (x[2i], x[2i+1]);  half_split: (x[i], x[i + d/2])
// One thread per rotated pair; x and out are [tokens, heads, d].
extern "C" __global__ void rope_f32(
    const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
    float* __restrict__ out, int tokens, int heads, int d, int half_split) {
  long pairs = (long)tokens * heads * (d / 2);
  long p = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  int i = p % (d / 2);
  long row = p / (d / 2);  // token * heads + head
  int token = row / heads;
  int a = half_split ? i : 2 * i;
  int b = half_split ? i + d / 2 : 2 * i + 1;
  const float* xr = x + row * d;
  float* orow = out + row * d;
  float c = cos_t[(long)token * (d / 2) + i], s = sin_t[(long)token * (d / 2) + i];
  float x0 = xr[a], x1 = xr[b];
  orow[a] = x0 * c - x1 * s;
  orow[b] = x0 * s + x1 * c;
}
