// Attention over a paged KV cache, decode rows and prefill chunks alike, split over the
// context ("flash-decoding"). One kernel body serves both cache types: f32 (the
// registry's `paged_attention` / `varlen_attention` / `attention`) and bf16 (`ops::
// paged_attention`, decode over a 16-bit cache).
//
// paged_varlen_*: grid (query rows, heads, splits), 4 warps. `meta` holds, per query row,
// (sequence, first visible position, end), then the block tables [sequences,
// max_blocks]; the host built and checked it (causal and window already applied). Split
// s of a row takes its visible positions [start + s·chunk, start + (s+1)·chunk): a few
// decode rows would otherwise leave most multiprocessors idle while each block walks a
// long context alone. Each warp walks every 4th position with a whole warp per position
// (lane i holds elements i, i+32, … of q and of its running output: d ≤ 256), online
// softmax per warp, the 4 warps merged in shared memory. One split writes the
// normalised row; several write their (m, l, acc) to the workspace and
// paged_attention_combine merges them with the log-sum-exp rule.
// q and out [rows, heads, d] f32; K and V [num_blocks, block_size, kv_heads, d].
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define NEG_INF __int_as_float(0xff800000)

// grid (heads, seqs), d threads (≤ 256): out = Σ_s e^(m_s − M)·acc_s / Σ_s e^(m_s − M)·l_s.
// A sequence with no tokens gives NaN (0/0), as the CPU op rejects or propagates.
extern "C" __global__ void paged_attention_combine(const float* __restrict__ part_ml,
                                                   const float* __restrict__ part_acc,
                                                   float* __restrict__ out, int heads, int d,
                                                   int splits) {
  const int h = blockIdx.x, seq = blockIdx.y, c = threadIdx.x;
  size_t base = ((size_t)seq * heads + h) * splits;
  float mt = NEG_INF;
  for (int s = 0; s < splits; ++s) mt = fmaxf(mt, part_ml[2 * (base + s)]);
  float num = 0.f, den = 0.f;
  for (int s = 0; s < splits; ++s) {
    float ms = part_ml[2 * (base + s)];
    float w = ms == NEG_INF ? 0.f : __expf(ms - mt);
    den += part_ml[2 * (base + s) + 1] * w;
    if (c < d) num += part_acc[(base + s) * d + c] * w;
  }
  if (c < d) out[((size_t)seq * heads + h) * d + c] = num / den;
}

#define MAX_PER_LANE 8
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }

template <typename T>
__device__ void paged_varlen(
    const float* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
    const unsigned* __restrict__ meta, float* __restrict__ out, float* __restrict__ part_ml,
    float* __restrict__ part_acc, int total_q, int heads, int kv_heads, int d, int block_size,
    int max_blocks, int chunk, float scale) {
  const int row = blockIdx.x, h = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned seq = meta[3 * row], start = meta[3 * row + 1], end = meta[3 * row + 2];
  const unsigned t0 = start + (unsigned)split * chunk, t1 = min(end, t0 + chunk);
  const unsigned* table = meta + 3 * (size_t)total_q + (size_t)seq * max_blocks;
  const int kvh = h / (heads / kv_heads);
  const float* qr = q + ((size_t)row * heads + h) * d;
  float qv[MAX_PER_LANE], acc[MAX_PER_LANE];
#pragma unroll
  for (int i = 0; i < MAX_PER_LANE; ++i) {
    int e = lane + 32 * i;
    qv[i] = e < d ? qr[e] * scale : 0.f;
    acc[i] = 0.f;
  }
  float m = NEG_INF, l = 0.f;
  for (unsigned t = t0 + warp; t < t1; t += 4) {
    size_t base = (((size_t)table[t / block_size] * block_size + t % block_size) * kv_heads + kvh) * d;
    float kv[MAX_PER_LANE], vv[MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; ++i) {
      int e = lane + 32 * i;
      kv[i] = e < d ? widen(k_cache[base + e]) : 0.f;
      vv[i] = e < d ? widen(v_cache[base + e]) : 0.f;
    }
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; ++i) dot = fmaf(qv[i], kv[i], dot);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    float m_new = fmaxf(m, dot);
    float corr = __expf(m - m_new), p = __expf(dot - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; ++i) acc[i] = fmaf(p, vv[i], acc[i] * corr);
    m = m_new;
  }
  __shared__ float sm[4], sl[4];
  __shared__ float sacc[4][32 * MAX_PER_LANE];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < MAX_PER_LANE; ++i)
    if (lane + 32 * i < d) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float mt = fmaxf(fmaxf(sm[0], sm[1]), fmaxf(sm[2], sm[3]));
  float w[4], lt = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = sm[i] == NEG_INF ? 0.f : __expf(sm[i] - mt);
    lt += sl[i] * w[i];
  }
  size_t part = ((size_t)row * heads + h) * splits + split;
  if (splits > 1 && threadIdx.x == 0) {
    part_ml[2 * part] = mt;
    part_ml[2 * part + 1] = lt;
  }
  float* orow = splits > 1 ? part_acc + part * d : out + ((size_t)row * heads + h) * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) s += sacc[i][e] * w[i];
    orow[e] = splits > 1 ? s : s / lt;
  }
}

#define PAGED_VARLEN_ENTRY(NAME, T)                                                              \
  extern "C" __global__ void __launch_bounds__(128)                                              \
      NAME(const float* q, const T* k_cache, const T* v_cache, const unsigned* meta, float* out, \
           float* part_ml, float* part_acc, int total_q, int heads, int kv_heads, int d,        \
           int block_size, int max_blocks, int chunk, float scale) {                              \
    paged_varlen<T>(q, k_cache, v_cache, meta, out, part_ml, part_acc, total_q, heads, kv_heads, \
                    d, block_size, max_blocks, chunk, scale);                                     \
  }
PAGED_VARLEN_ENTRY(paged_varlen_f32, float)
PAGED_VARLEN_ENTRY(paged_varlen_bf16, __nv_bfloat16)
PAGED_VARLEN_ENTRY(paged_varlen_f16, __half)
