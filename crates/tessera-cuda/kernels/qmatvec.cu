// Quantized matrix products, y[m, n] = x[m, k]·Wᵀ with x and y in f32 and W in a ggml
// block format (Q4_0, Q4_1, Q8_0) or per-channel INT8 (i8 rows, one f32 scale per row).
//
// Block formats arrive split by the host (tessera_core::device::blocks): each row's
// code bytes contiguous (k/2 nibble bytes, or k int8 bytes; rows 16-byte aligned since
// k is whole 32-weight blocks) and each block's f16 scale (and f16 min for Q4_1) apart,
// so lanes read aligned 4-byte words instead of 18-, 20- or 34-byte records.
//
// Decode is bound by reading W once. A warp owns ROWS weight rows and MG activation
// rows: lane l takes code words l, l+32, … of every one of its rows (consecutive lanes,
// consecutive words: each load instruction is 128 contiguous bytes), loads the 8 (or
// 4) activations a word multiplies once into registers and reuses them across the
// ROWS rows, so activation traffic is 1/ROWS of a row-at-a-time kernel's. Partial
// sums meet in butterfly reductions. A Q4 word holds bytes 4j..4j+3 of a block: low
// nibbles are weights 4j..4j+3, high nibbles 16+4j..16+4j+3 (GGUF's order).
#include <cuda_fp16.h>

#define WARPS 4  // warps per block

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float f16_bits(unsigned short b) { return __half2float(__ushort_as_half(b)); }

// FMT: 0 Q4_0, 1 Q4_1, 2 Q8_0. MG activation rows per warp. VEC: x rows 16-byte
// aligned, so a word's activations (runs of 4) come in float4 loads, a quarter of the
// load instructions (at 8 activation rows these otherwise bound the kernel).
//
// ROWS: 4 weight rows per warp for large matrices; 1 for small ones (the default model's
// 576–3072 rows), where four rows per warp would leave most multiprocessors without a
// block (1536 rows: 96 blocks for 132 multiprocessors).
template <int FMT, int MG, bool VEC, int ROWS>
__device__ void block_matmul(const unsigned* __restrict__ codes, const unsigned short* __restrict__ scales,
                             const float* __restrict__ x, float* __restrict__ y, int m, int n, int k,
                             long long x_row, long long y_row, long long y_col) {
  constexpr int PER = FMT == 2 ? 4 : 8;   // weights per code word
  constexpr int SPB = FMT == 1 ? 2 : 1;   // f16 scales per block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = (blockIdx.x * WARPS + warp) * ROWS, g0 = blockIdx.y * MG;
  const int words = k / PER, blocks = k / 32;
  float acc[ROWS][MG];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int g = 0; g < MG; ++g) acc[r][g] = 0.f;
  for (int w = lane; w < words; w += 32) {
    const int b = w / (32 / PER);
    // The activations word w multiplies (and their sum, for Q4_1's min).
    const int lo = FMT == 2 ? PER * w : b * 32 + 4 * (w & 3);
    float xv[MG][PER], xs[MG];
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      xs[g] = 0.f;
      const float* xr = x + (g0 + g < m ? (long long)(g0 + g) * x_row : 0);
      if (VEC) {
#pragma unroll
        for (int h = 0; h < PER / 4; ++h) {
          float4 v = __ldg(reinterpret_cast<const float4*>(xr + lo + 16 * h));
          xv[g][4 * h] = v.x;
          xv[g][4 * h + 1] = v.y;
          xv[g][4 * h + 2] = v.z;
          xv[g][4 * h + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int t = 0; t < PER; ++t) xv[g][t] = __ldg(xr + lo + (t & 3) + (t >> 2) * 16);
      }
      if (FMT == 1) {
#pragma unroll
        for (int t = 0; t < PER; ++t) xs[g] += xv[g][t];
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int row = min(row0 + r, n - 1);  // past the end: recompute the last row, never stored
      const unsigned q = __ldg(codes + (size_t)row * words + w);
      const unsigned short* sc = scales + ((size_t)row * blocks + b) * SPB;
      const float d = f16_bits(__ldg(sc)), mn = FMT == 1 ? f16_bits(__ldg(sc + 1)) : 0.f;
      // Codes to floats without the slow int→float converter: 2²³ + c has c in its low
      // mantissa bits, and one exact subtraction leaves c (Q4_0's −8 and Q8_0's sign
      // bias folded into the constant). Decoded once per row, reused by the MG rows.
      float c[PER];
#pragma unroll
      for (int t = 0; t < PER; ++t) {
        if (FMT == 2) {
          c[t] = __int_as_float(0x4B000000 | (((q >> (8 * t)) & 0xFF) ^ 0x80)) - 8388736.f;
        } else {
          unsigned nib = (q >> (8 * (t & 3) + 4 * (t >> 2))) & 0xF;
          c[t] = __int_as_float(0x4B000000 | nib) - (FMT == 0 ? 8388616.f : 8388608.f);
        }
      }
#pragma unroll
      for (int g = 0; g < MG; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int t = 0; t < PER; ++t) dot = fmaf(c[t], xv[g][t], dot);
        acc[r][g] += FMT == 1 ? fmaf(d, dot, mn * xs[g]) : d * dot;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      float s = warp_sum(acc[r][g]);
      if (lane == 0 && row0 + r < n && g0 + g < m) y[(long long)(g0 + g) * y_row + (long long)(row0 + r) * y_col] = s;
    }
}

#define QMATMUL_ENTRY(NAME, FMT, MG, VEC, ROWS)                                                  \
  extern "C" __global__ void __launch_bounds__(WARPS * 32)                                       \
      NAME(const unsigned* codes, const unsigned short* scales, const float* x, float* y, int m, \
           int n, int k, long long x_row, long long y_row, long long y_col) {                    \
    block_matmul<FMT, MG, VEC, ROWS>(codes, scales, x, y, m, n, k, x_row, y_row, y_col);         \
  }
#define QMATMUL_ENTRIES(FMT_NAME, FMT)                               \
  QMATMUL_ENTRY(qmatmul_##FMT_NAME##_m1, FMT, 1, false, 4)           \
  QMATMUL_ENTRY(qmatmul_##FMT_NAME##_m4, FMT, 4, false, 4)           \
  QMATMUL_ENTRY(qmatmul_##FMT_NAME##_m8, FMT, 8, false, 4)           \
  QMATMUL_ENTRY(qmatmul_##FMT_NAME##_m1_v4, FMT, 1, true, 4)         \
  QMATMUL_ENTRY(qmatmul_##FMT_NAME##_m4_v4, FMT, 4, true, 4)         \
  QMATMUL_ENTRY(qmatmul_##FMT_NAME##_m8_v4, FMT, 8, true, 4)         \
  QMATMUL_ENTRY(qmatmul_##FMT_NAME##_m1_r1, FMT, 1, false, 1)        \
  QMATMUL_ENTRY(qmatmul_##FMT_NAME##_m1_v4_r1, FMT, 1, true, 1)
QMATMUL_ENTRIES(q4_0, 0)
QMATMUL_ENTRIES(q4_1, 1)
QMATMUL_ENTRIES(q8_0, 2)

// INT8: rows of k int8 (k a multiple of 4, rows 4-byte aligned), lanes take 4 bytes.
// y[r, :] = scale ⊙ (W · x[r, :]) with per-channel INT8 weights (K a multiple of 4): a
// warp per weight row, blockIdx.y the activation row; x rows at x_sr, y elements at
// (y_sr, y_sc); float4 activation loads when every x row is 16-byte aligned (VEC).
template <bool VEC>
__device__ void qmatmul_i8_body(const signed char* __restrict__ w, const float* __restrict__ scales,
                                const float* __restrict__ x, float* __restrict__ y, int n, int k,
                                long x_sr, long y_sr, long y_sc) {
  int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* xr = x + (size_t)blockIdx.y * x_sr;
  const char4* wr = reinterpret_cast<const char4*>(w + (size_t)row * k);
  float s = 0.f;
  for (int i = lane; i < k / 4; i += 32) {
    char4 q = wr[i];
    float4 v;
    if (VEC) {
      v = __ldg(reinterpret_cast<const float4*>(xr) + i);
    } else {
      v = make_float4(xr[4 * i], xr[4 * i + 1], xr[4 * i + 2], xr[4 * i + 3]);
    }
    s += q.x * v.x + q.y * v.y + q.z * v.z + q.w * v.w;
  }
  s = warp_sum(s);
  if (lane == 0) y[(size_t)blockIdx.y * y_sr + (size_t)row * y_sc] = s * scales[row];
}

extern "C" __global__ void __launch_bounds__(256)
    qmatmul_i8_v4(const signed char* __restrict__ w, const float* __restrict__ scales,
                  const float* __restrict__ x, float* __restrict__ y, int n, int k, long x_sr,
                  long y_sr, long y_sc) {
  qmatmul_i8_body<true>(w, scales, x, y, n, k, x_sr, y_sr, y_sc);
}

extern "C" __global__ void __launch_bounds__(256)
    qmatmul_i8(const signed char* __restrict__ w, const float* __restrict__ scales,
               const float* __restrict__ x, float* __restrict__ y, int n, int k, long x_sr,
               long y_sr, long y_sc) {
  qmatmul_i8_body<false>(w, scales, x, y, n, k, x_sr, y_sr, y_sc);
}
