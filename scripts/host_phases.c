// Whether this core runs at its own speed right now, window by window: on a cloud guest
// whose vCPUs share physical cores with other tenants (x86-64 with AVX2), the same kernel
// can run at two speeds in phases of tenths of a second to seconds, whatever this machine's
// own processes do.
// docs/performance.md (host B) quotes it; read a benchmark's spread against it.
//
//   gcc -O2 -mavx2 scripts/host_phases.c -o /tmp/host_phases && taskset -c 0 /tmp/host_phases [SECONDS] [--timeline]
//
// Each round times five windows back to back (the clock's ~1 ms, the others 20-400 µs):
//   clock  a chain of dependent scalar adds (one cycle each), carried through every
//          iteration: the core's clock in GHz;
//   reg    vpmaddubsw + vpaddw pairs into 8 sums, registers only: vector issue, per cycle;
//   L1     the same over a 16 KiB buffer (one load per multiply), per cycle;
//   L2     over 384 KiB, per cycle;
//   L3     over 4 MiB, per cycle.
// The summary gives each window's best (95th percentile), median and share of rounds within
// 10% of its best, then the rounds where L1 ran below 60% of its best ("slow rounds") and
// the other windows' medians in them against the rest. Per-cycle rates divide by the
// round's own clock window, so a slow round at an unchanged clock is lost issue and load
// bandwidth, not frequency.

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { CLOCK, REG, L1, L2, L3, KINDS };
static const char *NAMES[KINDS] = {"clock GHz", "reg vec/cycle", "L1 vec/cycle",
                                   "L2 vec/cycle", "L3 vec/cycle"};
static const long BYTES[KINDS] = {0, 0, 16L << 10, 384L << 10, 4L << 20};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Dependent adds: 4 per iteration, one cycle each.
static double clock_ghz(long n) {
    long x = 0;
    double t0 = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0" : "+r"(x));
    return 4.0 * n / (now() - t0) / 1e9;
}

// 8 vpmaddubsw of the same two registers per iteration, each added to its own sum; no memory.
static double reg_rate(long n) {
    __m256i b = _mm256_set1_epi8(2), c = _mm256_set1_epi8(3), a[8], p;
    for (int k = 0; k < 8; k++)
        a[k] = _mm256_set1_epi8((char)k);
    double t0 = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile(
            "vpmaddubsw %[b], %[c], %[p]\n\tvpaddw %[p], %[a0], %[a0]\n\t"
            "vpmaddubsw %[b], %[c], %[p]\n\tvpaddw %[p], %[a1], %[a1]\n\t"
            "vpmaddubsw %[b], %[c], %[p]\n\tvpaddw %[p], %[a2], %[a2]\n\t"
            "vpmaddubsw %[b], %[c], %[p]\n\tvpaddw %[p], %[a3], %[a3]\n\t"
            "vpmaddubsw %[b], %[c], %[p]\n\tvpaddw %[p], %[a4], %[a4]\n\t"
            "vpmaddubsw %[b], %[c], %[p]\n\tvpaddw %[p], %[a5], %[a5]\n\t"
            "vpmaddubsw %[b], %[c], %[p]\n\tvpaddw %[p], %[a6], %[a6]\n\t"
            "vpmaddubsw %[b], %[c], %[p]\n\tvpaddw %[p], %[a7], %[a7]"
            : [a0] "+x"(a[0]), [a1] "+x"(a[1]), [a2] "+x"(a[2]), [a3] "+x"(a[3]),
              [a4] "+x"(a[4]), [a5] "+x"(a[5]), [a6] "+x"(a[6]), [a7] "+x"(a[7]),
              [p] "=&x"(p)
            : [b] "x"(b), [c] "x"(c));
    return 8.0 * n / (now() - t0) / 1e9;
}

// The same step with its codes loaded from `bytes` of `buf`, swept `reps` times.
static double load_rate(const __m256i *buf, long bytes, long reps) {
    __m256i b = _mm256_set1_epi8(2), a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    long nvec = bytes / 32;
    double t0 = now();
    for (long r = 0; r < reps; r++)
        for (long i = 0; i < nvec; i += 4) {
            a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(_mm256_load_si256(buf + i), b));
            a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(_mm256_load_si256(buf + i + 1), b));
            a2 = _mm256_add_epi16(a2, _mm256_maddubs_epi16(_mm256_load_si256(buf + i + 2), b));
            a3 = _mm256_add_epi16(a3, _mm256_maddubs_epi16(_mm256_load_si256(buf + i + 3), b));
            // Keeps the compiler from hoisting the sweep out of the repetitions.
            __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3) : : "memory");
        }
    double dt = now() - t0;
    volatile int sink = _mm256_extract_epi16(_mm256_add_epi16(_mm256_add_epi16(a0, a1),
                                                              _mm256_add_epi16(a2, a3)), 0);
    (void)sink;
    return (double)nvec * reps / dt / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The q-quantile (0..1) of v's n values.
static double quantile(const double *v, long n, double q) {
    if (n == 0)
        return 0;
    double *c = malloc(n * sizeof *c);
    memcpy(c, v, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp);
    double m = c[(long)(q * (n - 1))];
    free(c);
    return m;
}

int main(int argc, char **argv) {
    double secs = 10;
    int timeline = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--timeline"))
            timeline = 1;
        else if ((secs = atof(argv[i])) <= 0) {
            fprintf(stderr, "usage: %s [SECONDS > 0] [--timeline]\n", argv[0]);
            return 2;
        }
    }
    __m256i *buf = aligned_alloc(64, BYTES[L3]);
    if (!buf)
        return 1;
    for (long i = 0; i < BYTES[L3]; i++)
        ((unsigned char *)buf)[i] = (unsigned char)(i * 7);
    long cap = (long)(secs * 2000) + 16, n = 0;
    double *v[KINDS];
    for (int k = 0; k < KINDS; k++)
        v[k] = malloc(cap * sizeof(double));

    double start = now(), end = start + secs;
    while (now() < end && n < cap) {
        double ghz = clock_ghz(750000);
        v[CLOCK][n] = ghz;
        v[REG][n] = reg_rate(200000) / ghz;
        for (int k = L1; k <= L3; k++) {
            long reps = (96L << 10) * 32 / BYTES[k]; // ~96 Ki vectors a window
            v[k][n] = load_rate(buf, BYTES[k], reps < 1 ? 1 : reps) / ghz;
        }
        if (timeline)
            printf("%7.3f s  %.2f GHz  reg %.2f  L1 %.2f  L2 %.2f  L3 %.2f\n", now() - start,
                   v[CLOCK][n], v[REG][n], v[L1][n], v[L2][n], v[L3][n]);
        n++;
    }

    printf("%ld rounds in %.1f s\n%-14s %7s %7s %s\n", n, now() - start, "window", "best",
           "median", "rounds within 10% of best");
    double best[KINDS];
    for (int k = 0; k < KINDS; k++) {
        // The 95th percentile: a window cut short by an interrupt inflates a per-cycle rate.
        best[k] = quantile(v[k], n, 0.95);
        long near = 0;
        for (long i = 0; i < n; i++)
            near += v[k][i] >= best[k] / 1.1;
        printf("%-14s %7.2f %7.2f %5.0f%%\n", NAMES[k], best[k], quantile(v[k], n, 0.5),
               100.0 * near / (n ? n : 1));
    }

    // Slow rounds: L1 below 60% of its best.
    double *slow = malloc(n * sizeof *slow), *rest = malloc(n * sizeof *rest);
    long ns = 0;
    for (long i = 0; i < n; i++)
        ns += v[L1][i] < 0.6 * best[L1];
    printf("slow rounds (L1 < 60%% of best): %ld of %ld; medians in them / in the rest:\n", ns, n);
    for (int k = 0; k < KINDS && ns > 0 && ns < n; k++) {
        long a = 0, b = 0;
        for (long i = 0; i < n; i++) {
            if (v[L1][i] < 0.6 * best[L1])
                slow[a++] = v[k][i];
            else
                rest[b++] = v[k][i];
        }
        double ms = quantile(slow, a, 0.5), mr = quantile(rest, b, 0.5);
        printf("%-14s %7.2f / %.2f = %.2f\n", NAMES[k], ms, mr, ms / mr);
    }
    return 0;
}
