/* bf16mm_bench: lh_bf16mm on the Qwen2.5-0.5B shape's products (q/k/v, o, gate/up, down, head)
 * at a given row count, for each kernel path the CPU runs, beside OpenBLAS's cblas_sgemm on the
 * same product with fp32 weights (the peer: what the removed fp32 copy bought) and beside a plain
 * read of the same bf16 weight bytes on the same threads (the ceiling of a 1-row product), in one
 * run. Prints one JSON line per path: GFLOP/s of each, the ratio to sgemm, the weight bytes per
 * second and their fraction of the plain read's.
 *   bf16mm_bench [--rows M] [--threads K] [--reps R] [--head] [--no-sgemm] */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/base.h"
#include "longhaul/tensor.h"

typedef struct {
  const char *what;
  int K, N;
} product;

/* one layer of the 0.5B shape (hidden 896, 14 + 2 + 2 heads of 64, MLP 4864); --head adds the
 * 151936-row tied head */
static const product layer[] = {
    {"qkv", 896, 1152}, {"o", 896, 896}, {"gate_up", 896, 9728}, {"down", 4864, 896}};
static const product head = {"head", 896, 151936};

/* the read peer: sums the first n bf16 of w as 32-bit words, 16 independent sums per thread
 * (integer adds: no floating-point latency chain), static chunks over the threads */
static uint32_t read_words(const uint16_t *w, size_t n) {
  const uint32_t *p = (const uint32_t *)w;
  size_t words = n / 2;
  uint32_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (size_t c = 0; c < words / 1024; c++) {
    uint32_t acc[16] = {0};
    for (size_t i = c * 1024; i < (c + 1) * 1024; i += 16)
#pragma omp simd
      for (int j = 0; j < 16; j++)
        acc[j] += p[i + j];
    for (int j = 0; j < 16; j++)
      total += acc[j];
  }
  return total;
}

int main(int argc, char **argv) {
  int M = 32, threads = 2, reps = 5;
  bool with_head = false, with_sgemm = true;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--rows") && i + 1 < argc)
      M = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--head"))
      with_head = true;
    else if (!strcmp(argv[i], "--no-sgemm"))
      with_sgemm = false;
    else {
      fprintf(stderr,
              "usage: bf16mm_bench [--rows M] [--threads K] [--reps R] [--head] [--no-sgemm]\n");
      return 2;
    }
  }
  if (M < 1 || threads < 1 || reps < 1) {
    fprintf(stderr, "bf16mm_bench: rows, threads and reps must be at least 1\n");
    return 2;
  }
  lh_set_threads(threads);
  product ps[5];
  int np = 0;
  for (int i = 0; i < 4; i++)
    ps[np++] = layer[i];
  if (with_head) ps[np++] = head;
  size_t maxw = 0, maxo = 0;
  for (int i = 0; i < np; i++) {
    size_t w = (size_t)ps[i].K * ps[i].N, o = (size_t)M * ps[i].N;
    maxw = w > maxw ? w : maxw;
    maxo = o > maxo ? o : maxo;
  }
  uint16_t *w = lh_try_malloc_huge(maxw * sizeof *w, "bf16mm_bench: weights"); /* as infer's */
  if (!w) {
    fprintf(stderr, "bf16mm_bench: %s\n", lh_last_error());
    return 1;
  }
  float *w32 = with_sgemm ? lh_xmalloc_aligned(maxw * sizeof *w32) : NULL;
  float *out = lh_xmalloc_aligned(maxo * 4);
  float *x = lh_xmalloc_aligned((size_t)M * 4864 * sizeof *x);
  uint32_t r = 2463534242u;
  for (size_t i = 0; i < maxw; i++) {
    r ^= r << 13, r ^= r >> 17, r ^= r << 5;
    w[i] = lh_bf16_from_f32(((float)(r >> 8) / 16777216.0f - 0.5f) * 0.1f);
  }
  if (with_sgemm) lh_f32_from_bf16_n(w32, w, maxw);
  for (size_t i = 0; i < (size_t)M * 4864; i++)
    x[i] = (float)(i % 17) * 0.01f - 0.08f;
  double flops = 0;
  for (int i = 0; i < np; i++)
    flops += 2.0 * M * ps[i].K * ps[i].N;
  /* best of reps (after one untimed warmup), interleaved: each rep times every path and both
   * peers once; index LH_KERNEL_COUNT is sgemm, LH_KERNEL_COUNT + 1 the plain read */
  enum { SGEMM = LH_KERNEL_COUNT, READ = LH_KERNEL_COUNT + 1 };
  double best[READ + 1];
  uint32_t check = 0;
  for (int k = 0; k <= READ; k++)
    best[k] = 1e30;
  for (int rep = -1; rep < reps; rep++)
    for (int k = 0; k <= READ; k++) {
      if (k < SGEMM && (k == LH_KERNEL_SCALAR || !lh_kernel_supported((lh_kernel)k)))
        continue; /* the scalar path is for other CPUs: too slow to time here */
      if (k == SGEMM && !with_sgemm) continue;
      if (k < SGEMM) lh_kernel_set((lh_kernel)k);
      double t0 = lh_time_now();
      for (int i = 0; i < np; i++) {
        if (k < SGEMM)
          lh_bf16mm(out, x, w, M, ps[i].K, ps[i].N, false);
        else if (k == SGEMM)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, ps[i].N, ps[i].K, 1.0f, x,
                      ps[i].K, w32, ps[i].K, 0.0f, out, ps[i].N);
        else
          check += read_words(w, (size_t)ps[i].K * ps[i].N);
      }
      double t = lh_time_now() - t0;
      if (rep >= 0) best[k] = t < best[k] ? t : best[k];
    }
  double peer = with_sgemm ? flops / best[SGEMM] / 1e9 : 0;
  double wbytes = flops / (2.0 * M) * 2.0, read_gbps = wbytes / best[READ] / 1e9;
  for (int k = 1; k < LH_KERNEL_COUNT; k++) {
    if (!lh_kernel_supported((lh_kernel)k)) continue;
    double g = flops / best[k] / 1e9;
    printf("{\"path\":\"%s\",\"rows\":%d,\"threads\":%d,\"head\":%s,\"gflops\":%.2f,"
           "\"weight_gbps\":%.2f,\"sgemm_fp32_gflops\":%.2f,\"ratio\":%.3f,"
           "\"read_gbps\":%.2f,\"read_fraction\":%.3f,\"check\":%u}\n",
           lh_kernel_name((lh_kernel)k), M, threads, with_head ? "true" : "false", g,
           wbytes / best[k] / 1e9, peer, with_sgemm ? g / peer : 0.0, read_gbps,
           wbytes / best[k] / 1e9 / read_gbps, (unsigned)check);
  }
  free(w);
  free(w32);
  free(out);
  free(x);
  return 0;
}
