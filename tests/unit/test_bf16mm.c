/* lh_bf16mm, every kernel path this CPU and build can run, against a reference computed here in
 * double from the same bf16 weights: odd shapes (rows 1..70, K and N not multiples of any tile
 * or of the K block), accumulation into the output, rows independent of the batch, results
 * independent of the thread count, the scalar path equal to the AVX2 one bit for bit, and
 * LH_KERNEL / lh_kernel_set choosing the path. Prints which paths ran. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "longhaul/tensor.h"

static uint64_t rng = 88172645463325252ull;
static float uniform(void) { /* [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct {
  int M, K, N;
  float *x, *out, *ref, *bound;
  uint16_t *w;
} problem;

/* ref = x @ w^T (+ 0.5 at every output when accumulating) in double, and a rigorous bound on
 * an fp32 sum of K products in lanes: (K + 8) * 2^-24 * sum |x w| (+ the added value's part). */
static void make_problem(problem *p, int M, int K, int N) {
  p->M = M, p->K = K, p->N = N;
  p->x = malloc((size_t)M * K * sizeof(float));
  p->w = malloc((size_t)N * K * sizeof(uint16_t));
  p->out = malloc((size_t)M * N * sizeof(float));
  p->ref = malloc((size_t)M * N * sizeof(float));
  p->bound = malloc((size_t)M * N * sizeof(float));
  for (size_t i = 0; i < (size_t)M * K; i++)
    p->x[i] = 3.0f * uniform();
  for (size_t i = 0; i < (size_t)N * K; i++)
    p->w[i] = lh_bf16_from_f32(0.2f * uniform());
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double s = 0, a = 0;
      for (int k = 0; k < K; k++) {
        double t = (double)p->x[(size_t)m * K + k] * lh_f32_from_bf16(p->w[(size_t)n * K + k]);
        s += t;
        a += fabs(t);
      }
      p->ref[(size_t)m * N + n] = (float)s;
      p->bound[(size_t)m * N + n] = (float)((K + 8) * ldexp(1.0, -24) * a + 1e-30);
    }
}

static void free_problem(problem *p) {
  free(p->x);
  free(p->w);
  free(p->out);
  free(p->ref);
  free(p->bound);
}

/* runs the product on the current path and checks every output against the reference; returns
 * the worst error in units of the bound */
static double check(problem *p, bool accumulate, const char *path) {
  for (size_t i = 0; i < (size_t)p->M * p->N; i++)
    p->out[i] = accumulate ? 0.5f : NAN; /* NaN: an output the kernel forgot shows */
  lh_bf16mm(p->out, p->x, p->w, p->M, p->K, p->N, accumulate);
  double worst = 0;
  for (int m = 0; m < p->M; m++)
    for (int n = 0; n < p->N; n++) {
      size_t i = (size_t)m * p->N + n;
      double want = p->ref[i] + (accumulate ? 0.5 : 0.0), err = fabs((double)p->out[i] - want);
      double bound = p->bound[i] + (accumulate ? ldexp(1.0, -24) * (fabs(want) + 0.5) : 0.0);
      if (!(err <= bound))
        fail_msg("%s: M %d K %d N %d%s: out[%d][%d] = %.9g, reference %.9g, error %.3g over the "
                 "bound %.3g",
                 path, p->M, p->K, p->N, accumulate ? " (accumulating)" : "", m, n, p->out[i], want,
                 err, bound);
      if (err / bound > worst) worst = err / bound;
    }
  return worst;
}

static void test_paths_against_reference(void **state) {
  (void)state;
  static const int shapes[][2] = {{1, 1},     {7, 5},    {16, 3},   {17, 4},    {37, 13}, {100, 67},
                                  {1029, 11}, {2100, 7}, {4864, 5}, {896, 130}, {9001, 7}};
  int ran = 0;
  for (int k = 0; k < LH_KERNEL_COUNT; k++) {
    if (!lh_kernel_supported((lh_kernel)k)) {
      printf("bf16mm: path %s: not supported here, skipped\n", lh_kernel_name((lh_kernel)k));
      continue;
    }
    assert_int_equal(lh_kernel_set((lh_kernel)k), LH_ERR_OK);
    assert_int_equal(lh_kernel_get(), k);
    const char *name = lh_kernel_name((lh_kernel)k);
    double worst = 0;
    int cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      int K = shapes[s][0], N = shapes[s][1];
      /* every row count 1..70 on the small shapes, a spread on the large ones */
      for (int M = 1; M <= 70; M += K * N > 20000 ? 23 : 1) {
        problem p;
        make_problem(&p, M, K, N);
        worst = fmax(worst, check(&p, false, name));
        worst = fmax(worst, check(&p, true, name));
        free_problem(&p);
        cases++;
      }
    }
    printf("bf16mm: path %s ran: %d shapes, worst error %.3f of the bound\n", name, cases, worst);
    ran++;
  }
  assert_true(ran >= 1);
}

/* A row's result does not depend on the rows around it, on M, or on the thread count: a lone
 * row takes other tiles and another loop order (whole weight rows, K up to 8 blocks; past that
 * the blocked order, K = 9001) than a batch, and must give the same bits. */
static void test_rows_and_threads_independent(void **state) {
  (void)state;
  int saved = lh_threads();
  static const int shapes[][2] = {{1100, 301}, {9001, 31}}; /* K, N */
  for (int k = 0; k < LH_KERNEL_COUNT; k++) {
    if (!lh_kernel_supported((lh_kernel)k)) continue;
    assert_int_equal(lh_kernel_set((lh_kernel)k), LH_ERR_OK);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      int K = shapes[s][0], N = shapes[s][1];
      problem p;
      make_problem(&p, 45, K, N);
      lh_set_threads(2);
      lh_bf16mm(p.out, p.x, p.w, 45, K, N, false);
      float *one = malloc((size_t)N * sizeof(float));
      for (int m = 0; m < 45; m += 11) {
        lh_set_threads(1);
        lh_bf16mm(one, p.x + (size_t)m * K, p.w, 1, K, N, false);
        if (memcmp(one, p.out + (size_t)m * N, (size_t)N * sizeof(float)))
          fail_msg("%s: K %d: row %d alone on 1 thread differs from the same row among 45 on 2",
                   lh_kernel_name((lh_kernel)k), K, m);
      }
      free(one);
      free_problem(&p);
    }
  }
  lh_set_threads(saved);
}

/* The scalar path sums in the AVX2 path's order: a CPU without AVX2 computes the same bits. */
static void test_scalar_equals_avx2(void **state) {
  (void)state;
  if (!lh_kernel_supported(LH_KERNEL_AVX2)) {
    printf("bf16mm: no AVX2 here, scalar vs avx2 skipped\n");
    return;
  }
  problem p;
  make_problem(&p, 9, 2053, 37);
  float *a = malloc((size_t)9 * 37 * sizeof(float));
  assert_int_equal(lh_kernel_set(LH_KERNEL_SCALAR), LH_ERR_OK);
  lh_bf16mm(a, p.x, p.w, 9, 2053, 37, false);
  assert_int_equal(lh_kernel_set(LH_KERNEL_AVX2), LH_ERR_OK);
  lh_bf16mm(p.out, p.x, p.w, 9, 2053, 37, false);
  for (int i = 0; i < 9 * 37; i++)
    if (a[i] != p.out[i]) fail_msg("output %d: scalar %.9g, avx2 %.9g", i, a[i], p.out[i]);
  free(a);
  free_problem(&p);
}

static void test_set_refuses_unknown(void **state) {
  (void)state;
  lh_kernel before = lh_kernel_get();
  assert_int_equal(lh_kernel_set(LH_KERNEL_COUNT), LH_ERR_INVAL);
  assert_int_equal(lh_kernel_set((lh_kernel)-1), LH_ERR_INVAL);
  assert_int_equal(lh_kernel_get(), before);
  assert_string_equal(lh_kernel_name(LH_KERNEL_AVX512), "avx512");
  assert_string_equal(lh_kernel_name(LH_KERNEL_COUNT), "unknown");
}

/* With LH_KERNEL set (by ctest for this executable: see tests/CMakeLists.txt), the first product
 * runs the named path; this runs first, before any lh_kernel_set. */
static void test_env_chooses(void **state) {
  (void)state;
  const char *want = getenv("LH_KERNEL");
  lh_kernel got = lh_kernel_get();
  printf("bf16mm: LH_KERNEL=%s, chosen path %s\n", want ? want : "(unset)", lh_kernel_name(got));
  if (want && !strcmp(want, "scalar")) assert_int_equal(got, LH_KERNEL_SCALAR);
  if (!want || !strcmp(want, "auto")) {
    lh_kernel best = lh_kernel_supported(LH_KERNEL_AVX512) ? LH_KERNEL_AVX512
                     : lh_kernel_supported(LH_KERNEL_AVX2) ? LH_KERNEL_AVX2
                                                           : LH_KERNEL_SCALAR;
    assert_int_equal(got, best);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env_chooses),
      cmocka_unit_test(test_paths_against_reference),
      cmocka_unit_test(test_rows_and_threads_independent),
      cmocka_unit_test(test_scalar_equals_avx2),
      cmocka_unit_test(test_set_refuses_unknown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
