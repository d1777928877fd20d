/* Internal to src/tensor: the per-path panels of lh_bf16mm. A panel computes the output columns
 * [n0, n1) of every row (out's rows are N floats apart: N is a stride, not the weight count);
 * lh_bf16mm_cols calls one on the calling thread. Every path sums K in blocks of
 * LH__BF16MM_KC: within a block, LANES fp32 sums where lane l takes k = 2l, then 2l + 1, of
 * every group of 2 * LANES k in order (the last group padded with zero products), then a fixed
 * horizontal sum, added to the output; so a row's result depends on K and the path only. */
#ifndef LONGHAUL_TENSOR_BF16MM_H
#define LONGHAUL_TENSOR_BF16MM_H

#include <stdbool.h>
#include <stdint.h>

/* K per block: the activation block (rows x KC fp32) stays in L2 while the panel's weight tiles
 * stream past it. */
#define LH__BF16MM_KC 1024

typedef void (*lh__bf16mm_panel_fn)(float *out, const float *x, const uint16_t *W, int M, int K,
                                    int N, int n0, int n1, bool accumulate);
/* Output columns per tile of each path: thread chunks are multiples of it. */
#define LH__BF16MM_NR_AVX2   3
#define LH__BF16MM_NR_AVX512 3

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LH__BF16MM_X86 1
void lh__bf16mm_panel_avx2(float *out, const float *x, const uint16_t *W, int M, int K, int N,
                           int n0, int n1, bool accumulate);
void lh__bf16mm_panel_avx512(float *out, const float *x, const uint16_t *W, int M, int K, int N,
                             int n0, int n1, bool accumulate);
#endif

#endif
