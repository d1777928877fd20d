/* lh_bf16mm's AVX2 + FMA path: 8 lanes, 16 k per step, tiles of 4 activation rows x 3 weight
 * rows (12 accumulators in the 16 ymm registers). Compiled with -march=haswell (CMakeLists.txt), so
 * no AVX-512 instruction can appear in it even when the rest of the build targets this machine;
 * bf16mm.c calls it only when cpuid says the CPU has AVX2 and FMA. */
#include <string.h>

#include "bf16mm.h"

#ifdef LH__BF16MM_X86
#include <immintrin.h>

#define VF    __m256
#define LANES 8
#define MR    4
#define NR    LH__BF16MM_NR_AVX2
#define PANEL lh__bf16mm_panel_avx2

static inline __m256 vzero(void) {
  return _mm256_setzero_ps();
}
/* 16 bf16: the even-indexed ones shifted into the high half, the odd-indexed ones with the low
 * half masked off */
static inline void widen2(__m256i v, __m256 *even, __m256 *odd) {
  *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
}
static inline void vload_w2(const uint16_t *p, __m256 *even, __m256 *odd) {
  widen2(_mm256_loadu_si256((const __m256i *)p), even, odd);
}
static inline void vload_w2_tail(const uint16_t *p, int n, __m256 *even, __m256 *odd) {
  uint16_t b[2 * LANES] = {0};
  memcpy(b, p, (size_t)n * sizeof *p);
  vload_w2(b, even, odd);
}
static inline __m256 vload_x(const float *p) {
  return _mm256_load_ps(p);
}
static inline __m256 vfma(__m256 a, __m256 b, __m256 c) {
  return _mm256_fmadd_ps(a, b, c);
}
/* halves, then quarters, then pairs: the scalar path's order */
static inline float vsum(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

#include "bf16mm_panel.h"
#endif
