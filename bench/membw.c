/* membw: the machine's practical memory read bandwidth, the ceiling of batch-1 decoding (every
 * decode step reads all the weights once). Sums a buffer larger than any cache with OpenMP, read
 * as fp32 and read as bf16 widened to fp32 (what the bf16 decode kernels do); best of R passes
 * after a warmup. Prints one JSON line; bench/generate.sh divides longhaul's decode weight
 * traffic by it. The buffer is allocated as longhaul allocates the weights (lh_try_malloc_huge:
 * transparent huge pages where the kernel gives them), so both stream through the same pages.
 *   membw [--threads K] [--mib M] [--reps R] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/base.h"

#define LANES 64          /* independent accumulators: a sum is not one latency-bound chain */
#define CHUNK (64u << 10) /* bytes per unit of work; the buffer is a whole number of them */

/* Every 32-bit word is two bf16 values 1.0..1.5 and, read as fp32, a float near 1.0: both
 * readings are normal numbers (no denormal slow paths). */
static void fill(uint32_t *w, size_t n_words) {
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < n_words / (CHUNK / 4); c++) { /* first touch by the reading thread */
    for (size_t i = c * (CHUNK / 4); i < (c + 1) * (CHUNK / 4); i++) {
      uint32_t hi = 0x3F80u + (uint32_t)(i & 0x3F), lo = 0x3F80u + (uint32_t)((i >> 6) & 0x3F);
      w[i] = hi << 16 | lo;
    }
  }
}

static double sum_f32(const float *x, size_t n_chunks) {
  double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (size_t c = 0; c < n_chunks; c++) {
    const float *p = x + c * (CHUNK / 4);
    float acc[LANES] = {0};
    for (size_t i = 0; i < CHUNK / 4; i += LANES)
#pragma omp simd
      for (int j = 0; j < LANES; j++)
        acc[j] += p[i + j];
    float s = 0;
    for (int j = 0; j < LANES; j++)
      s += acc[j];
    total += s;
  }
  return total;
}

static inline float bf16_to_f32(uint16_t b) {
  uint32_t w = (uint32_t)b << 16;
  float f;
  memcpy(&f, &w, sizeof f);
  return f;
}

static double sum_bf16(const uint16_t *x, size_t n_chunks) {
  double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (size_t c = 0; c < n_chunks; c++) {
    const uint16_t *p = x + c * (CHUNK / 2);
    float acc[LANES] = {0};
    for (size_t i = 0; i < CHUNK / 2; i += LANES)
#pragma omp simd
      for (int j = 0; j < LANES; j++)
        acc[j] += bf16_to_f32(p[i + j]);
    float s = 0;
    for (int j = 0; j < LANES; j++)
      s += acc[j];
    total += s;
  }
  return total;
}

static void usage(FILE *out) {
  fprintf(out, "usage: membw [--threads K] [--mib M] [--reps R]\n"
               "Sums an M MiB buffer (default 1024) as fp32 and as bf16, best of R passes "
               "(default 5) after a warmup,\nand prints one JSON line with the read bandwidths "
               "in GB/s (1e9 bytes per second).\n");
}

static long parse_pos(const char *flag, const char *s, long max) {
  char *end = NULL;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || *end || v < 1 || v > max) {
    fprintf(stderr, "membw: %s: expected an integer from 1 to %ld, got \"%s\"\n", flag, max,
            s ? s : "");
    exit(2);
  }
  return v;
}

int main(int argc, char **argv) {
  int threads = 0, reps = 5;
  long mib = 1024;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads")) {
      threads = (int)parse_pos("--threads", i + 1 < argc ? argv[++i] : NULL, 4096);
    } else if (!strcmp(argv[i], "--mib")) {
      mib = parse_pos("--mib", i + 1 < argc ? argv[++i] : NULL, 1L << 20);
    } else if (!strcmp(argv[i], "--reps")) {
      reps = (int)parse_pos("--reps", i + 1 < argc ? argv[++i] : NULL, 1000);
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "membw: unknown argument \"%s\"\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  lh_set_threads(threads);
  size_t bytes = (size_t)mib << 20, n_chunks = bytes / CHUNK;
  /* in huge pages where the kernel gives them, as longhaul holds the weights */
  uint32_t *buf = lh_try_malloc_huge(bytes, "membw: the buffer");
  if (!buf) {
    fprintf(stderr, "membw: %s\n", lh_last_error());
    return 1;
  }
  fill(buf, bytes / 4);

  double best_f32 = 1e30, best_bf16 = 1e30, check = 0;
  for (int r = -1; r < reps; r++) { /* r = -1: warmup (thread pool, TLB) */
    double t0 = lh_time_now();
    check += sum_f32((const float *)buf, n_chunks);
    double t1 = lh_time_now();
    check += sum_bf16((const uint16_t *)buf, n_chunks);
    double t2 = lh_time_now();
    if (r >= 0) {
      if (t1 - t0 < best_f32) best_f32 = t1 - t0;
      if (t2 - t1 < best_bf16) best_bf16 = t2 - t1;
    }
  }
  free(buf);
  if (!(check > 0)) { /* every value is positive: a zero sum means the loops did not run */
    fprintf(stderr, "membw: checksum %g, expected a positive sum\n", check);
    return 1;
  }
  printf("{\"threads\":%d,\"read_gbps\":%.4g,\"bf16_read_gbps\":%.4g,\"bytes\":%zu,\"reps\":%d}\n",
         lh_threads(), (double)bytes / best_f32 / 1e9, (double)bytes / best_bf16 / 1e9, bytes,
         reps);
  return 0;
}
