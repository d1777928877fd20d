/* longhaul AdamW: decoupled weight decay (on 2-D weights only), bias-corrected moments, global
 * gradient-norm clipping, constant or warmup + cosine learning rate. Matches torch.optim.AdamW
 * with torch.nn.utils.clip_grad_norm_ applied first. The norm is summed over fixed chunks in a
 * fixed order, so it does not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/optim.h"

lh_adamw_config lh_adamw_defaults(void) {
  return (lh_adamw_config){.lr = 1e-3f,
                           .beta1 = 0.9f,
                           .beta2 = 0.95f,
                           .eps = 1e-8f,
                           .weight_decay = 0.1f,
                           .grad_clip = 1.0f,
                           .schedule = LH_SCHEDULE_CONSTANT,
                           .warmup_steps = 0,
                           .total_steps = 0,
                           .min_lr_ratio = 0.0f};
}

lh_err lh_adamw_create(const lh_config *model_cfg, const lh_adamw_config *cfg, lh_adamw **out) {
  *out = NULL;
  if (!(cfg->lr >= 0.0f) || !(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f) ||
      !(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f) || !(cfg->eps > 0.0f) ||
      !(cfg->weight_decay >= 0.0f) || cfg->warmup_steps < 0)
    return lh_errorf(LH_ERR_INVAL,
                     "adamw: need lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, "
                     "warmup >= 0 (got lr %g betas %g %g eps %g wd %g warmup %d)",
                     cfg->lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay,
                     cfg->warmup_steps);
  lh_adamw *o = lh_xcalloc(1, sizeof *o);
  o->cfg = *cfg;
  o->n = lh_config_n_params(model_cfg);
  o->m = lh_xmalloc_aligned(o->n * sizeof(float));
  o->v = lh_xmalloc_aligned(o->n * sizeof(float));
  o->decay = lh_xmalloc_aligned(o->n * sizeof(float));
  o->norm_partial = lh_xmalloc((o->n / LH_ADAMW_NORM_CHUNK + 1) * sizeof(double));
  memset(o->m, 0, o->n * sizeof(float));
  memset(o->v, 0, o->n * sizeof(float));
  int nt = lh_model_tensors(model_cfg, NULL, 0);
  lh_tensor_info *ti = lh_xmalloc((size_t)nt * sizeof *ti);
  lh_model_tensors(model_cfg, ti, nt);
  for (int i = 0; i < nt; i++) {
    float d = ti[i].ndim == 2 ? 1.0f : 0.0f;
    for (size_t j = 0; j < ti[i].numel; j++)
      o->decay[ti[i].offset + j] = d;
  }
  free(ti);
  *out = o;
  return LH_ERR_OK;
}

void lh_adamw_free(lh_adamw *o) {
  if (!o) return;
  free(o->m);
  free(o->v);
  free(o->decay);
  free(o->norm_partial);
  free(o);
}

float lh_adamw_lr(const lh_adamw_config *cfg, int64_t step) {
  if (cfg->warmup_steps > 0 && step < cfg->warmup_steps)
    return cfg->lr * (float)(step + 1) / (float)cfg->warmup_steps;
  if (cfg->schedule == LH_SCHEDULE_CONSTANT || cfg->total_steps <= cfg->warmup_steps)
    return cfg->lr;
  double progress = (double)(step - cfg->warmup_steps) / (cfg->total_steps - cfg->warmup_steps);
  if (progress > 1.0) progress = 1.0;
  double cosine = 0.5 * (1.0 + cos(M_PI * progress));
  return (float)(cfg->lr * (cfg->min_lr_ratio + (1.0 - cfg->min_lr_ratio) * cosine));
}

float lh_adamw_step(lh_adamw *o, float *params, float *grads) {
  return lh_adamw_step_scaled(o, params, grads, 1.0f);
}

float lh_adamw_step_scaled(lh_adamw *o, float *params, float *grads, float lr_scale) {
  size_t n = o->n, nchunks = (n + LH_ADAMW_NORM_CHUNK - 1) / LH_ADAMW_NORM_CHUNK;
  double *partial = o->norm_partial;
#pragma omp parallel for schedule(static)
  for (size_t ch = 0; ch < nchunks; ch++) {
    size_t a = ch * LH_ADAMW_NORM_CHUNK,
           b = a + LH_ADAMW_NORM_CHUNK < n ? a + LH_ADAMW_NORM_CHUNK : n;
    double s = 0.0;
    for (size_t i = a; i < b; i++)
      s += (double)grads[i] * grads[i];
    partial[ch] = s;
  }
  double sq = 0.0;
  for (size_t ch = 0; ch < nchunks; ch++)
    sq += partial[ch];
  float norm = (float)sqrt(sq);
  if (!isfinite(norm)) return norm; /* an inf or NaN gradient: leave everything as it was */
  float gscale = 1.0f;
  if (o->cfg.grad_clip > 0.0f && norm > o->cfg.grad_clip)
    gscale = o->cfg.grad_clip / (norm + 1e-6f);

  float lr = lh_adamw_lr(&o->cfg, o->step) * lr_scale;
  o->step++;
  float b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps, wd = o->cfg.weight_decay;
  float bc1 = 1.0f - powf(b1, (float)o->step), bc2 = 1.0f - powf(b2, (float)o->step);
  float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2);
  float *m = o->m, *v = o->v, *decay = o->decay;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float g = grads[i] * gscale;
    grads[i] = g;
    float p = params[i] * (1.0f - lr * wd * decay[i]);
    float mi = b1 * m[i] + (1.0f - b1) * g;
    float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] = p - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
  }
  return norm;
}
