// Reference data for Tessera's ggml-block tests, made by llama.cpp's own ggml (no Tessera
// code involved): for each block format (the 32-weight Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and the
// 256-weight K-quants with the Q8_K activation blocks) and input kind, the f32 input, the blocks
// ggml's reference quantizer writes (`quantize_row_*_ref`, what llama-quantize writes
// without an importance matrix) and what ggml's `dequantize_row_*` gives for them; plus
// blocks of random bytes (finite f16 scales) dequantized, to cover every bit pattern a
// file may hold, not only those the quantizer produces.
//
// Build against a llama.cpp build tree (see scripts/engine_vs_llamacpp.sh for one):
//   B=$LLAMA/build/bin; gcc -O2 -o /tmp/kqref scripts/ggml_blocks_reference.c -L$B -lggml-base -Wl,-rpath,$B -lm
//   /tmp/kqref > crates/tessera-kernels/tests/data/ggml_blocks_reference.json
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// Two K-quant superblocks, sixteen 32-weight blocks.
#define N 512
#define MAX_BYTES (292 * 2)

void quantize_row_q4_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q4_1_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_1_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_0_ref(const float *x, void *y, int64_t k);
void dequantize_row_q4_0(const void *x, float *y, int64_t k);
void dequantize_row_q4_1(const void *x, float *y, int64_t k);
void dequantize_row_q5_0(const void *x, float *y, int64_t k);
void dequantize_row_q5_1(const void *x, float *y, int64_t k);
void dequantize_row_q8_0(const void *x, float *y, int64_t k);

void quantize_row_q2_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q3_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q4_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q6_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_K_ref(const float *x, void *y, int64_t k);
void dequantize_row_q2_K(const void *x, float *y, int64_t k);
void dequantize_row_q3_K(const void *x, float *y, int64_t k);
void dequantize_row_q4_K(const void *x, float *y, int64_t k);
void dequantize_row_q5_K(const void *x, float *y, int64_t k);
void dequantize_row_q6_K(const void *x, float *y, int64_t k);
void dequantize_row_q8_K(const void *x, float *y, int64_t k);

typedef void (*quant_fn)(const float *, void *, int64_t);
typedef void (*dequant_fn)(const void *, float *, int64_t);

struct format {
    const char *name;
    int block_weights;
    int block_bytes;
    quant_fn quantize;
    dequant_fn dequantize;
    // Byte offsets of the f16 scale fields (-1: none); Q8_K's scale is an f32 at 0.
    int f16_at[2];
    int f32_at;
};

static const struct format FORMATS[] = {
    {"q2_k", 256, 84, quantize_row_q2_K_ref, dequantize_row_q2_K, {80, 82}, -1},
    {"q3_k", 256, 110, quantize_row_q3_K_ref, dequantize_row_q3_K, {108, -1}, -1},
    {"q4_k", 256, 144, quantize_row_q4_K_ref, dequantize_row_q4_K, {0, 2}, -1},
    {"q5_k", 256, 176, quantize_row_q5_K_ref, dequantize_row_q5_K, {0, 2}, -1},
    {"q6_k", 256, 210, quantize_row_q6_K_ref, dequantize_row_q6_K, {208, -1}, -1},
    {"q8_k", 256, 292, quantize_row_q8_K_ref, dequantize_row_q8_K, {-1, -1}, 0},
    {"q4_0", 32, 18, quantize_row_q4_0_ref, dequantize_row_q4_0, {0, -1}, -1},
    {"q4_1", 32, 20, quantize_row_q4_1_ref, dequantize_row_q4_1, {0, 2}, -1},
    {"q5_0", 32, 22, quantize_row_q5_0_ref, dequantize_row_q5_0, {0, -1}, -1},
    {"q5_1", 32, 24, quantize_row_q5_1_ref, dequantize_row_q5_1, {0, 2}, -1},
    {"q8_0", 32, 34, quantize_row_q8_0_ref, dequantize_row_q8_0, {0, -1}, -1},
};

static uint64_t state = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform(void) { return (next_u64() >> 11) * (1.0 / 9007199254740992.0); }
static double normal(void) {
    double u = uniform(), v = uniform();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static const char *KINDS[] = {"normal", "uniform", "outliers", "offset", "degenerate"};

static void fill(const char *kind, float *x) {
    for (int i = 0; i < N; ++i) {
        if (!strcmp(kind, "normal")) x[i] = (float)(0.02 * normal());
        else if (!strcmp(kind, "uniform")) x[i] = (float)(2.0 * uniform() - 1.0);
        else if (!strcmp(kind, "outliers"))
            x[i] = (float)(normal() * (uniform() < 0.02 ? 40.0 : 1.0));
        else if (!strcmp(kind, "offset")) x[i] = (float)(3.0 + 0.01 * uniform());
        else {
            // Sub-blocks of 16 cycling through: all zero, one repeated value, a lone
            // spike, tiny values, normal data.
            int sub = (i / 16) % 5;
            x[i] = sub == 0 ? 0.0f
                 : sub == 1 ? -0.75f
                 : sub == 2 ? (i % 16 == 5 ? 2.5f : 0.0f)
                 : sub == 3 ? (float)(1e-7 * normal())
                 : (float)normal();
        }
    }
}

static void print_floats(const float *v, int n) {
    printf("[");
    for (int i = 0; i < n; ++i) {
        uint32_t b;
        memcpy(&b, &v[i], 4);
        printf("%s\"%08x\"", i ? "," : "", b);
    }
    printf("]");
}

static void print_bytes(const uint8_t *b, int n) {
    printf("\"");
    for (int i = 0; i < n; ++i) printf("%02x", b[i]);
    printf("\"");
}

static int blocks_of(const struct format *f) { return N / f->block_weights; }

static void random_blocks(const struct format *f, uint8_t *blocks) {
    for (int i = 0; i < f->block_bytes * blocks_of(f); ++i) blocks[i] = (uint8_t)next_u64();
    for (int s = 0; s < blocks_of(f); ++s) {
        uint8_t *b = blocks + s * f->block_bytes;
        for (int j = 0; j < 2; ++j) {
            if (f->f16_at[j] < 0) continue;
            // A finite f16: exponent field 1..=24 (magnitudes 2^-14 .. 2^9).
            uint16_t h = (uint16_t)((next_u64() & 0x83FF) | ((1 + next_u64() % 24) << 10));
            memcpy(b + f->f16_at[j], &h, 2);
        }
        if (f->f32_at >= 0) {
            float d = (float)(uniform() * 0.1 + 1e-3);
            memcpy(b + f->f32_at, &d, 4);
        }
    }
}

int main(void) {
    static float x[N], y[N];
    static uint8_t blocks[MAX_BYTES];
    printf("{\"generator\": \"scripts/ggml_blocks_reference.c (ggml quantize_row_*_ref, dequantize_row_*)\",\n \"cases\": [\n");
    int first = 1;
    for (size_t fi = 0; fi < sizeof FORMATS / sizeof *FORMATS; ++fi) {
        const struct format *f = &FORMATS[fi];
        for (size_t k = 0; k <= sizeof KINDS / sizeof *KINDS; ++k) {
            int random = k == sizeof KINDS / sizeof *KINDS;
            if (random) {
                random_blocks(f, blocks);
            } else {
                fill(KINDS[k], x);
                f->quantize(x, blocks, N);
            }
            f->dequantize(blocks, y, N);
            printf("%s  {\"format\": \"%s\", \"kind\": \"%s\", \"input\": ", first ? "" : ",\n", f->name,
                   random ? "random_bytes" : KINDS[k]);
            if (random) printf("null");
            else print_floats(x, N);
            printf(", \"blocks\": ");
            print_bytes(blocks, f->block_bytes * blocks_of(f));
            printf(", \"dequantized\": ");
            print_floats(y, N);
            printf("}");
            first = 0;
        }
    }
    printf("\n ]}\n");
    return 0;
}
