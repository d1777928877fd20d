/* lh_bf16mm: fp32 activations times bf16 weights without an fp32 copy of the weights. This file
 * holds the runtime dispatch (cpuid, LH_KERNEL), the threading over output columns and the
 * portable scalar path; the SIMD paths are bf16mm_avx2.c and bf16mm_avx512.c, each compiled
 * for its own instruction set so that one binary runs on any x86-64 CPU. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bf16mm.h"
#include "longhaul/tensor.h"

static const char *const kernel_names[LH_KERNEL_COUNT] = {"scalar", "avx2", "avx512"};

const char *lh_kernel_name(lh_kernel k) {
  return k >= 0 && k < LH_KERNEL_COUNT ? kernel_names[k] : "unknown";
}

bool lh_kernel_supported(lh_kernel k) {
  switch (k) {
  case LH_KERNEL_SCALAR:
    return true;
#ifdef LH__BF16MM_X86
  case LH_KERNEL_AVX2:
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  case LH_KERNEL_AVX512:
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#endif
  default:
    return false;
  }
}

static lh_kernel best_kernel(void) {
  if (lh_kernel_supported(LH_KERNEL_AVX512)) return LH_KERNEL_AVX512;
  if (lh_kernel_supported(LH_KERNEL_AVX2)) return LH_KERNEL_AVX2;
  return LH_KERNEL_SCALAR;
}

static lh_kernel kernel_from_env(void) {
  const char *e = getenv("LH_KERNEL");
  if (!e || !*e || !strcmp(e, "auto")) return best_kernel();
  for (int k = 0; k < LH_KERNEL_COUNT; k++)
    if (!strcmp(e, kernel_names[k])) {
      if (lh_kernel_supported((lh_kernel)k)) return (lh_kernel)k;
      lh_log(LH_LOG_WARN, "LH_KERNEL=%s: this CPU or build cannot run it; using %s", e,
             kernel_names[best_kernel()]);
      return best_kernel();
    }
  lh_log(LH_LOG_WARN, "LH_KERNEL=%s: expected scalar, avx2, avx512 or auto; using %s", e,
         kernel_names[best_kernel()]);
  return best_kernel();
}

static _Atomic int chosen = -1;

lh_kernel lh_kernel_get(void) {
  int k = atomic_load(&chosen);
  if (k < 0) {
    int want = (int)kernel_from_env(), none = -1;
    /* a concurrent first call chose the same from the same environment */
    atomic_compare_exchange_strong(&chosen, &none, want);
    k = atomic_load(&chosen);
  }
  return (lh_kernel)k;
}

lh_err lh_kernel_set(lh_kernel k) {
  if (k < 0 || k >= LH_KERNEL_COUNT || !lh_kernel_supported(k))
    return lh_errorf(LH_ERR_INVAL, "bf16mm: kernel path %s (%d): this CPU or build cannot run it",
                     lh_kernel_name(k), (int)k);
  atomic_store(&chosen, (int)k);
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- scalar path */

#define SCALAR_LANES 8
#define SCALAR_GROUP (2 * SCALAR_LANES)

/* The AVX2 path's order exactly (8 lanes of fused multiply-adds over each K block, lane l taking
 * k = 2l and 2l + 1 of every group of 16, the last group padded with zero products; then halves,
 * quarters, pairs), so the two give the same bits: a CPU without AVX2 computes what one with it
 * does. */
static void panel_scalar(float *out, const float *x, const uint16_t *W, int M, int K, int N, int n0,
                         int n1, bool accumulate) {
  for (int k0 = 0; k0 < K; k0 += LH__BF16MM_KC) {
    int kc = K - k0 < LH__BF16MM_KC ? K - k0 : LH__BF16MM_KC;
    int kp = (kc + SCALAR_GROUP - 1) / SCALAR_GROUP * SCALAR_GROUP;
    bool add = accumulate || k0 > 0;
    for (int n = n0; n < n1; n++) {
      const uint16_t *w = W + (size_t)n * K + k0;
      for (int m = 0; m < M; m++) {
        const float *xm = x + (size_t)m * K + k0;
        float lane[SCALAR_LANES] = {0};
        for (int k = 0; k < kp; k++) {
          float *l = &lane[k % SCALAR_GROUP / 2];
          *l = k < kc ? fmaf(xm[k], lh_bf16f(w[k]), *l) : fmaf(0.0f, 0.0f, *l);
        }
        for (int h = SCALAR_LANES / 2; h > 0; h /= 2)
          for (int i = 0; i < h; i++)
            lane[i] += lane[i + h];
        float *o = out + (size_t)m * N + n;
        *o = add ? *o + lane[0] : lane[0];
      }
    }
  }
}

/* ---------------------------------------------------------------- threading */

/* the chosen path's panel and its tile width */
static lh__bf16mm_panel_fn chosen_panel(int *nr) {
  switch (lh_kernel_get()) {
#ifdef LH__BF16MM_X86
  case LH_KERNEL_AVX2:
    *nr = LH__BF16MM_NR_AVX2;
    return lh__bf16mm_panel_avx2;
  case LH_KERNEL_AVX512:
    *nr = LH__BF16MM_NR_AVX512;
    return lh__bf16mm_panel_avx512;
#endif
  default:
    *nr = 1;
    return panel_scalar;
  }
}

/* fewer multiply-adds than this (a few microseconds of one thread's streaming) stay on one
 * thread */
#define SHARE_MIN 65536

void lh_bf16mm_share(int M, int K, int N, int t, int T, int *n0, int *n1) {
  int nr;
  chosen_panel(&nr);
  if ((size_t)(M > 0 ? M : 0) * (size_t)(K > 0 ? K : 0) * (size_t)(N > 0 ? N : 0) < SHARE_MIN)
    T = 1;
  if (t >= T || N <= 0) {
    *n0 = *n1 = N > 0 ? N : 0;
    return;
  }
  /* static chunks of whole tiles */
  long tiles = (N + nr - 1) / nr, per = (tiles + T - 1) / T;
  long a = (long)t * per * nr, b = (long)(t + 1) * per * nr;
  *n0 = (int)(a < N ? a : N);
  *n1 = (int)(b < N ? b : N);
}

void lh_bf16mm_cols(float *out, int ldo, const float *x, const uint16_t *W, int M, int K, int n0,
                    int n1, bool accumulate) {
  if (M <= 0 || n0 >= n1) return;
  if (K <= 0) { /* an empty sum */
    if (!accumulate)
      for (int m = 0; m < M; m++)
        memset(out + (size_t)m * ldo + n0, 0, (size_t)(n1 - n0) * sizeof(float));
    return;
  }
  int nr;
  lh__bf16mm_panel_fn panel = chosen_panel(&nr);
  panel(out, x, W, M, K, ldo, n0, n1, accumulate);
}

void lh_bf16mm(float *out, const float *x, const uint16_t *W, int M, int K, int N,
               bool accumulate) {
  if (M <= 0 || N <= 0) return;
  size_t work = (size_t)N * (size_t)(K > 0 ? K : 0) * (size_t)M;
  (void)work; /* read only by the OpenMP pragma: unused in a build without OpenMP */
#pragma omp parallel if (work >= SHARE_MIN)
  {
    int t = 0, T = 1, n0, n1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    T = omp_get_num_threads();
#endif
    lh_bf16mm_share(M, K, N, t, T, &n0, &n1);
    lh_bf16mm_cols(out, N, x, W, M, K, n0, n1, accumulate);
  }
}
