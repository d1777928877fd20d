/* longhaul optim: AdamW with decoupled weight decay, global gradient-norm clipping, and a
 * learning-rate schedule (constant or warmup + cosine), over a model's parameter slab.
 * Ownership: the optimiser owns its two moment slabs; parameters and gradients belong to the
 * caller; lh_adamw_free accepts NULL. Thread safety: an optimiser is used by one thread at a
 * time; lh_adamw_step parallelises itself with OpenMP. */
#ifndef LONGHAUL_OPTIM_H
#define LONGHAUL_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/model.h"

typedef enum { LH_SCHEDULE_CONSTANT = 0, LH_SCHEDULE_COSINE = 1 } lh_schedule;

typedef struct lh_adamw_config {
  float lr;
  float beta1, beta2, eps;
  float weight_decay; /* applied to 2-D weights (matrices, embeddings) only */
  float grad_clip;    /* max global L2 norm; <= 0 disables */
  lh_schedule schedule;
  int warmup_steps; /* linear warmup: step s < W uses lr*(s+1)/W, full lr from step W-1 */
  int total_steps;  /* cosine decays to min_lr_ratio*lr at total_steps */
  float min_lr_ratio;
} lh_adamw_config;

/* lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, clip 1.0, constant, no warmup. */
lh_adamw_config lh_adamw_defaults(void);

#define LH_ADAMW_NORM_CHUNK 65536

typedef struct lh_adamw {
  lh_adamw_config cfg;
  size_t n;
  float *m;             /* (n) first moment slab */
  float *v;             /* (n) second moment slab */
  float *decay;         /* (n) 1 where weight decay applies, else 0 */
  double *norm_partial; /* (n / LH_ADAMW_NORM_CHUNK + 1) per-chunk sums of squares */
  int64_t step;         /* steps taken */
} lh_adamw;

/* Creates the optimiser for a model's parameter slab. */
lh_err lh_adamw_create(const lh_config *model_cfg, const lh_adamw_config *cfg, lh_adamw **out);
void lh_adamw_free(lh_adamw *opt);
/* Learning rate at (0-based) step. */
float lh_adamw_lr(const lh_adamw_config *cfg, int64_t step);
/* One update of params from grads (grads are clipped in place). Returns the global gradient
 * norm before clipping. A norm that is not finite (an inf or NaN among the gradients) changes
 * nothing: parameters, moments and the step count stay as they were (clipping would have turned
 * an inf into NaN weights). */
float lh_adamw_step(lh_adamw *opt, float *params, float *grads);
/* The same with this step's learning rate multiplied by lr_scale (> 0; weight decay too): the
 * ESS scaling of VCPO (lh_loss_config.ess_lr). */
float lh_adamw_step_scaled(lh_adamw *opt, float *params, float *grads, float lr_scale);

#endif
