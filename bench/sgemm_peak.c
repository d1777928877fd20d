/* sgemm_peak: the machine's practical fp32 matmul ceiling, as cblas_sgemm reaches it on the
 * shapes a training step of the `small` preset runs (2048 tokens, hidden 512, MLP 1408), plus
 * a large square one. Prints one JSON line; bench/train.sh divides longhaul's GFLOP/s by it.
 *   sgemm_peak [--threads K] [--reps R] */
#include <cblas.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/base.h"

typedef struct {
  const char *what;
  int m, n, k; /* C (m, n) = op(A) (m, k) * op(B) (k, n) */
  bool ta, tb; /* transposed operands, as the backward pass uses them */
} shape;

/* Row-major, as longhaul stores activations (tokens, features) and weights (out, in). */
static const shape shapes[] = {
    {"mlp_up_fwd", 2048, 1408, 512, false, true},   /* x (T,C) * W^T, W (F,C) */
    {"attn_proj_fwd", 2048, 512, 512, false, true}, /* x (T,C) * W^T, W (C,C) */
    {"mlp_down_dx", 2048, 1408, 512, false, false}, /* dY (T,C) * W, W (C,F) */
    {"mlp_up_dw", 1408, 512, 2048, true, false},    /* dY^T (F,T) * x (T,C) */
    {"square", 2048, 2048, 2048, false, false},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static float *filled(size_t n, uint32_t salt) {
  float *p = lh_xmalloc(n * sizeof *p);
  uint32_t x = 2463534242u ^ salt;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    p[i] = (float)((double)(x >> 8) / (double)(1u << 24)) - 0.5f;
  }
  return p;
}

static void usage(FILE *out) {
  fprintf(out, "usage: sgemm_peak [--threads K] [--reps R]\n"
               "Times cblas_sgemm on training-step shapes (best of R runs after a warmup) and "
               "prints one JSON line.\n");
}

static long parse_pos(const char *flag, const char *s) {
  char *end = NULL;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || *end || v < 1 || v > 4096) {
    fprintf(stderr, "sgemm_peak: %s: expected an integer from 1 to 4096, got \"%s\"\n", flag,
            s ? s : "");
    exit(2);
  }
  return v;
}

int main(int argc, char **argv) {
  int threads = 0, reps = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads")) {
      threads = (int)parse_pos("--threads", i + 1 < argc ? argv[++i] : NULL);
    } else if (!strcmp(argv[i], "--reps")) {
      reps = (int)parse_pos("--reps", i + 1 < argc ? argv[++i] : NULL);
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "sgemm_peak: unknown argument \"%s\"\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (threads > 0) {
    lh_set_threads(threads); /* OpenMP: the OpenMP OpenBLAS build follows it */
#ifdef OPENBLAS_VERSION
    openblas_set_num_threads(threads); /* the pthread build keeps its own pool */
#endif
  }
#ifdef OPENBLAS_VERSION
  int used = openblas_get_num_threads();
#else
  int used = lh_threads();
#endif

  double peak = 0.0, best_s[N_SHAPES], gflops[N_SHAPES];
  for (int s = 0; s < N_SHAPES; s++) {
    const shape *sh = &shapes[s];
    float *a = filled((size_t)sh->m * sh->k, 1u + (uint32_t)s);
    float *b = filled((size_t)sh->k * sh->n, 101u + (uint32_t)s);
    float *c = filled((size_t)sh->m * sh->n, 201u + (uint32_t)s);
    int lda = sh->ta ? sh->m : sh->k, ldb = sh->tb ? sh->k : sh->n;
    double best = 1e30;
    for (int r = -1; r < reps; r++) { /* r = -1: warmup (pages, thread pool, caches) */
      double t0 = lh_time_now();
      cblas_sgemm(CblasRowMajor, sh->ta ? CblasTrans : CblasNoTrans,
                  sh->tb ? CblasTrans : CblasNoTrans, sh->m, sh->n, sh->k, 1.0f, a, lda, b, ldb,
                  0.0f, c, sh->n);
      double dt = lh_time_now() - t0;
      if (r >= 0 && dt < best) best = dt;
    }
    if (best <= 0) best = 1e-9;
    best_s[s] = best;
    gflops[s] = 2.0 * sh->m * sh->n * sh->k / best / 1e9;
    if (gflops[s] > peak) peak = gflops[s];
    free(a);
    free(b);
    free(c);
  }

  printf("{\"threads\":%d,\"peak_gflops\":%.6g,\"reps\":%d,\"shapes\":[", used, peak, reps);
  for (int s = 0; s < N_SHAPES; s++) {
    const shape *sh = &shapes[s];
    printf("%s{\"name\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"op\":\"%c%c\",\"best_s\":%.6g,"
           "\"gflops\":%.6g}",
           s ? "," : "", sh->what, sh->m, sh->n, sh->k, sh->ta ? 'T' : 'N', sh->tb ? 'T' : 'N',
           best_s[s], gflops[s]);
  }
  printf("]}\n");
  return 0;
}
