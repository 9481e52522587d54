// Decode attention over a paged KV cache, split over the context ("flash-decoding").
// Cache: K and V [num_blocks, block_size, kv_heads, d] in bf16; block_tables
// [seqs, max_blocks] (u32 block ids); context_lens [seqs]; q and out [seqs, heads, d] f32.
//
// paged_attention_partial: grid (heads, seqs, splits), 4 warps. Split s of a sequence
// takes tokens [s·chunk, (s+1)·chunk); each warp walks every 4th token of it, a whole
// warp per token: lanes read d/2 bf16 pairs (coalesced 4-byte loads along the row),
// the dot product is a butterfly all-reduce, and the warp keeps an online softmax
// (max m, sum l, weighted values). The 4 warps merge in shared memory and write the
// split's (m, l, acc[d]) to the workspace. paged_attention_combine merges the splits
// with the log-sum-exp rule and normalises. Requires d even and ≤ 256.
#include <cuda_bf16.h>

#define NEG_INF __int_as_float(0xff800000)
#define MAX_PAIRS 4  // d/2 pairs per lane: d ≤ 256

extern "C" __global__ void __launch_bounds__(128) paged_attention_partial(
    const float* __restrict__ q, const __nv_bfloat162* __restrict__ k_cache,
    const __nv_bfloat162* __restrict__ v_cache, const unsigned* __restrict__ block_tables,
    const int* __restrict__ context_lens, float* __restrict__ part_ml, float* __restrict__ part_acc,
    int heads, int kv_heads, int d, int block_size, int max_blocks, int chunk, float scale) {
  const int h = blockIdx.x, seq = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvh = h / (heads / kv_heads), pairs = d / 2;
  const int len = context_lens[seq];
  const int t0 = split * chunk, t1 = min(len, t0 + chunk);
  const float* qr = q + ((size_t)seq * heads + h) * d;
  float2 qv[MAX_PAIRS], acc[MAX_PAIRS];
#pragma unroll
  for (int i = 0; i < MAX_PAIRS; ++i) {
    int p = lane + 32 * i;
    qv[i] = p < pairs ? make_float2(qr[2 * p] * scale, qr[2 * p + 1] * scale) : make_float2(0.f, 0.f);
    acc[i] = make_float2(0.f, 0.f);
  }
  float m = NEG_INF, l = 0.f;
  for (int t = t0 + warp; t < t1; t += 4) {
    unsigned blk = block_tables[(size_t)seq * max_blocks + t / block_size];
    size_t row = (((size_t)blk * block_size + t % block_size) * kv_heads + kvh) * pairs;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < MAX_PAIRS; ++i) {
      int p = lane + 32 * i;
      if (p < pairs) {
        float2 kf = __bfloat1622float2(k_cache[row + p]);
        dot += qv[i].x * kf.x + qv[i].y * kf.y;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    float m_new = fmaxf(m, dot);
    float corr = __expf(m - m_new), p_t = __expf(dot - m_new);
    l = l * corr + p_t;
#pragma unroll
    for (int i = 0; i < MAX_PAIRS; ++i) {
      int p = lane + 32 * i;
      if (p < pairs) {
        float2 vf = __bfloat1622float2(v_cache[row + p]);
        acc[i].x = acc[i].x * corr + p_t * vf.x;
        acc[i].y = acc[i].y * corr + p_t * vf.y;
      }
    }
    m = m_new;
  }

  // Merge the 4 warps.
  __shared__ float sm[4], sl[4];
  __shared__ float2 sacc[4][128];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < MAX_PAIRS; ++i)
    if (lane + 32 * i < pairs) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float mt = fmaxf(fmaxf(sm[0], sm[1]), fmaxf(sm[2], sm[3]));
  float w[4], lt = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = sm[i] == NEG_INF ? 0.f : __expf(sm[i] - mt);
    lt += sl[i] * w[i];
  }
  size_t part = ((size_t)seq * heads + h) * splits + split;
  if (threadIdx.x == 0) {
    part_ml[2 * part] = mt;
    part_ml[2 * part + 1] = lt;
  }
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    float2 s = make_float2(0.f, 0.f);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s.x += sacc[i][p].x * w[i];
      s.y += sacc[i][p].y * w[i];
    }
    part_acc[part * d + 2 * p] = s.x;
    part_acc[part * d + 2 * p + 1] = s.y;
  }
}

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
