// Tensor-core GEMM, C[M,N] (f32) = alpha · A[M,K] · B[N,K]ᵀ with A and B in bf16 or f16,
// both row-major in K ("TN": B is a weight matrix stored by output row).
//
// Block tile 128×128×32, 8 warps as 2×4, each warp 64×32 = 4×4 m16n8k16 MMAs per
// 16-deep step (64 f32 accumulators per thread). Tiles stream through shared memory
// with cp.async, two stages so the next tile's copy overlaps this tile's MMAs. Rows are
// padded to 40 halves (80 bytes): the 8 rows one ldmatrix phase reads then fall in 8
// distinct 16-byte bank groups (64-byte rows would conflict 2-way).
// Requirements (checked on the host): K, lda and ldb multiples of 8 (16-byte cp.async),
// 16-byte aligned A and B. Out-of-range rows and K tails are zero-filled, stores guarded.
#include "common.cuh"

#define BM 128
#define BN 128
#define BK 32
#define PAD 8
#define LDS (BK + PAD)

template <bool IS_BF16>
__device__ void gemm_tn(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
                        float* __restrict__ C, int M, int N, int K, int lda, int ldb, int ldc,
                        float alpha) {
  __shared__ __align__(16) unsigned short As[2][BM * LDS];
  __shared__ __align__(16) unsigned short Bs[2][BN * LDS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;  // warp tile origin: (wm·64, wn·32)
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

  // Each thread copies 2 16-byte chunks of A and 2 of B per stage (128 rows × 4 chunks).
  auto load = [&](int stage, int k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int c = tid + i * 256, row = c >> 2, col = (c & 3) * 8;
      int ka = k0 + col;
      bool a_ok = m0 + row < M && ka < K, b_ok = n0 + row < N && ka < K;
      const unsigned short* ga = a_ok ? A + (size_t)(m0 + row) * lda + ka : A;
      const unsigned short* gb = b_ok ? B + (size_t)(n0 + row) * ldb + ka : B;
      cp_async16(&As[stage][row * LDS + col], ga, a_ok ? 16 : 0);
      cp_async16(&Bs[stage][row * LDS + col], gb, b_ok ? 16 : 0);
    }
    cp_async_commit();
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

  const int tiles = (K + BK - 1) / BK;
  load(0, 0);
  for (int t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) {
      load((t + 1) & 1, (t + 1) * BK);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const unsigned short* as = As[t & 1];
    const unsigned short* bs = Bs[t & 1];
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[4][4], b[2][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // Lanes 0–15 address rows 0–15 at k, lanes 16–31 the same rows at k + 8.
        int row = wm * 64 + i * 16 + (lane & 15), col = kk + (lane >> 4) * 8;
        ldmatrix_x4(a[i], &as[row * LDS + col]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        // Matrices: (n 0–7, k 0–7), (n 0–7, k 8–15), (n 8–15, k 0–7), (n 8–15, k 8–15).
        int row = wn * 32 + j * 16 + (lane >> 4) * 8 + (lane & 7);
        int col = kk + ((lane >> 3) & 1) * 8;
        ldmatrix_x4(b[j], &bs[row * LDS + col]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mma16816<IS_BF16>(acc[i][j], a[i], b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
    }
    __syncthreads();  // the stage just read is the next iteration's copy target
  }

  // Accumulator layout: c0,c1 at (row g, cols 2t, 2t+1); c2,c3 at row g + 8.
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int row = m0 + wm * 64 + i * 16 + g + h * 8;
        int col = n0 + wn * 32 + j * 8 + tq * 2;
        if (row < M) {
          if (col < N) C[(size_t)row * ldc + col] = alpha * acc[i][j][2 * h];
          if (col + 1 < N) C[(size_t)row * ldc + col + 1] = alpha * acc[i][j][2 * h + 1];
        }
      }
}

extern "C" __global__ void __launch_bounds__(256)
    gemm_bf16_tn(const unsigned short* A, const unsigned short* B, float* C, int M, int N, int K,
                 int lda, int ldb, int ldc, float alpha) {
  gemm_tn<true>(A, B, C, M, N, K, lda, ldb, ldc, alpha);
}

extern "C" __global__ void __launch_bounds__(256)
    gemm_f16_tn(const unsigned short* A, const unsigned short* B, float* C, int M, int N, int K,
                int lda, int ldb, int ldc, float alpha) {
  gemm_tn<false>(A, B, C, M, N, K, lda, ldb, ldc, alpha);
}

// General strided batched GEMM on the CUDA cores, the registry's `gemm` for any layout
// the tensor-core kernel above cannot take: C = α·A·B + β·C with A [m,k], B [k,n] and
// C [m,n] rank-3 views (batch, row and column element strides; the view's offset is
// folded into the pointer by the host). A and B are f32, f16 or bf16 (KIND 0, 1, 2),
// widened on load; f32 accumulation; β = 0 never reads C (it may hold NaN poison).
// 64×64 output tiles, 256 threads each owning 4×4 outputs strided by 16 (so a warp's
// shared-memory reads are consecutive words), K in steps of 16 through shared memory.
template <int KIND>
__device__ __forceinline__ float widen(const void* p, long long i) {
  if (KIND == 0) return static_cast<const float*>(p)[i];
  unsigned short b = static_cast<const unsigned short*>(p)[i];
  if (KIND == 1) return __half2float(__ushort_as_half(b));
  return __uint_as_float((unsigned)b << 16);
}

template <int KIND>
__device__ void gemm_strided(const void* __restrict__ A, const void* __restrict__ B,
                             float* __restrict__ C, int m, int n, int k, long long as0,
                             long long as1, long long as2, long long bs0, long long bs1,
                             long long bs2, long long cs0, long long cs1, long long cs2,
                             float alpha, float beta) {
  __shared__ float As[16][64 + 1];
  __shared__ float Bs[16][64 + 1];
  const long long batch = blockIdx.z;
  const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  for (int k0 = 0; k0 < k; k0 += 16) {
    for (int e = threadIdx.x; e < 64 * 16; e += 256) {
      int r = e >> 4, kk = e & 15, gr = m0 + r, gk = k0 + kk;
      As[kk][r] = gr < m && gk < k ? widen<KIND>(A, batch * as0 + gr * as1 + gk * as2) : 0.f;
      int kb = e >> 6, c = e & 63, gc = n0 + c, gkb = k0 + kb;
      Bs[kb][c] = gkb < k && gc < n ? widen<KIND>(B, batch * bs0 + gkb * bs1 + gc * bs2) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = As[kk][ty + 16 * i];
        b[i] = Bs[kk][tx + 16 * i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int r = m0 + ty + 16 * i, c = n0 + tx + 16 * j;
      if (r < m && c < n) {
        float* out = C + batch * cs0 + r * cs1 + c * cs2;
        *out = beta == 0.f ? alpha * acc[i][j] : alpha * acc[i][j] + beta * *out;
      }
    }
}

#define GEMM_STRIDED_ENTRY(NAME, KIND)                                                     \
  extern "C" __global__ void __launch_bounds__(256)                                        \
      NAME(const void* A, const void* B, float* C, int m, int n, int k, long long as0,     \
           long long as1, long long as2, long long bs0, long long bs1, long long bs2,      \
           long long cs0, long long cs1, long long cs2, float alpha, float beta) {         \
    gemm_strided<KIND>(A, B, C, m, n, k, as0, as1, as2, bs0, bs1, bs2, cs0, cs1, cs2,      \
                       alpha, beta);                                                       \
  }
GEMM_STRIDED_ENTRY(gemm_strided_f32, 0)
GEMM_STRIDED_ENTRY(gemm_strided_f16, 1)
GEMM_STRIDED_ENTRY(gemm_strided_bf16, 2)
