// Embedding lookup: out[t, :] = table[ids[t] · row_stride + (0..dim)]. The host must
// reject out-of-range ids before launch, as the CPU op does; the guard here only keeps a
// bad launch from reading out of bounds (the row becomes NaN).
extern "C" __global__ void embedding_f32(
    const float* __restrict__ table, const unsigned int* __restrict__ ids, float* __restrict__ out,
    int tokens, int dim, unsigned int vocab, long long row_stride) {
  long long n = (long long)tokens * dim;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    int t = i / dim, c = i % dim;
    unsigned int id = ids[t];
    out[i] = id < vocab ? table[(long long)id * row_stride + c] : __int_as_float(0x7fc00000);  // NaN
  }
}
