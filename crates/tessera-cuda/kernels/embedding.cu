// Embedding lookup: out[t, :] = table[ids[t], :]. The host side must reject
// out-of-range ids before launch, as the CPU op does; the guard here only keeps a bad
// launch from reading out of bounds (the row becomes NaN).
extern "C" __global__ void embedding_f32(
    const float* __restrict__ table, const unsigned int* __restrict__ ids, float* __restrict__ out,
    int tokens, int dim, unsigned int vocab) {
  long n = (long)tokens * dim;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    int t = i / dim, c = i % dim;
    unsigned int id = ids[t];
    out[i] = id < vocab ? table[(size_t)id * dim + c] : __int_as_float(0x7fc00000);  // NaN
  }
}
