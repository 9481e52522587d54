// Quantized matrix × vector, y[n] = Σ_k W[n, k]·x[k] with x and y in f32 and W in a
// ggml block format (Q4_0, Q4_1, Q8_0: rows of 32-weight blocks, byte layout exactly as
// GGUF stores it) or per-channel INT8 (i8 rows, one f32 scale per row).
//
// Decode is bound by reading W once: one warp per row, lanes take consecutive blocks
// (consecutive lanes read consecutive bytes), 8 rows per 256-thread block. Blocks of 18
// or 20 bytes are only 2-byte aligned, so they are read in 16-bit words; x comes through
// the read-only cache (every row reuses it). The warp's partial sums meet in a
// butterfly reduction; NaN/Inf in x or in a block scale propagate.
#include <cuda_fp16.h>

__device__ __forceinline__ float half_at(const unsigned char* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Σ over the 32 weights of one 4-bit block (16 bytes of nibbles at qs: low nibbles are
// weights 0–15, high nibbles 16–31), value = (q − 8)·d (Q4_0) or q·d + m (Q4_1).
__device__ __forceinline__ float nibble_block_dot(const unsigned char* qs, const float* __restrict__ x,
                                                  float d, float m, bool has_min) {
  float s = 0.f, xs = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    unsigned short w = *reinterpret_cast<const unsigned short*>(qs + 2 * i);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      int j = 2 * i + b;
      unsigned q = (w >> (8 * b)) & 0xFF;
      float lo = __ldg(&x[j]), hi = __ldg(&x[j + 16]);
      s += (float)(q & 0xF) * lo + (float)(q >> 4) * hi;
      xs += lo + hi;
    }
  }
  return has_min ? d * s + m * xs : d * (s - 8.f * xs);
}

// Σ over one block of each format (pointer at the block's first byte, x at its 32
// activations), as the block layouts of GGUF define them.
struct Q4_0 {
  static constexpr int BYTES = 18;
  __device__ static float dot(const unsigned char* blk, const float* __restrict__ x) {
    return nibble_block_dot(blk + 2, x, half_at(blk), 0.f, false);
  }
};
struct Q4_1 {
  static constexpr int BYTES = 20;
  __device__ static float dot(const unsigned char* blk, const float* __restrict__ x) {
    return nibble_block_dot(blk + 4, x, half_at(blk), half_at(blk + 2), true);
  }
};
struct Q8_0 {
  static constexpr int BYTES = 34;
  __device__ static float dot(const unsigned char* blk, const float* __restrict__ x) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      unsigned short q2 = *reinterpret_cast<const unsigned short*>(blk + 2 + 2 * i);
      acc += (float)(signed char)(q2 & 0xFF) * __ldg(&x[2 * i]) +
             (float)(signed char)(q2 >> 8) * __ldg(&x[2 * i + 1]);
    }
    return half_at(blk) * acc;
  }
};

// One warp per row, lanes over consecutive blocks, 8 rows per 256-thread block.
template <class B>
__device__ void block_matvec(const unsigned char* __restrict__ w, const float* __restrict__ x,
                             float* __restrict__ y, int n, int k) {
  int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= n) return;
  int blocks = k / 32;
  const unsigned char* wr = w + (size_t)row * blocks * B::BYTES;
  float s = 0.f;
  for (int b = lane; b < blocks; b += 32) s += B::dot(wr + b * B::BYTES, x + b * 32);
  s = warp_sum(s);
  if (lane == 0) y[row] = s;
}

#define QMATVEC_ENTRY(NAME, B)                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                     \
      NAME(const unsigned char* __restrict__ w, const float* __restrict__ x,            \
           float* __restrict__ y, int n, int k) {                                       \
    block_matvec<B>(w, x, y, n, k);                                                     \
  }
QMATVEC_ENTRY(qmatvec_q4_0, Q4_0)
QMATVEC_ENTRY(qmatvec_q4_1, Q4_1)
QMATVEC_ENTRY(qmatvec_q8_0, Q8_0)

// INT8: rows of k int8 (k a multiple of 4, rows 4-byte aligned), lanes take 4 bytes.
extern "C" __global__ void __launch_bounds__(256)
    qmatvec_i8(const signed char* __restrict__ w, const float* __restrict__ scales,
               const float* __restrict__ x, float* __restrict__ y, int n, int k) {
  int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= n) return;
  const char4* wr = reinterpret_cast<const char4*>(w + (size_t)row * k);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float s = 0.f;
  for (int i = lane; i < k / 4; i += 32) {
    char4 q = wr[i];
    float4 v = __ldg(&x4[i]);
    s += q.x * v.x + q.y * v.y + q.z * v.z + q.w * v.w;
  }
  s = warp_sum(s);
  if (lane == 0) y[row] = s * scales[row];
}
