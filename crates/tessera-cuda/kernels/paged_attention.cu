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

// The registry's attention over an f32 paged cache, decode rows and prefill chunks
// alike (dense attention is one block of the whole length): grid (query rows, heads,
// splits), 4 warps. `meta` holds, per query row, (sequence, first visible position,
// end), then the block tables [sequences, max_blocks]; the host built and checked it
// (causal and window already applied). Split s of a row takes its visible positions
// [start + s·chunk, start + (s+1)·chunk): a few decode rows would otherwise leave most
// multiprocessors idle while each block walks a long context alone. Each warp walks
// every 4th position with a whole warp per position (lane i holds elements i, i+32, …
// of q and of its running output: d ≤ 256), online softmax per warp, the 4 warps
// merged in shared memory. One split writes the normalised row; several write their
// (m, l, acc) to the workspace for paged_attention_combine, as the decode kernel above.
// q and out [rows, heads, d]; K and V [num_blocks, block_size, kv_heads, d].
#define MAX_PER_LANE 8
extern "C" __global__ void __launch_bounds__(128) paged_varlen_f32(
    const float* __restrict__ q, const float* __restrict__ k_cache, const float* __restrict__ v_cache,
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
      kv[i] = e < d ? k_cache[base + e] : 0.f;
      vv[i] = e < d ? v_cache[base + e] : 0.f;
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
