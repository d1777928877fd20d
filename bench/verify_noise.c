/* verify_noise: the honest noise of rollout verification on a model of any shape (the tiny
 * calibration model says little about a Qwen-sized one). `gen` generates a batch as a worker
 * does (lh_rollout_generate_ids on this process's kernel path, LH_KERNEL, and thread count) and
 * writes it in the rollout byte format; `check` verifies it as serve does (the fp32 training
 * forward on the same bf16 weights, then lh_trust_verify_group with lh_trust_defaults and the
 * model's stop ids), teacher-forces the worker's decode on each kernel path named (one token
 * per sequence per forward, as the generator decodes) and prints one JSON line: the verdicts
 * and BORDERLINE counts at the defaults and at logit_tol 1e-3 down to 1e-5, the differences
 * between the worker's and the verifier's log-probs and logits (worst, and 99.9th percentile:
 * of the token log-probs over completion positions, of the logits over every vocabulary entry
 * of those positions), and the seconds of the recompute forward, of the check of every token
 * (and of lh_sample_check alone against lh_sample_check_chance, which adds the honest BORDERLINE
 * chance) and, for scale, of one training step (forward and backward). Usage:
 *   verify_noise gen MODEL_DIR OUT [GROUPS GROUP_SIZE MAX_NEW PROMPT_LEN SEED SLOTS]
 *   verify_noise check MODEL_DIR BATCH [PATHS]
 * PATHS: comma-separated kernel paths (default: all this CPU runs; "none": none). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/infer.h"
#include "longhaul/rollout.h"
#include "longhaul/tensor.h"
#include "longhaul/trust.h"

_Noreturn static void die(const char *what) {
  fprintf(stderr, "verify_noise: %s: %s\n", what, lh_last_error());
  exit(1);
}

static int arg_int(int argc, char **argv, int i, int dflt) {
  return argc > i ? atoi(argv[i]) : dflt;
}

static int gen_main(int argc, char **argv) {
  const char *dir = argv[2], *out = argv[3];
  int G = arg_int(argc, argv, 4, 2), gs = arg_int(argc, argv, 5, 4);
  int max_new = arg_int(argc, argv, 6, 48), P = arg_int(argc, argv, 7, 16);
  uint64_t seed = (uint64_t)arg_int(argc, argv, 8, 1);
  int slots = arg_int(argc, argv, 9, 8);
  if (G < 1 || G > 64 || gs < 1 || gs > 64 || max_new < 1 || P < 1 || slots < 1) {
    fprintf(stderr, "verify_noise gen: GROUPS and GROUP_SIZE in [1, 64], MAX_NEW, PROMPT_LEN "
                    "and SLOTS >= 1\n");
    return 2;
  }
  lh_infer *m;
  lh_generator *g;
  if (lh_infer_load(dir, &m)) die(dir);
  int V = lh_infer_config(m)->vocab_size;
  if (lh_generator_create(m, slots, P + max_new, 0, &g)) die("generator");
  /* prompts of P ids drawn from Philox (stream 1000 + group), the same for every path */
  int32_t *ids = lh_xmalloc((size_t)G * P * sizeof *ids);
  const int32_t **prompts = lh_xmalloc((size_t)G * sizeof *prompts);
  int *plen = lh_xmalloc((size_t)G * sizeof *plen);
  uint64_t *tasks = lh_xmalloc((size_t)G * sizeof *tasks), *bases = lh_xmalloc(G * sizeof *bases);
  for (int t = 0; t < G; t++) {
    for (int i = 0; i < P; i++)
      ids[t * P + i] = (int32_t)(lh_sample_uniform(seed, 1000 + (uint64_t)t, (uint64_t)i) * V);
    prompts[t] = ids + (size_t)t * P;
    plen[t] = P;
    tasks[t] = (uint64_t)t;
    bases[t] = (uint64_t)t * (uint64_t)gs; /* so that the concatenation keeps every stream */
  }
  lh_gen_config gc = lh_gen_defaults();
  gc.seed = seed;
  gc.max_new = max_new;
  lh_rollout_batch *parts = lh_xcalloc((size_t)G, sizeof *parts), all;
  const lh_rollout_batch **pp = lh_xmalloc((size_t)G * sizeof *pp);
  double t0 = lh_time_now();
  if (lh_rollout_generate_ids(g, &gc, LH_SPLIT_TRAIN, tasks, prompts, plen, bases, G, gs, parts))
    die("generate");
  double gen_s = lh_time_now() - t0;
  for (int t = 0; t < G; t++)
    pp[t] = &parts[t];
  if (lh_rollout_concat(pp, G, &all)) die("concat");
  uint8_t *buf;
  size_t len;
  if (lh_rollout_encode(&all, &buf, &len)) die("encode");
  if (lh_file_write_atomic(out, buf, len)) die("write");
  printf("{\"gen\": \"%s\", \"kernel\": \"%s\", \"threads\": %d, \"groups\": %d, \"group_size\": "
         "%d, \"tokens\": %d, \"gen_s\": %.3f}\n",
         out, lh_kernel_name(lh_kernel_get()), lh_threads(), G, gs, all.seq_start[G * gs], gen_s);
  free(buf);
  lh_rollout_batch_free(&all);
  for (int t = 0; t < G; t++)
    lh_rollout_batch_free(&parts[t]);
  free(parts);
  free(pp);
  free(ids);
  free(prompts);
  free(plen);
  free(tasks);
  free(bases);
  lh_generator_free(g);
  lh_infer_free(m);
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* worst and 99.9th percentile (nearest rank) of v[0..n), sorted here */
static void tail(double *v, int n, double *worst, double *p999) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  *worst = n ? v[n - 1] : 0.0;
  *p999 = n ? v[(int)ceil(0.999 * n) - 1] : 0.0;
}

/* |differences| of many values (every logit of every position): a histogram of 64 bins per
 * decade from 1e-12 to 1e4, whose quantiles are upper bin edges (within 4%) */
#define HIST_LO   (-12.0)
#define HIST_BINS (16 * 64)
typedef struct {
  long long n, bin[HIST_BINS + 1]; /* the last: below 1e-12, zeros included */
} hist;

static void hist_add(hist *h, double d) {
  int b = d > 0.0 ? (int)floor((log10(d) - HIST_LO) * 64.0) : -1;
  h->n++;
  h->bin[b < 0 ? HIST_BINS : b >= HIST_BINS ? HIST_BINS - 1 : b]++;
}

static double hist_quantile(const hist *h, double q) {
  long long need = (long long)ceil(q * (double)h->n), seen = h->bin[HIST_BINS];
  if (seen >= need) return pow(10.0, HIST_LO);
  for (int b = 0; b < HIST_BINS; b++)
    if ((seen += h->bin[b]) >= need) return pow(10.0, HIST_LO + (b + 1) / 64.0);
  return INFINITY;
}

static double logsumexp(const float *x, int V) {
  double mx = -INFINITY, s = 0.0;
  for (int i = 0; i < V; i++)
    if (x[i] > mx) mx = x[i];
  for (int i = 0; i < V; i++)
    s += exp((double)x[i] - mx);
  return mx + log(s);
}

/* The completion positions of a batch: row[i] is the recomputed logits' row (the token before
 * it), seq[i] its sequence, tok[i] the token. */
typedef struct {
  int n, *row, *seq;
  int32_t *tok;
} positions;

static positions completion_positions(const lh_rollout_batch *b) {
  int ns = b->n_groups * b->group_size;
  positions p = {0};
  int N = b->seq_start[ns];
  p.row = lh_xmalloc((size_t)N * sizeof *p.row);
  p.seq = lh_xmalloc((size_t)N * sizeof *p.seq);
  p.tok = lh_xmalloc((size_t)N * sizeof *p.tok);
  for (int s = 0; s < ns; s++)
    for (int i = b->seq_start[s] + b->prompt_len[s]; i < b->seq_start[s + 1]; i++) {
      p.row[p.n] = i - 1;
      p.seq[p.n] = s;
      p.tok[p.n++] = b->tokens[i];
    }
  return p;
}

/* Teacher-forces the batch's sequences through the inference engine on kernel path k, all at
 * once (slot = sequence, one token per sequence per forward, as the generator decodes), and
 * compares the logits of each completion position with ref (the verifier's, one row per
 * position): worst |logit difference| over the vocabulary, |log-prob difference| of the token,
 * and |log-prob - mu| (what the worker reported). Prints a JSON object. */
static void decode_path(const lh_infer *m, const lh_rollout_batch *b, const positions *p,
                        const float *ref, const double *ref_lse, int V, lh_kernel k) {
  int ns = b->n_groups * b->group_size, len_max = 0;
  for (int s = 0; s < ns; s++)
    if (b->seq_start[s + 1] - b->seq_start[s] > len_max)
      len_max = b->seq_start[s + 1] - b->seq_start[s];
  lh_kv *kv;
  if (lh_kv_create(m, ns, len_max, ns, &kv)) die("kv");
  lh_infer_row *rows = lh_xmalloc((size_t)ns * sizeof *rows);
  int *want = lh_xmalloc((size_t)ns * sizeof *want); /* position index of each logits row */
  float *logits = lh_xmalloc((size_t)ns * V * sizeof *logits);
  hist *h = lh_xcalloc(1, sizeof *h);
  double *dl = lh_xmalloc((size_t)p->n * sizeof *dl), *dlp = lh_xmalloc((size_t)p->n * sizeof *dlp),
         *dmu = lh_xmalloc((size_t)p->n * sizeof *dmu);
  /* the position index of (sequence s, completion token i): first[s] + i - prompt_len */
  int *first = lh_xmalloc((size_t)ns * sizeof *first);
  for (int i = p->n - 1; i >= 0; i--)
    first[p->seq[i]] = i;
  double t0 = lh_time_now();
  for (int pos = 0; pos < len_max; pos++) {
    int n = 0, nw = 0;
    for (int s = 0; s < ns; s++) {
      int len = b->seq_start[s + 1] - b->seq_start[s], pl = b->prompt_len[s];
      if (pos >= len) continue;
      bool lg = pos >= pl - 1 && pos < len - 1; /* predicts completion token pos + 1 */
      rows[n++] = (lh_infer_row){s, pos, b->tokens[b->seq_start[s] + pos], lg};
      if (lg) want[nw++] = first[s] + pos + 1 - pl;
    }
    if (n && lh_infer_forward(m, kv, rows, n, logits)) die("forward");
    for (int r = 0; r < nw; r++) {
      int i = want[r];
      const float *x = logits + (size_t)r * V, *y = ref + (size_t)i * V;
      double worst = 0.0;
      for (int v = 0; v < V; v++) {
        double d = fabs((double)x[v] - y[v]);
        hist_add(h, d);
        if (d > worst) worst = d;
      }
      double lp = x[p->tok[i]] - logsumexp(x, V), lq = y[p->tok[i]] - ref_lse[i];
      dl[i] = worst;
      dlp[i] = fabs(lp - lq);
      dmu[i] = fabs(lp - b->mu[p->row[i] + 1]);
    }
  }
  double secs = lh_time_now() - t0, lw, l9, pw, p9, mw, m9;
  tail(dl, p->n, &lw, &l9);
  l9 = hist_quantile(h, 0.999);
  tail(dlp, p->n, &pw, &p9);
  tail(dmu, p->n, &mw, &m9);
  printf("{\"path\": \"%s\", \"logit_worst\": %.3e, \"logit_p999\": %.3e, \"logprob_worst\": "
         "%.3e, \"logprob_p999\": %.3e, \"vs_reported_worst\": %.3e, \"vs_reported_p999\": %.3e, "
         "\"decode_s\": %.2f}",
         lh_kernel_name(k), lw, l9, pw, p9, mw, m9, secs);
  free(first);
  free(h);
  free(dl);
  free(dlp);
  free(dmu);
  free(logits);
  free(want);
  free(rows);
  lh_kv_free(kv);
}

/* The verdicts of serve's check on every group of a batch at one set of tolerances. */
typedef struct {
  int rejected, border_member, headroom; /* headroom: the least bound - count of a member */
  int64_t border, tokens;
  double expected, lp_err, secs; /* expected: the sum of the honest BORDERLINE chances */
} verdicts;

/* the defaults first, then other logit tolerances: how BORDERLINE grows with it */
#define SWEEP 6
static const double sweep_tol[SWEEP] = {0, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5};

static verdicts verify_all(const lh_rollout_batch *b, const float *logits, int V,
                           const lh_trust_config *tc, lh_sample_scratch *sc, bool say) {
  verdicts r = {0};
  r.headroom = INT32_MAX;
  double t0 = lh_time_now();
  for (int g = 0; g < b->n_groups; g++) {
    lh_trust_verdict v;
    if (lh_trust_verify_group(b, g, logits, V, tc, sc, &v)) die("verify");
    if (v.failed != LH_TRUST_OK) {
      r.rejected++;
      if (say) fprintf(stderr, "verify_noise: group %d rejected: %s\n", g, v.reason);
    }
    r.border += v.borderline;
    r.expected += v.borderline_expected;
    if (v.borderline_headroom < r.headroom) r.headroom = v.borderline_headroom;
    r.tokens += v.tokens_checked;
    if (v.borderline_member_max > r.border_member) r.border_member = v.borderline_member_max;
    if (v.max_logprob_err > r.lp_err) r.lp_err = v.max_logprob_err;
  }
  r.secs = lh_time_now() - t0;
  return r;
}

static int check_main(int argc, char **argv) {
  const char *dir = argv[2], *paths = argc > 4 ? argv[4] : NULL;
  size_t len;
  char *buf;
  if (lh_file_read(argv[3], (size_t)1 << 32, &buf, &len)) die("read");
  /* the policy is bf16: the verifier widens its bf16 weights (lh_trainer_recompute) */
  lh_config cfg;
  uint16_t *slab;
  lh_model *m;
  if (lh_model_load_bf16(dir, &cfg, &slab) || lh_model_create(&cfg, &m)) die(dir);
  lh_f32_from_bf16_n(m->params, slab, m->n_params);
  free(slab);
  int V = m->cfg.vocab_size;
  lh_rollout_limits lim = lh_rollout_default_limits();
  lim.vocab = V;
  lh_rollout_batch b;
  if (lh_rollout_decode((const uint8_t *)buf, len, &lim, argv[3], &b)) die("decode");
  free(buf);
  int ns = b.n_groups * b.group_size, N = b.seq_start[ns], len_max = 0;
  for (int s = 0; s < ns; s++)
    if (b.seq_start[s + 1] - b.seq_start[s] > len_max)
      len_max = b.seq_start[s + 1] - b.seq_start[s];
  lh_train *t;
  if (lh_train_create(m, N, len_max, &t)) die("train");
  /* serve's recompute, then its check (trust.h) */
  double t0 = lh_time_now();
  if (lh_rollout_recompute(t, &b)) die("recompute");
  double recompute_s = lh_time_now() - t0;
  const float *logits = lh_train_logits(t);
  lh_trust_config tc = lh_trust_defaults();
  if (m->cfg.n_eos > 0)
    for (int i = 0; i < m->cfg.n_eos && i < 8; i++)
      tc.stop_ids[tc.n_stop++] = m->cfg.eos_ids[i];
  else if (m->cfg.eos_token_id >= 0)
    tc.stop_ids[tc.n_stop++] = m->cfg.eos_token_id;
  lh_sample_scratch *sc = lh_sample_scratch_create(V);
  verdicts vd[SWEEP];
  for (int k = 0; k < SWEEP; k++) {
    lh_trust_config tk = tc;
    tk.logit_tol = k ? sweep_tol[k] : tc.logit_tol;
    vd[k] = verify_all(&b, logits, V, &tk, sc, k == 0);
  }
  /* the cost of checking every token: the defaults with no BORDERLINE bound */
  lh_trust_config all = tc;
  all.borderline_min = 1 << 30;
  verdicts every = verify_all(&b, logits, V, &all, sc, false);
  double absmax = 0.0;
  /* the reported log-probs against the recomputed ones, every completion token */
  positions p = completion_positions(&b);
  /* what the honest BORDERLINE chance adds to the check: lh_sample_check against
   * lh_sample_check_chance on every completion position, taken in turn */
  double check_s = 0.0, chance_s = 0.0;
  for (int i = 0; i < p.n; i++) {
    int s = p.seq[i], at = p.row[i] + 1;
    double u = lh_sample_uniform(b.seed, b.stream_base + (uint64_t)s,
                                 (uint64_t)(at - b.seq_start[s])),
           ch;
    const float *row = logits + (size_t)p.row[i] * V;
    double t1 = lh_time_now();
    lh_sample_check(row, V, &b.sample, u, p.tok[i], tc.logit_tol, sc);
    double t2 = lh_time_now();
    lh_sample_check_chance(row, V, &b.sample, u, p.tok[i], tc.logit_tol, sc, &ch);
    check_s += t2 - t1;
    chance_s += lh_time_now() - t2;
  }
  double *d = lh_xmalloc((size_t)p.n * sizeof *d), mw, m9;
  for (int i = 0; i < p.n; i++) {
    int at = p.row[i] + 1;
    d[i] = fabs((double)b.mu[at] - b.old[at]);
  }
  tail(d, p.n, &mw, &m9);
  /* the verifier's logits of the completion positions, kept for the kernel paths */
  float *ref = lh_xmalloc((size_t)p.n * V * sizeof *ref);
  double *lse = lh_xmalloc((size_t)p.n * sizeof *lse);
  for (int i = 0; i < p.n; i++) {
    memcpy(ref + (size_t)i * V, logits + (size_t)p.row[i] * V, (size_t)V * sizeof *ref);
    lse[i] = logsumexp(ref + (size_t)i * V, V);
    for (int v = 0; v < V; v++)
      absmax = fmax(absmax, fabs(ref[(size_t)i * V + v]));
  }
  /* one training step on the batch (the completion tokens' cross-entropy), for scale */
  float *w = lh_xcalloc((size_t)N, sizeof *w), *lp = lh_xmalloc((size_t)N * sizeof *lp);
  for (int i = 0; i < p.n; i++)
    w[p.row[i] + 1] = 1.0f;
  lh_batch tb = {ns, b.seq_start, b.tokens, w};
  t0 = lh_time_now();
  lh_train_ce_step(t, &tb, lp);
  double step_s = lh_time_now() - t0;
  free(w);
  free(lp);
  lh_train_free(t);
  lh_model_free(m);
  printf("{\"check\": \"%s\", \"threads\": %d, \"groups\": %d, \"completion_tokens\": %d, "
         "\"logit_absmax\": %.3f, \"reported_worst\": %.3e, \"reported_p999\": %.3e, "
         "\"recompute_s\": %.3f, \"train_step_s\": %.3f, \"verdicts\": [",
         argv[3], lh_threads(), b.n_groups, p.n, absmax, mw, m9, recompute_s, step_s);
  for (int k = 0; k < SWEEP; k++)
    printf("%s{\"logit_tol\": %g, \"rejected\": %d, \"tokens_checked\": %lld, \"borderline\": "
           "%lld, \"borderline_expected\": %.2f, \"borderline_member_max\": %d, "
           "\"borderline_headroom\": %d, \"logprob_err_max\": %.3e, \"verify_s\": %.4f}",
           k ? ", " : "", k ? sweep_tol[k] : tc.logit_tol, vd[k].rejected, (long long)vd[k].tokens,
           (long long)vd[k].border, vd[k].expected, vd[k].border_member,
           vd[k].headroom == INT32_MAX ? -1 : vd[k].headroom, vd[k].lp_err, vd[k].secs);
  printf("], \"no_borderline_bound\": {\"rejected\": %d, \"tokens_checked\": %lld, \"verify_s\": "
         "%.4f}, \"sample_check_s\": %.4f, \"sample_check_chance_s\": %.4f, \"paths\": [",
         every.rejected, (long long)every.tokens, every.secs, check_s, chance_s);
  if (!paths || strcmp(paths, "none")) {
    lh_infer *inf;
    if (lh_infer_load(dir, &inf)) die(dir);
    int printed = 0;
    for (int k = 0; k < LH_KERNEL_COUNT; k++) {
      const char *name = lh_kernel_name((lh_kernel)k);
      const char *at = paths ? strstr(paths, name) : NULL;
      if (paths && !(at && (at == paths || at[-1] == ',') &&
                     (at[strlen(name)] == ',' || at[strlen(name)] == '\0')))
        continue;
      if (lh_kernel_set((lh_kernel)k)) continue;
      if (printed++) printf(", ");
      fflush(stdout);
      decode_path(inf, &b, &p, ref, lse, V, (lh_kernel)k);
    }
    lh_infer_free(inf);
  }
  printf("]}\n");
  free(ref);
  free(lse);
  free(d);
  free(p.row);
  free(p.seq);
  free(p.tok);
  lh_sample_scratch_free(sc);
  lh_rollout_batch_free(&b);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 4 && !strcmp(argv[1], "gen")) return gen_main(argc, argv);
  if (argc >= 4 && argc <= 5 && !strcmp(argv[1], "check")) return check_main(argc, argv);
  fprintf(stderr, "usage: verify_noise gen MODEL_DIR OUT [GROUPS GROUP_SIZE MAX_NEW PROMPT_LEN "
                  "SEED SLOTS]\n       verify_noise check MODEL_DIR BATCH [PATHS]\n");
  return 2;
}
