// FlashAttention-2-style forward on tensor cores: O = softmax(scale·Q·Kᵀ + mask)·V.
// Q, O: [batch, sq, heads, D]; K, V: [batch, sk, kv_heads, D]; bf16 or f16 in and out,
// f32 scores, softmax statistics and accumulators. GQA: query head h reads KV head
// h / (heads / kv_heads). Causal masking is bottom-right aligned as the CPU op's:
// query i sees keys j ≤ i + (sk − sq).
//
// One block = 64 queries of one (batch, head), 4 warps × 16 query rows. Per KV tile of
// 64 keys: S = Q·Kᵀ with m16n8k16 MMAs (K is the "col" operand as stored, [key][d]),
// online softmax on the accumulator fragments (a row lives in one quad of lanes), then
// O += P·V where P's accumulator fragments are repacked in registers as the A operand
// (the m16n8 C layout of two adjacent key tiles is exactly the m16n8k16 A layout) and V
// is read with ldmatrix.trans. Q goes through the K buffer into registers once, so
// shared memory is K + V only (35 KiB at D = 128). K and V are separate cp.async groups
// so the V copy overlaps the Q·Kᵀ MMAs. Rows padded by 8 halves against bank conflicts.
#include "common.cuh"

#define BQ 64
#define BKV 64
#define NEG_INF __int_as_float(0xff800000)

template <int D, bool IS_BF16>
__device__ void flash_fwd(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                          const unsigned short* __restrict__ V, unsigned short* __restrict__ O,
                          int sq, int sk, int heads, int kv_heads, float scale, int causal) {
  constexpr int LD = D + 8;
  __shared__ __align__(16) unsigned short Ks[BKV * LD];
  __shared__ __align__(16) unsigned short Vs[BKV * LD];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (heads / kv_heads);
  const size_t q_stride = (size_t)heads * D, kv_stride = (size_t)kv_heads * D;
  const unsigned short* qb = Q + (size_t)b * sq * q_stride + (size_t)h * D;
  const unsigned short* kb = K + (size_t)b * sk * kv_stride + (size_t)kvh * D;
  const unsigned short* vb = V + (size_t)b * sk * kv_stride + (size_t)kvh * D;
  constexpr int CHUNKS = D / 8;  // 16-byte chunks per row

  // 64 rows × CHUNKS chunks from `src` (rows row0.., `rows` valid) into `dst`.
  auto load_rows = [&](unsigned short* dst, const unsigned short* src, size_t stride, int row0,
                       int rows) {
    for (int c = tid; c < BKV * CHUNKS; c += 128) {
      int r = c / CHUNKS, col = (c % CHUNKS) * 8;
      bool ok = row0 + r < rows;
      cp_async16(&dst[r * LD + col], ok ? src + (size_t)(row0 + r) * stride + col : src,
                 ok ? 16 : 0);
    }
    cp_async_commit();
  };

  // Q fragments (A operand), D/16 k-steps.
  unsigned qf[D / 16][4];
  load_rows(Ks, qb, q_stride, q0, sq);
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(qf[kk], &Ks[(warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8]);
  __syncthreads();

  const int g = lane >> 2, tq = lane & 3;
  const int row_a = q0 + warp * 16 + g, row_b = row_a + 8;  // this thread's two query rows
  const int offset = sk - sq;
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.f, l_b = 0.f;
  const float log2e_scale = scale * 1.4426950408889634f;

  int kv_end = sk;
  if (causal) kv_end = min(sk, q0 + BQ + offset);
  for (int k0 = 0; k0 < kv_end; k0 += BKV) {
    load_rows(Ks, kb, kv_stride, k0, sk);
    load_rows(Vs, vb, kv_stride, k0, sk);
    cp_async_wait<1>();  // K has landed; V may still be in flight
    __syncthreads();

    float s[BKV / 8][4];
#pragma unroll
    for (int j = 0; j < BKV / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int j = 0; j < BKV / 16; ++j) {
        unsigned kf[4];
        int row = j * 16 + (lane >> 4) * 8 + (lane & 7), col = kk * 16 + ((lane >> 3) & 1) * 8;
        ldmatrix_x4(kf, &Ks[row * LD + col]);
        mma16816<IS_BF16>(s[2 * j], qf[kk], kf[0], kf[1]);
        mma16816<IS_BF16>(s[2 * j + 1], qf[kk], kf[2], kf[3]);
      }

    // Mask, then the online softmax in base 2 (scale folded into log2(e)).
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int j = 0; j < BKV / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int key = k0 + j * 8 + tq * 2 + (e & 1);
        int row = e < 2 ? row_a : row_b;
        bool masked = key >= sk || (causal && key > row + offset);
        float v = masked ? NEG_INF : s[j][e] * log2e_scale;
        s[j][e] = v;
        if (e < 2) mx_a = fmaxf(mx_a, v); else mx_b = fmaxf(mx_b, v);
      }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, x));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, x));
    }
    // A row with every key masked so far keeps max −∞; exponentiate against 0 then.
    float base_a = mx_a == NEG_INF ? 0.f : mx_a, base_b = mx_b == NEG_INF ? 0.f : mx_b;
    float corr_a = exp2f(m_a - base_a), corr_b = exp2f(m_b - base_b);
    m_a = mx_a;
    m_b = mx_b;
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int j = 0; j < BKV / 8; ++j) {
      s[j][0] = exp2f(s[j][0] - base_a);
      s[j][1] = exp2f(s[j][1] - base_a);
      s[j][2] = exp2f(s[j][2] - base_b);
      s[j][3] = exp2f(s[j][3] - base_b);
      sum_a += s[j][0] + s[j][1];
      sum_b += s[j][2] + s[j][3];
    }
    l_a = l_a * corr_a + sum_a;  // per-thread partial sums; the quad reduces at the end
    l_b = l_b * corr_b + sum_b;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][0] *= corr_a;
      o[j][1] *= corr_a;
      o[j][2] *= corr_b;
      o[j][3] *= corr_b;
    }

    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BKV / 16; ++kk) {
      unsigned pf[4] = {pack2<IS_BF16>(s[2 * kk][0], s[2 * kk][1]),
                        pack2<IS_BF16>(s[2 * kk][2], s[2 * kk][3]),
                        pack2<IS_BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                        pack2<IS_BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int j = 0; j < D / 16; ++j) {
        // .trans: (keys 0–7, d 0–7), (keys 8–15, d 0–7), (keys 0–7, d 8–15), (keys 8–15, d 8–15).
        unsigned vf[4];
        int key = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), col = j * 16 + (lane >> 4) * 8;
        ldmatrix_x4_trans(vf, &Vs[key * LD + col]);
        mma16816<IS_BF16>(o[2 * j], pf, vf[0], vf[1]);
        mma16816<IS_BF16>(o[2 * j + 1], pf, vf[2], vf[3]);
      }
    }
    __syncthreads();  // K and V buffers are overwritten by the next tile
  }

#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, x);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, x);
  }
  // A fully masked row (possible only when sq > sk under causal) has l = 0: NaN out,
  // as the CPU op's softmax over no keys.
  float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  unsigned short* ob = O + (size_t)b * sq * q_stride + (size_t)h * D;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    int col = j * 8 + tq * 2;
    if (row_a < sq)
      *reinterpret_cast<unsigned*>(&ob[(size_t)row_a * q_stride + col]) =
          pack2<IS_BF16>(o[j][0] * inv_a, o[j][1] * inv_a);
    if (row_b < sq)
      *reinterpret_cast<unsigned*>(&ob[(size_t)row_b * q_stride + col]) =
          pack2<IS_BF16>(o[j][2] * inv_b, o[j][3] * inv_b);
  }
}

#define FLASH_ENTRY(NAME, D, BF)                                                             \
  extern "C" __global__ void __launch_bounds__(128)                                          \
      NAME(const unsigned short* Q, const unsigned short* K, const unsigned short* V,        \
           unsigned short* O, int sq, int sk, int heads, int kv_heads, float scale, int causal) { \
    flash_fwd<D, BF>(Q, K, V, O, sq, sk, heads, kv_heads, scale, causal);                   \
  }
FLASH_ENTRY(flash_fwd_bf16_d64, 64, true)
FLASH_ENTRY(flash_fwd_bf16_d128, 128, true)
FLASH_ENTRY(flash_fwd_f16_d64, 64, false)
FLASH_ENTRY(flash_fwd_f16_d128, 128, false)
