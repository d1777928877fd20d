/* longhaul tensor: CPU kernels for the decoder, forward and backward, and bf16 conversion.
 * All arrays are row-major fp32 unless named otherwise. Training matmuls go through cblas_sgemm,
 * inference's bf16-weight products through lh_bf16mm (src/tensor/bf16mm*.c); other
 * loops use OpenMP over rows. The reductions written here run in a fixed order and do not
 * depend on the thread count; OpenBLAS's threaded products do, in their last bits. No kernel
 * allocates. */
#ifndef LONGHAUL_TENSOR_H
#define LONGHAUL_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

/* exp(x) for x in [-87, 88] with about 2 ulp of error, branch-free so loops vectorise
 * (Cody-Waite range reduction, degree-6 polynomial). Inputs outside that range are clamped:
 * exp(-inf) gives about 1e-38 rather than 0, which no softmax here can tell apart; NaN gives
 * NaN. */
static inline float lh_expf(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float n = __builtin_floorf(x * 1.44269504f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  n = n == n ? n : 0.0f; /* NaN in: p is NaN already; keep the cast below defined */
  union {
    uint32_t u;
    float f;
  } scale = {.u = (uint32_t)((int32_t)n + 127) << 23};
  return p * scale.f;
}

/* bf16 <-> f32. lh_bf16_from_f32 rounds to nearest even; NaN stays NaN (quiet). */
uint16_t lh_bf16_from_f32(float x);
float lh_f32_from_bf16(uint16_t b);
void lh_bf16_from_f32_n(uint16_t *dst, const float *src, size_t n);
void lh_f32_from_bf16_n(float *dst, const uint16_t *src, size_t n);
/* lh_f32_from_bf16 inline, for loops that widen as they go */
static inline float lh_bf16f(uint16_t b) {
  union {
    uint32_t u;
    float f;
  } v = {.u = (uint32_t)b << 16};
  return v.f;
}

/* Products of fp32 activations with bf16 weights, for inference: out (M, N) = x (M, K) @ W^T
 * (+ out when accumulate), W (N, K) bf16 in Hugging Face Linear layout. Weights are widened to
 * fp32 in registers (no fp32 copy anywhere) and every sum runs in fp32, in an order fixed by K
 * and the kernel path alone: a row's result does not depend on M, on the other rows, or on the
 * thread count (OpenMP over output columns, static chunks). Allocates nothing on the heap (each
 * thread permutes activations into 34 KiB of its stack). */
void lh_bf16mm(float *out, const float *x, const uint16_t *W, int M, int K, int N, bool accumulate);
/* The same product split by hand, for a team of threads that is already running (one parallel
 * region over a whole forward, lh_barrier between its steps): thread t of T computes the output
 * columns [*n0, *n1) that lh_bf16mm_share gives it (static chunks of whole tiles; a product
 * under 65536 multiply-adds goes whole to thread 0 and the others get an empty range), with
 * lh_bf16mm_cols. Every column's sums are lh_bf16mm's, bit for bit. lh_bf16mm_cols writes
 * columns [n0, n1) of out, whose rows are ldo floats apart, on the calling thread. */
void lh_bf16mm_share(int M, int K, int N, int t, int T, int *n0, int *n1);
void lh_bf16mm_cols(float *out, int ldo, const float *x, const uint16_t *W, int M, int K, int n0,
                    int n1, bool accumulate);

/* The kernel paths. Paths differ in the order of their fp32 sums (8 or 16 lanes), so their
 * results differ in the last bits (a verifier calibrates its logit tolerance across them). */
typedef enum {
  LH_KERNEL_SCALAR, /* portable C, any CPU */
  LH_KERNEL_AVX2,   /* AVX2 + FMA (x86-64 since 2013) */
  LH_KERNEL_AVX512, /* AVX-512 F, BW and VL */
  LH_KERNEL_COUNT
} lh_kernel;
/* "scalar", "avx2", "avx512". */
const char *lh_kernel_name(lh_kernel k);
/* Whether this binary has the path and this CPU (cpuid, at run time) can run it. */
bool lh_kernel_supported(lh_kernel k);
/* The path lh_bf16mm uses. On first use it is chosen once: the environment variable LH_KERNEL
 * (scalar, avx2, avx512 or auto) if set, else the fastest exact path the CPU
 * supports (avx512, then avx2, then scalar). A LH_KERNEL this CPU cannot run, or an unknown
 * name, is logged as a warning and auto is used. */
lh_kernel lh_kernel_get(void);
/* Forces a path (tests, calibration, LH_KERNEL in a driver). A path lh_kernel_supported denies
 * is LH_ERR_INVAL with a message naming it, and changes nothing. Not while a product runs. */
lh_err lh_kernel_set(lh_kernel k);

/* out (M,N) = beta*out + x (M,K) @ w^T, w (N,K) as Hugging Face Linear weights store it. */
void lh_matmul_xwt(float *out, const float *x, const float *w, int M, int K, int N, float beta);
/* dx (M,K) = beta*dx + dout (M,N) @ w (N,K) */
void lh_matmul_dx(float *dx, const float *dout, const float *w, int M, int K, int N, float beta);
/* dw (N,K) += dout^T (N,M) @ x (M,K) */
void lh_matmul_dw(float *dw, const float *dout, const float *x, int M, int K, int N);

/* RMSNorm over rows of width C: out = x * rstd * w, rstd = 1/sqrt(mean(x^2)+eps).
 * rstd (M) is saved for backward (may be NULL in inference). */
void lh_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int M, int C,
                        float eps);
/* dx (M,C) += d/dx, dw (C) += d/dw. */
void lh_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                         const float *rstd, int M, int C);

/* Rotary tables for positions [0, max_pos): cos/sin (max_pos, hd/2), Hugging Face rotate-half
 * convention: angle = pos * inv_freq[i] in fp32, inv_freq (hd/2) from lh_config_rope_inv_freq
 * (theta^(-2i/hd), or its llama3-scaled form). */
void lh_rope_tables(float *cos_t, float *sin_t, int max_pos, int hd, const float *inv_freq);
/* Applies (inverse=0) or un-applies (inverse=1, for backward) the rotation in place to one
 * token's heads: x (n_heads, hd) at position pos. */
void lh_rope_apply(float *x, int n_heads, int hd, const float *cos_t, const float *sin_t, int pos,
                   int inverse);

/* SwiGLU over M rows: h (M, F) = silu(gu[:, :F]) * gu[:, F:], gu (M, 2F) holding the gate and
 * up projections side by side. */
void lh_swiglu_forward(float *h, const float *gu, int M, int F);
/* The same for the columns [j0, j1) of every row only, on the calling thread (each element as
 * lh_swiglu_forward computes it): for a team whose threads each own some columns. */
void lh_swiglu_cols(float *h, const float *gu, int M, int F, int j0, int j1);
/* dgu (M, 2F) from dh (M, F) (overwrites). */
void lh_swiglu_backward(float *dgu, const float *dh, const float *gu, int M, int F);

/* Causal attention of one sequence of T tokens for the query heads of one kv head `g` (GQA:
 * query heads g*G .. g*G+G-1, G = H/KV). q (T, H*hd), k and v (T, KV*hd) are column blocks of
 * rows `ld` floats apart (one fused qkv buffer); out (T, H*hd) is dense. probs (H, T, T) holds
 * the softmax rows of this sequence for backward. Scale 1/sqrt(hd). Single-threaded:
 * callers parallelise over (sequence, kv head). */
void lh_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                          int ld, int T, int H, int KV, int hd, int g);
/* Gradients for the same slice. dq, dk, dv have row stride ld like q, k, v; the columns of
 * the group's query heads in dq and of head g in dk, dv are overwritten. dout (T, H*hd) is
 * dense. scratch: T*T floats. */
void lh_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                           const float *q, const float *k, const float *v, int ld, int T, int H,
                           int KV, int hd, int g, float *scratch);

#endif
