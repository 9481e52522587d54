// The AVX2 interleaved kernels' instruction mixes (crates/tessera-kernels/src/ops/qmatmul/
// rows8), timed alone on x86-64 with AVX2 and FMA: what one 32-column chunk of an 8-row
// weight group costs per activation row when nothing but the instructions limits it (no
// cache misses, no loop overhead; the float accumulators live in memory, as 8 lane sets'
// running sums leave no registers for them). These cycles divided by the kernels' own
// (`tessera bench qmatmul ... --in-cache --set threads=1`) say how close each loop runs to
// its instruction mix; docs/performance.md quotes both.
//
//   gcc -O2 scripts/avx2_int8_mix.c -o /tmp/avx2_int8_mix && taskset -c 0 /tmp/avx2_int8_mix
//
// Cycles come from a chain of dependent scalar adds (one cycle each on every x86 core)
// timed like the mixes, so the figures are core cycles whatever the TSC's rate. Each mix
// is straight-line code over one chunk: its 8 steps (4 columns each) for 8 row lanes
// (one group × 8 activation rows, or two groups × 4 rows), then each lane's float finish.

#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define REPS 2000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// 64-byte aligned scratch: codes, activation words, scales and spilled accumulators.
static _Alignas(64) uint8_t buf[4096];

#define CLOBBER                                                                          \
    "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9",      \
        "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "ymm15", "memory"

#define STR(x) #x
#define X(x) STR(x)

// --- one activation row's step against one group: acc_i += x_i · codes -------------
// Nibbles: vpmaddubsw + vpaddw (i16 running sum), x broadcast from its 4 bytes.
#define NIB_ROW(i, codes)                                                                \
    "vpbroadcastd " X(i) "*4+512(%0), %%ymm11\n"                                        \
    "vpmaddubsw %%ymm11, " codes ", %%ymm12\n"                                          \
    "vpaddw %%ymm12, %%ymm" X(i) ", %%ymm" X(i) "\n"
// The pair's rows: one broadcast serves both groups' codes (lanes i and i + 4).
#define PAIR_ROW(i, j)                                                                   \
    "vpbroadcastd " X(i) "*4+512(%0), %%ymm11\n"                                        \
    "vpmaddubsw %%ymm11, %%ymm8, %%ymm12\n"                                             \
    "vpaddw %%ymm12, %%ymm" X(i) ", %%ymm" X(i) "\n"                                    \
    "vpmaddubsw %%ymm11, %%ymm9, %%ymm12\n"                                             \
    "vpaddw %%ymm12, %%ymm" X(j) ", %%ymm" X(j) "\n"
// Full bytes: |q| against x given q's signs, pairs widened at once (i32 running sum).
#define FULL_ROW(i)                                                                      \
    "vpbroadcastd " X(i) "*4+512(%0), %%ymm11\n"                                        \
    "vpsignb %%ymm9, %%ymm11, %%ymm11\n"                                                \
    "vpmaddubsw %%ymm11, %%ymm8, %%ymm11\n"                                             \
    "vpmaddwd %%ymm13, %%ymm11, %%ymm11\n"                                              \
    "vpaddd %%ymm11, %%ymm" X(i) ", %%ymm" X(i) "\n"

#define ROWS8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define PAIRS4(M) M(0, 4) M(1, 5) M(2, 6) M(3, 7)

// Steps: codes loaded (nibbles masked; a chunk pair shares its 32 bytes a step, so
// half the steps, the high nibbles' chunk, shift first: modelled as alternate steps).
#define CODES_LO(t, at, r) "vmovdqa " X(t) "*32+" at "(%0), " r "\n" "vpand %%ymm10, " r ", " r "\n"
#define CODES_HI(t, at, r)                                                               \
    "vmovdqa " X(t) "*32+" at "(%0), " r "\n"                                           \
    "vpsrlw $4, " r ", " r "\n"                                                         \
    "vpand %%ymm10, " r ", " r "\n"
#define NIB_ROW_8(i) NIB_ROW(i, "%%ymm8")
#define STEP_NIB8(t, C) C(t, "0", "%%ymm8") ROWS8(NIB_ROW_8)
#define STEP_PAIR(t, C) C(t, "0", "%%ymm8") C(t, "256", "%%ymm9") PAIRS4(PAIR_ROW)
#define STEP_FULL(t, C)                                                                  \
    "vmovdqa " X(t) "*32(%0), %%ymm9\n"                                                 \
    "vpabsb %%ymm9, %%ymm8\n" ROWS8(FULL_ROW)
#define STEPS8(S)                                                                        \
    S(0, CODES_LO) S(1, CODES_HI) S(2, CODES_LO) S(3, CODES_HI) S(4, CODES_LO)            \
        S(5, CODES_HI) S(6, CODES_LO) S(7, CODES_HI)

// Finishes, lane i's f32 accumulator spilled at 1024 + 32·i: nibbles widen the i16 sum
// (vpmaddwd against ones), convert, scale by d·d_x, and add the minimum's m·Σx term
// (Q4_1); full bytes convert and scale. The i16/i32 sums restart from zero.
#define FIN_NIB(i)                                                                       \
    "vpmaddwd %%ymm13, %%ymm" X(i) ", %%ymm11\n"                                        \
    "vcvtdq2ps %%ymm11, %%ymm11\n"                                                      \
    "vbroadcastss " X(i) "*4+768(%0), %%ymm12\n"                                        \
    "vmulps %%ymm14, %%ymm12, %%ymm12\n"                                                \
    "vfmadd213ps " X(i) "*32+1024(%0), %%ymm12, %%ymm11\n"                              \
    "vbroadcastss " X(i) "*4+800(%0), %%ymm12\n"                                        \
    "vfmadd231ps %%ymm15, %%ymm12, %%ymm11\n"                                           \
    "vmovaps %%ymm11, " X(i) "*32+1024(%0)\n"                                           \
    "vpxor %%ymm" X(i) ", %%ymm" X(i) ", %%ymm" X(i) "\n"
#define FIN_FULL(i)                                                                      \
    "vcvtdq2ps %%ymm" X(i) ", %%ymm11\n"                                                \
    "vbroadcastss " X(i) "*4+768(%0), %%ymm12\n"                                        \
    "vmulps %%ymm14, %%ymm12, %%ymm12\n"                                                \
    "vfmadd213ps " X(i) "*32+1024(%0), %%ymm12, %%ymm11\n"                              \
    "vmovaps %%ymm11, " X(i) "*32+1024(%0)\n"                                           \
    "vpxor %%ymm" X(i) ", %%ymm" X(i) ", %%ymm" X(i) "\n"

#define SETUP                                                                            \
    "vpcmpeqw %%ymm13, %%ymm13, %%ymm13\n"                                              \
    "vpsrlw $15, %%ymm13, %%ymm13\n"                                                    \
    "vpcmpeqb %%ymm10, %%ymm10, %%ymm10\n"                                              \
    "vpsrlw $12, %%ymm10, %%ymm10\n"                                                    \
    "vmovaps 896(%0), %%ymm14\n"                                                        \
    "vmovaps 928(%0), %%ymm15\n"

// One timing of a mix: seconds per run of its straight-line block.
#define TIME(name, body)                                                                 \
    static double name(void) {                                                          \
        double t0 = now();                                                              \
        for (long n = 0; n < REPS; n++)                                                 \
            __asm__ volatile(SETUP body : : "r"(buf) : CLOBBER);                        \
        return (now() - t0) / REPS;                                                     \
    }

TIME(nib8_steps, STEPS8(STEP_NIB8))
TIME(nib8_chunk, STEPS8(STEP_NIB8) ROWS8(FIN_NIB))
TIME(pair_steps, STEPS8(STEP_PAIR))
TIME(pair_chunk, STEPS8(STEP_PAIR) ROWS8(FIN_NIB))
TIME(full_steps, STEPS8(STEP_FULL))
TIME(full_chunk, STEPS8(STEP_FULL) ROWS8(FIN_FULL))

// Seconds per cycle: dependent adds, one cycle each, one chain through every block. A
// chain restarted per block of 1000 (x = n) let the core start the next block before the
// last ended: it read 3.46-3.49 GHz on host B, where this reads 3.2.
static double cycle_s(void) {
    uint64_t x = 0;
    double t0 = now();
    for (long n = 0; n < REPS / 10; n++)
        __asm__ volatile(".rept 1000\n add $1, %0\n .endr" : "+r"(x));
    return (now() - t0) / (REPS / 10) / 1000;
}

static double min(double a, double b) { return a < b ? a : b; }

int main(void) {
    for (int i = 0; i < 4096; i++) buf[i] = (uint8_t)(i * 37 + 11);
    float *f = (float *)(buf + 768);
    for (int i = 0; i < 64; i++) f[i] = 1e-3f;
    float *acc = (float *)(buf + 1024);
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
    // Rounds interleave every timing, each figure the fastest of its rounds: a shared
    // host's slow moments (another tenant on the core) fall out, and a clock that
    // drifts does so for the mixes and the clock probe alike.
    enum { MIXES = 6, ROUNDS = 15 };
    double (*mix[MIXES])(void) = {nib8_steps, nib8_chunk, pair_steps,
                                  pair_chunk, full_steps, full_chunk};
    double best[MIXES], c = 1e30;
    for (int m = 0; m < MIXES; m++) best[m] = 1e30;
    for (int r = 0; r < ROUNDS; r++) {
        c = min(c, cycle_s());
        for (int m = 0; m < MIXES; m++) best[m] = min(best[m], mix[m]());
    }
    // Each block covers a chunk for 8 lane sets (8 rows of one group, or 4 of two).
    double per = 8 * c;
    printf("clock %.2f GHz (dependent adds)\n", 1e-9 / c);
    printf("cycles per 32-column chunk, group and activation row\n");
    printf("%-44s %6s %8s\n", "mix", "steps", "+finish");
    const char *name[3] = {"nibbles, one group x 8 rows (dots8)",
                           "nibbles, two groups x 4 rows (dots16 pair)",
                           "full bytes, one group x 8 rows (dots8)"};
    for (int k = 0; k < 3; k++)
        printf("%-44s %6.2f %8.2f\n", name[k], best[2 * k] / per, best[2 * k + 1] / per);
    return 0;
}
