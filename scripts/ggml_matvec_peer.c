// A same-run peer for Tessera's decode benchmarks: ggml's own CPU matrix×vector
// (`ggml_mul_mat` of an N×K quantized weight by one f32 row, what llama.cpp runs per
// projection at batch 1) timed the way `tessera bench` times a memory-bound op:
// - the weights rotate through enough copies to total ≥ 256 MiB, so each call reads
//   them from DRAM; the activation row stays the same (warm), as in a model;
// - one persistent ggml thread pool of T threads, so no call pays thread start-up;
// - the median of many calls, reported as time and as (weights + x + y bytes) / time.
//
// REPACK=1 in the environment puts the weights in the CPU backend's CPU_REPACK buffer
// type, as llama.cpp does at load time: Q4_0 and Q4_K become 8×8
// interleaved on AVX2 and run ggml's GEMV for that layout (the other formats here are
// not repacked on AVX2, so llama.cpp runs them in their file layout too). Without it
// the weights keep their file layout and run the per-row `vec_dot`.
//
// Build against a llama.cpp build tree (scripts/engine_vs_llamacpp.sh says where one
// comes from):
//   L=$LLAMA; B=$L/build/bin
//   gcc -O2 -o /tmp/ggml_peer scripts/ggml_matvec_peer.c -I$L/ggml/include
//       -L$B -lggml-base -lggml-cpu -lggml -Wl,-rpath,$B -lm          (one line)
//   /tmp/ggml_peer TYPE N K [THREADS] [CALLS]     TYPE: q4_0 q4_1 q8_0 q4_K q6_K
// Environment: REPACK=1, HOT=1, PER_GRAPH=G (below).
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// An environment flag is set when it holds anything but "" or "0".
static int flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

// A whole number in 1..2^30 or an exit with a message (atoi takes "12x" and overflows).
static int count_or_exit(const char *text, const char *what) {
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 1 || v > (1L << 30)) {
        fprintf(stderr, "%s must be a whole number in 1..2^30, not \"%s\"\n", what, text);
        exit(2);
    }
    return (int)v;
}

// malloc that ends the program with a message instead of returning NULL.
static void *alloc_or_exit(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory: %zu bytes for %s\n", bytes, what);
        exit(2);
    }
    return p;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static enum ggml_type type_named(const char *s) {
    static const struct {
        const char *name;
        enum ggml_type type;
    } known[] = {{"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1}, {"q8_0", GGML_TYPE_Q8_0},
                 {"q4_K", GGML_TYPE_Q4_K}, {"q6_K", GGML_TYPE_Q6_K}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(s, known[i].name) == 0) {
            return known[i].type;
        }
    }
    fprintf(stderr, "unknown type %s (q4_0 q4_1 q8_0 q4_K q6_K)\n", s);
    exit(2);
}

// Uniform in [-1, 1) from a 64-bit LCG: the values only need to be non-degenerate.
static float next_uniform(unsigned long long *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*state >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TYPE N K [THREADS] [CALLS]\n", argv[0]);
        return 2;
    }
    enum ggml_type type = type_named(argv[1]);
    int n = count_or_exit(argv[2], "N"), k = count_or_exit(argv[3], "K");
    int threads = argc > 4 ? count_or_exit(argv[4], "THREADS") : 2;
    int calls = argc > 5 ? count_or_exit(argv[5], "CALLS") : 20000;
    if (k % ggml_blck_size(type) != 0) {
        fprintf(stderr, "K must be a multiple of %lld\n", (long long)ggml_blck_size(type));
        return 2;
    }

    unsigned long long seed = 1;
    float *src = alloc_or_exit(sizeof(float) * (size_t)n * k, "the f32 weights");
    for (size_t i = 0; i < (size_t)n * k; i++) {
        src[i] = next_uniform(&seed);
    }
    size_t wbytes = ggml_row_size(type, k) * n;
    void *quantized = alloc_or_exit(wbytes, "the quantized weights");
    ggml_quantize_chunk(type, src, quantized, 0, n, k, NULL);

    // The rotated copies: tensors of their own, allocated from one buffer type, so a
    // repacking buffer repacks each (ggml_backend_tensor_set) as llama.cpp's loader does.
    // HOT=1 in the environment: one copy, the weights stay in cache (compute rate).
    size_t sets = flag("HOT") ? 1 : (256u << 20) / wbytes + 1;
    struct ggml_init_params wparams = {
        .mem_size = ggml_tensor_overhead() * (sets + 1), .mem_buffer = NULL, .no_alloc = true};
    struct ggml_context *wctx = ggml_init(wparams);
    struct ggml_tensor **copies = alloc_or_exit(sets * sizeof *copies, "the copies");
    for (size_t s = 0; s < sets; s++) {
        copies[s] = ggml_new_tensor_2d(wctx, type, k, n);
    }
    ggml_backend_buffer_type_t buft = ggml_backend_cpu_buffer_type();
    if (flag("REPACK")) {
        // What this build repacks on AVX2 (ggml_repack_get_optimal_repack_type); other
        // types in that buffer have no layout to go to, and ggml crashes on them.
        if (type != GGML_TYPE_Q4_0 && type != GGML_TYPE_Q4_K) {
            fprintf(stderr, "REPACK=1 is for q4_0 and q4_K (what ggml repacks on AVX2)\n");
            return 2;
        }
        ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        ggml_backend_dev_get_extra_bufts_t extra = (ggml_backend_dev_get_extra_bufts_t)
            ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
        ggml_backend_buffer_type_t *bufts = extra ? extra(dev) : NULL;
        buft = NULL;
        for (size_t i = 0; bufts && bufts[i]; i++) {
            if (strcmp(ggml_backend_buft_name(bufts[i]), "CPU_REPACK") == 0) {
                buft = bufts[i];
            }
        }
        if (!buft) {
            fprintf(stderr, "this ggml build has no CPU_REPACK buffer type\n");
            return 2;
        }
    }
    if (!ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft)) {
        fprintf(stderr, "could not allocate %zu copies of %zu bytes\n", sets, wbytes);
        return 2;
    }
    for (size_t s = 0; s < sets; s++) {
        ggml_backend_tensor_set(copies[s], quantized, 0, wbytes);
    }

    struct ggml_init_params params = {.mem_size = 16 << 20, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(params);
    // PER_GRAPH=G: G matmuls (each its own weights, the same x) in one graph, timed
    // together and reported per matmul. llama.cpp runs a whole token as one graph, so
    // its ops pay a barrier between them, not a graph launch each; G = 1 times a launch.
    int per_graph = getenv("PER_GRAPH") ? count_or_exit(getenv("PER_GRAPH"), "PER_GRAPH") : 1;
    if (per_graph > 64) {
        fprintf(stderr, "PER_GRAPH must be 1..64\n");
        return 2;
    }
    if (sets > 1 && (size_t)per_graph > sets) {
        per_graph = (int)sets;
    }
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, 1);
    for (int i = 0; i < k; i++) {
        ((float *)x->data)[i] = next_uniform(&seed);
    }
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    for (int j = 0; j < per_graph; j++) {
        ggml_build_forward_expand(graph, ggml_mul_mat(ctx, copies[sets > 1 ? j : 0], x));
    }
    void **data = alloc_or_exit(sets * sizeof *data, "the copies' data");
    for (size_t s = 0; s < sets; s++) {
        data[s] = copies[s]->data;
    }

    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *pool = ggml_threadpool_new(&tpp);
    struct ggml_cplan plan = ggml_graph_plan(graph, threads, pool);
    plan.work_data = alloc_or_exit(plan.work_size + 64, "ggml's work buffer");

    double *t = alloc_or_exit(sizeof(double) * calls, "the timings");
    for (int i = 0; i < calls; i++) {
        for (int j = 0; sets > 1 && j < per_graph; j++) {
            copies[j]->data = data[((size_t)i * per_graph + j) % sets];
        }
        double t0 = now_s();
        ggml_graph_compute(graph, &plan);
        t[i] = (now_s() - t0) / per_graph;
    }
    qsort(t, calls, sizeof(double), cmp_double);
    double median = t[calls / 2];
    double bytes = (double)wbytes + 4.0 * k + 4.0 * n;
    printf("ggml %s%s 1x%dx%d threads %d, %d per graph: median %.2f us p10 %.2f, %.1f GB/s "
           "(%zu sets)\n",
           argv[1], flag("REPACK") ? " (repacked)" : "", n, k, threads, per_graph, median * 1e6,
           t[calls / 10] * 1e6, bytes / median / 1e9, sets);
    ggml_threadpool_free(pool);
    ggml_free(ctx);
    ggml_free(wctx);
    return 0;
}
