/* lh_bf16mm's AVX-512 path (F, BW, VL): 16 lanes, 32 k per step, tiles of 8 activation rows x 3
 * weight rows (24 accumulators in the 32 zmm registers). Compiled with -march=x86-64-v4
 * (CMakeLists.txt); bf16mm.c calls it only when cpuid says the CPU has these extensions. */
#include "bf16mm.h"

#ifdef LH__BF16MM_X86
#include <immintrin.h>

#define VF    __m512
#define LANES 16
#define MR    8
#define NR    LH__BF16MM_NR_AVX512
#define PANEL lh__bf16mm_panel_avx512

static inline __m512 vzero(void) {
  return _mm512_setzero_ps();
}
/* a 32-bit lane holding two bf16: the even-indexed one shifted into the high half, the
 * odd-indexed one with the low half masked off */
static inline __m512 widen(__m512i v, int odd) {
  return _mm512_castsi512_ps(odd ? _mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u))
                                 : _mm512_slli_epi32(v, 16));
}
static inline __m512 vload_w(const uint16_t *p, int odd) {
  return widen(_mm512_loadu_si512((const void *)p), odd);
}
static inline __m512 vload_w_tail(const uint16_t *p, int n, int odd) {
  return widen(_mm512_maskz_loadu_epi16((__mmask32)((1u << n) - 1), p), odd);
}
static inline __m512 vload_x(const float *p) {
  return _mm512_load_ps(p);
}
static inline void vpermute(float *dst, const float *src) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + LANES);
  _mm512_store_ps(dst, _mm512_permutex2var_ps(lo, even, hi));
  _mm512_store_ps(dst + LANES, _mm512_permutex2var_ps(lo, odd, hi));
}
static inline __m512 vkeep(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}
static inline __m512 vfma(__m512 a, __m512 b, __m512 c) {
  return _mm512_fmadd_ps(a, b, c);
}
/* halves, then quarters, ...: a fixed order (not _mm512_reduce_add_ps, whose order is the
 * compiler's) */
static inline float vsum(__m512 v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

#include "bf16mm_panel.h"
#endif
