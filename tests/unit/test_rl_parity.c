/* Parity of the policy loss and of one RL update against PyTorch (tests/ref/README.md).
 * tests/fixtures/rl/loss.safetensors (tests/ref/loss_ref.py): loss cases with float64 torch's
 * loss, autograd dlogp and statistics. tests/fixtures/rl/update/ (tests/ref/rl_update_ref.py):
 * a tiny model, a batch, and the weights, first Adam moments and statistics that float64 torch
 * (torch.optim.AdamW, clip_grad_norm_) reaches after one lh_rl_update in each of several
 * settings. Every value is compared; the worst errors are printed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"
#include "longhaul/model.h"
#include "longhaul/rl.h"

static lh_safetensors *open_ref(const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "%s/tests/fixtures/%s", LH_SOURCE_DIR, rel);
  lh_safetensors *st = NULL;
  if (lh_safetensors_open(path, &st)) fail_msg("%s", lh_last_error());
  return st;
}

/* Worst error of one quantity over a fixture: the largest absolute error, and the element
 * with the largest error relative to its tolerance (where: case or scenario, and tensor). */
typedef struct {
  const char *what;
  double max_err;
  double ratio, err, tol;
  char where[200];
  int index; /* -1 for a scalar */
} worst;

static void track(worst *w, double got, double want, double tol, const char *where, int index) {
  double err = fabs(got - want);
  if (err != err) err = INFINITY; /* NaN */
  double ratio = err == 0.0 ? 0.0 : err / tol;
  if (!w->where[0] || ratio > w->ratio) {
    w->ratio = ratio, w->err = err, w->tol = tol, w->index = index;
    snprintf(w->where, sizeof w->where, "%s", where);
  }
  if (err > w->max_err) w->max_err = err;
  if (!(err <= tol)) {
    char at[32] = "";
    if (index >= 0) snprintf(at, sizeof at, "[%d]", index);
    fail_msg("%s: %s%s: got %.9g, torch %.9g (error %.3e > tolerance %.3e)", where, w->what, at,
             got, want, err, tol);
  }
}

static void report(const worst *w) {
  char at[32] = "";
  if (w->index >= 0) snprintf(at, sizeof at, "[%d]", w->index);
  printf("  %-14s max error %.3e; closest to its tolerance: %.3e of %.3e at %s%s\n", w->what,
         w->max_err, w->err, w->tol, w->where, at);
}

/* ---------------------------------------------------------------- the policy loss */

/* One row of case.int and of case.float, in the order tests/ref/loss_ref.py writes them. */
typedef struct {
  int32_t kind, agg, prox_mask, has_old, has_ref, n_seqs;
  int32_t seq_row;     /* the case's first row in seq_start */
  int32_t first_token; /* the case's first token in weight, adv, ... */
} loss_case;
typedef struct {
  float eps_low, eps_high, C, lo, hi, m2po_tau, constant, kl_beta;
  float m2_tau, seq_cap, tv_delta, tv_kl, oapl_beta1, oapl_beta2;
} loss_case_cfg;
_Static_assert(sizeof(loss_case) == 8 * 4 && sizeof(loss_case_cfg) == 14 * 4, "no padding");

/* case.stats columns; the M2PO threshold (exact) is the next to last. */
static const char *const loss_stat_names[] = {
    "loss",      "pg_loss",     "kl_loss",  "clip_frac",      "ratio_min", "ratio_mean",
    "ratio_max", "masked_frac", "kl_mu_pi", "m2po_threshold", "ess"};
#define STAT_THRESHOLD 9
#define N_LOSS_STATS   ((int)(sizeof loss_stat_names / sizeof loss_stat_names[0]))

/* Tolerances. The reference is float64 rounded to float32 (relative error <= 2^-24 = 6e-8);
 * the C loss is computed in double, so its statistics may differ from the reference by that
 * rounding only: 1.5e-7 relative. dlogp is written as float by C too (its KL and policy parts
 * rounded separately), so it is compared against 1e-6 of the case's largest |dlogp|. A bug
 * in a normaliser, a mask or a bound moves these values by percents. Counts and the M2PO
 * threshold (a float d itself) must match exactly. */
#define LOSS_STAT_RTOL 1.5e-7
#define LOSS_STAT_ATOL 1e-12
#define DLOGP_RTOL     1e-6

static void test_loss_vs_torch(void **state) {
  (void)state;
  lh_safetensors *st = open_ref("rl/loss.safetensors");
  long n_rows, n_names, n_ss, T;
  loss_case *cases = fixture_tensor(st, "case.int", LH_DTYPE_I32, -1, &n_rows);
  int K = (int)(n_rows / 8);
  loss_case_cfg *cfgs = fixture_tensor(st, "case.float", LH_DTYPE_F32, (long)K * 14, NULL);
  float *want_stats = fixture_tensor(st, "case.stats", LH_DTYPE_F32, (long)K * N_LOSS_STATS, NULL);
  int32_t *want_counts = fixture_tensor(st, "case.counts", LH_DTYPE_I32, (long)K * 3, NULL);
  char *names = fixture_tensor(st, "case.name", LH_DTYPE_U8, -1, &n_names);
  int32_t *ss = fixture_tensor(st, "seq_start", LH_DTYPE_I32, -1, &n_ss);
  int32_t *group = fixture_tensor(st, "group", LH_DTYPE_I32, n_ss, NULL);
  float *reward = fixture_tensor(st, "reward", LH_DTYPE_F32, n_ss, NULL);
  float *weight = fixture_tensor(st, "weight", LH_DTYPE_F32, -1, &T);
  float *adv = fixture_tensor(st, "adv", LH_DTYPE_F32, T, NULL);
  float *logp = fixture_tensor(st, "logp", LH_DTYPE_F32, T, NULL);
  float *mu = fixture_tensor(st, "mu", LH_DTYPE_F32, T, NULL);
  float *old = fixture_tensor(st, "old", LH_DTYPE_F32, T, NULL);
  float *ref = fixture_tensor(st, "ref", LH_DTYPE_F32, T, NULL);
  float *want_d = fixture_tensor(st, "dlogp", LH_DTYPE_F32, T, NULL);
  float *d = malloc((size_t)(T > 0 ? T : 1) * sizeof *d);
  assert_true(K >= 30 && n_names > 0 && names[n_names - 1] == '\0');

  worst w_stat[N_LOSS_STATS], w_d = {.what = "dlogp"};
  for (int k = 0; k < N_LOSS_STATS; k++)
    w_stat[k] = (worst){.what = loss_stat_names[k]};
  const char *name = names;
  int kinds_seen = 0, masked = 0, clipped = 0;
  for (int c = 0; c < K; c++, name += strlen(name) + 1) {
    assert_true(name < names + n_names);
    const loss_case *lc = &cases[c];
    const loss_case_cfg *f = &cfgs[c];
    lh_loss_config cfg = lh_loss_defaults();
    cfg.kind = (lh_loss_kind)lc->kind;
    cfg.agg = (lh_loss_agg)lc->agg;
    cfg.prox_mask = lc->prox_mask;
    cfg.eps_low = f->eps_low, cfg.eps_high = f->eps_high, cfg.C = f->C;
    cfg.lo = f->lo, cfg.hi = f->hi, cfg.m2po_tau = f->m2po_tau;
    cfg.constant = f->constant, cfg.kl_beta = f->kl_beta;
    cfg.m2_tau = f->m2_tau, cfg.seq_cap = f->seq_cap, cfg.tv_delta = f->tv_delta;
    cfg.tv_kl = f->tv_kl, cfg.oapl_beta1 = f->oapl_beta1, cfg.oapl_beta2 = f->oapl_beta2;
    const int *seq = ss + lc->seq_row;
    int a = lc->first_token, ns = lc->n_seqs;
    assert_true(lc->seq_row + ns < n_ss && a + seq[ns] <= T);
    lh_loss_input in = {.n_seqs = ns,
                        .seq_start = seq,
                        .weight = weight + a,
                        .adv = adv + a,
                        .logp = logp + a,
                        .mu = mu + a,
                        .old = lc->has_old ? old + a : NULL,
                        .ref = lc->has_ref ? ref + a : NULL,
                        .group = group + lc->seq_row,
                        .reward = reward + lc->seq_row};
    lh_loss_stats s;
    if (lh_loss_compute(&cfg, &in, d, &s)) fail_msg("%s: %s", name, lh_last_error());

    const int32_t *want_n = want_counts + (size_t)c * 3;
    if (s.n_valid != want_n[0] || s.n_masked != want_n[1] || s.n_clipped != want_n[2])
      fail_msg("%s: valid/masked/clipped %d/%d/%d, torch %d/%d/%d", name, s.n_valid, s.n_masked,
               s.n_clipped, want_n[0], want_n[1], want_n[2]);
    const double got[] = {s.loss,      s.pg_loss,        s.kl_loss,   s.clip_frac,
                          s.ratio_min, s.ratio_mean,     s.ratio_max, s.masked_frac,
                          s.kl_mu_pi,  s.m2po_threshold, s.ess};
    _Static_assert(sizeof got / sizeof got[0] == N_LOSS_STATS, "one value per column");
    const float *want = want_stats + (size_t)c * N_LOSS_STATS;
    for (int k = 0; k < N_LOSS_STATS; k++) {
      int exact = k == STAT_THRESHOLD; /* one of the float d values, or infinite (no bound) */
      double tol = exact ? 0.0 : LOSS_STAT_ATOL + LOSS_STAT_RTOL * fabs(want[k]);
      if (exact && isinf(want[k]) && got[k] == (double)want[k]) continue;
      track(&w_stat[k], got[k], want[k], tol, name, -1);
    }
    int n = seq[ns];
    double scale = 0.0;
    for (int i = 0; i < n; i++)
      scale = fmax(scale, fabs(want_d[a + i]));
    for (int i = 0; i < n; i++)
      track(&w_d, d[i], want_d[a + i], DLOGP_RTOL * scale, name, i);
    kinds_seen |= 1 << cfg.kind;
    masked += s.n_masked, clipped += s.n_clipped;
  }
  printf("  %d loss cases, %ld tokens (%d masked, %d clipped) against torch:\n", K, T, masked,
         clipped);
  for (int k = 0; k < N_LOSS_STATS; k++)
    report(&w_stat[k]);
  report(&w_d);
  assert_int_equal(kinds_seen, (1 << (LH_LOSS_SNIS + 1)) - 1); /* the fixture holds every kind */
  assert_true(masked > 0 && clipped > 0);

  free(d);
  free(want_d);
  free(ref);
  free(old);
  free(mu);
  free(logp);
  free(adv);
  free(weight);
  free(ss);
  free(group);
  free(reward);
  free(names);
  free(want_counts);
  free(want_stats);
  free(cfgs);
  free(cases);
  lh_safetensors_close(st);
}

/* ---------------------------------------------------------------- one RL update */

/* <scenario>.setup and .hparams, in the order tests/ref/rl_update_ref.py writes them. */
typedef struct {
  int32_t kind, agg, prox_mask, minibatches;
  int32_t batch_old; /* the batch carries `old` */
} update_setup;
typedef struct {
  float eps_low, eps_high, C, lo, hi, kl_beta;          /* lh_loss_config */
  float lr, beta1, beta2, eps, weight_decay, grad_clip; /* lh_adamw_config */
} update_hparams;
_Static_assert(sizeof(update_setup) == 5 * 4 && sizeof(update_hparams) == 12 * 4, "no padding");

/* <scenario>.stats columns; .counts: n_updates n_valid n_masked n_clipped. */
static const char *const update_stat_names[] = {"loss",      "pg_loss",    "kl_loss",
                                                "clip_frac", "ratio_mean", "grad_norm"};
#define N_UPDATE_STATS ((int)(sizeof update_stat_names / sizeof update_stat_names[0]))

/* Tolerances. C runs the forward and backward in float32, torch in float64 from the same
 * float32 weights: log-probs agree to ~1e-6, so the losses and the gradient norm get 2e-5
 * relative. rl_update_ref.py keeps every ratio 1e-3 (in log) from the clip and mask bounds,
 * every gradient norm 1% from the clip threshold and every gradient element above 1e-6 of the
 * step's largest, so no branch differs and AdamW's division by |g| amplifies no noise. The
 * first moment is linear in the clipped gradients: 2e-5 of the tensor's largest |m|, as
 * test_parity allows gradients. A step moves a weight by about lr = 1e-2; they must agree to
 * 1e-5. Measured errors are at least 15 times below these. A gradient three times too large moves
 * the gradient norm by 200%, and m by 200% where no step is clipped; the wrong proximal or old
 * log-probs change the clipped counts, m and the weights by ten times their tolerance or more
 * (tests/ref/README.md, "Update fixture"). */
#define UPD_STAT_RTOL  2e-5
#define UPD_STAT_ATOL  1e-7
#define ADAM_M_RTOL    2e-5
#define UPD_PARAM_ATOL 1e-5

static void check_update(lh_safetensors *ref, const char *dir, const char *name, lh_rl_batch *b,
                         worst *w_param, worst *w_m, worst *w_stat) {
  char key[256];
  snprintf(key, sizeof key, "%s.setup", name);
  update_setup *su = fixture_tensor(ref, key, LH_DTYPE_I32, 5, NULL);
  snprintf(key, sizeof key, "%s.hparams", name);
  update_hparams *hp = fixture_tensor(ref, key, LH_DTYPE_F32, 12, NULL);
  snprintf(key, sizeof key, "%s.stats", name);
  float *want_s = fixture_tensor(ref, key, LH_DTYPE_F32, N_UPDATE_STATS, NULL);
  snprintf(key, sizeof key, "%s.counts", name);
  int32_t *want_n = fixture_tensor(ref, key, LH_DTYPE_I32, 4, NULL);

  lh_model *m = NULL;
  if (lh_model_load(dir, &m)) fail_msg("%s", lh_last_error());
  int max_len = 0;
  for (int s = 0; s < b->n_seqs; s++)
    if (b->seq_start[s + 1] - b->seq_start[s] > max_len)
      max_len = b->seq_start[s + 1] - b->seq_start[s];
  lh_train *t = NULL;
  assert_int_equal(lh_train_create(m, b->seq_start[b->n_seqs], max_len, &t), LH_ERR_OK);
  lh_adamw_config ac = lh_adamw_defaults(); /* constant schedule, no warmup */
  ac.lr = hp->lr, ac.beta1 = hp->beta1, ac.beta2 = hp->beta2, ac.eps = hp->eps;
  ac.weight_decay = hp->weight_decay, ac.grad_clip = hp->grad_clip;
  lh_adamw *opt = NULL;
  assert_int_equal(lh_adamw_create(&m->cfg, &ac, &opt), LH_ERR_OK);
  lh_loss_config lc = lh_loss_defaults();
  lc.kind = (lh_loss_kind)su->kind, lc.agg = (lh_loss_agg)su->agg;
  lc.prox_mask = su->prox_mask;
  lc.eps_low = hp->eps_low, lc.eps_high = hp->eps_high, lc.C = hp->C;
  lc.lo = hp->lo, lc.hi = hp->hi, lc.kl_beta = hp->kl_beta;

  /* The batch carries old only where the scenario says; ref only with a KL penalty (as
   * lh_rl_run fills them). */
  float *old = b->old, *kl_ref = b->ref;
  if (!su->batch_old) b->old = NULL;
  if (!(lc.kl_beta > 0.0f)) b->ref = NULL;
  lh_rl_step_stats st;
  lh_err e = lh_rl_update(t, opt, m, &lc, su->minibatches, b, &st);
  b->old = old, b->ref = kl_ref;
  if (e) fail_msg("%s: %s", name, lh_last_error());

  if (st.n_updates != want_n[0] || st.loss.n_valid != want_n[1] || st.loss.n_masked != want_n[2] ||
      st.loss.n_clipped != want_n[3])
    fail_msg("%s: updates/valid/masked/clipped %d/%d/%d/%d, torch %d/%d/%d/%d", name, st.n_updates,
             st.loss.n_valid, st.loss.n_masked, st.loss.n_clipped, want_n[0], want_n[1], want_n[2],
             want_n[3]);
  const double got_s[] = {st.loss.loss,      st.loss.pg_loss,    st.loss.kl_loss,
                          st.loss.clip_frac, st.loss.ratio_mean, st.grad_norm};
  _Static_assert(sizeof got_s / sizeof got_s[0] == N_UPDATE_STATS, "one value per column");
  for (int k = 0; k < N_UPDATE_STATS; k++)
    track(&w_stat[k], got_s[k], want_s[k], UPD_STAT_ATOL + UPD_STAT_RTOL * fabs(want_s[k]), name,
          -1);

  /* Every tensor: the weights after the update and AdamW's first moment. */
  int nt = lh_model_tensors(&m->cfg, NULL, 0);
  lh_tensor_info *ti = malloc((size_t)nt * sizeof *ti);
  lh_model_tensors(&m->cfg, ti, nt);
  for (int i = 0; i < nt; i++) {
    long n = (long)ti[i].numel;
    snprintf(key, sizeof key, "%s.param.%s", name, ti[i].name);
    float *want_p = fixture_tensor(ref, key, LH_DTYPE_F32, n, NULL);
    snprintf(key, sizeof key, "%s.adam_m.%s", name, ti[i].name);
    float *want_m = fixture_tensor(ref, key, LH_DTYPE_F32, n, NULL);
    double scale = 0.0;
    for (long j = 0; j < n; j++)
      scale = fmax(scale, fabs(want_m[j]));
    char where[200];
    snprintf(where, sizeof where, "%s: %s", name, ti[i].name);
    for (long j = 0; j < n; j++) {
      track(w_param, m->params[ti[i].offset + j], want_p[j], UPD_PARAM_ATOL, where, (int)j);
      track(w_m, opt->m[ti[i].offset + j], want_m[j], ADAM_M_RTOL * scale, where, (int)j);
    }
    free(want_p);
    free(want_m);
  }
  free(ti);
  lh_adamw_free(opt);
  lh_train_free(t);
  lh_model_free(m);
  free(want_n);
  free(want_s);
  free(hp);
  free(su);
}

static void test_update_vs_torch(void **state) {
  (void)state;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/rl/update", LH_SOURCE_DIR);
  lh_safetensors *ref = open_ref("rl/update/reference.safetensors");
  long n_ss, N, n_names;
  lh_rl_batch b = {0};
  b.seq_start = fixture_tensor(ref, "seq_start", LH_DTYPE_I32, -1, &n_ss);
  b.n_seqs = (int)n_ss - 1;
  b.group = fixture_tensor(ref, "group", LH_DTYPE_I32, b.n_seqs, NULL);
  b.tokens = fixture_tensor(ref, "tokens", LH_DTYPE_I32, -1, &N);
  assert_int_equal(N, b.seq_start[b.n_seqs]);
  b.weight = fixture_tensor(ref, "weight", LH_DTYPE_F32, N, NULL);
  b.adv = fixture_tensor(ref, "adv", LH_DTYPE_F32, N, NULL);
  b.mu = fixture_tensor(ref, "mu", LH_DTYPE_F32, N, NULL);
  b.old = fixture_tensor(ref, "old", LH_DTYPE_F32, N, NULL);
  b.ref = fixture_tensor(ref, "ref", LH_DTYPE_F32, N, NULL);
  char *names = fixture_tensor(ref, "scenarios", LH_DTYPE_U8, -1, &n_names);
  assert_true(n_names > 0 && names[n_names - 1] == '\0');

  worst w_param = {.what = "weights"}, w_m = {.what = "adam m"}, w_stat[N_UPDATE_STATS];
  for (int k = 0; k < N_UPDATE_STATS; k++)
    w_stat[k] = (worst){.what = update_stat_names[k]};
  int scenarios = 0;
  for (const char *name = names; name < names + n_names; name += strlen(name) + 1) {
    check_update(ref, dir, name, &b, &w_param, &w_m, w_stat);
    scenarios++;
  }
  printf("  %d lh_rl_update scenarios against torch (%d sequences, %ld tokens):\n", scenarios,
         b.n_seqs, N);
  for (int k = 0; k < N_UPDATE_STATS; k++)
    report(&w_stat[k]);
  report(&w_m);
  report(&w_param);
  assert_true(scenarios >= 3);
  free(names);
  lh_rl_batch_free(&b);
  lh_safetensors_close(ref);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss_vs_torch),
      cmocka_unit_test(test_update_vs_torch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
