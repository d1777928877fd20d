/* lh_bf16mm's AVX-512 path (F, BW, VL): 16 lanes, tiles of 8 activation rows x 3 weight rows
 * (24 accumulators in the 32 zmm registers). Compiled with -march=x86-64-v4 (CMakeLists.txt);
 * bf16mm.c calls it only when cpuid says the CPU has these extensions. */
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
static inline __m512 widen(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}
static inline __m512 vload_w(const uint16_t *p) {
  return widen(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m512 vload_w_tail(const uint16_t *p, int n) {
  return widen(_mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1), p));
}
static inline __m512 vload_x(const float *p) {
  return _mm512_loadu_ps(p);
}
static inline __m512 vload_x_tail(const float *p, int n) {
  return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
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
