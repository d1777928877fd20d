/* The verifier's side of sampling: recompute the canonical kept set and the submitted token's
 * CDF interval, and say whether u selects it with a margin, misses it, or lies within tol of a
 * boundary that floating-point noise could move. Never allocates; O(V) plus a candidate sort. */
#include <math.h>

#include "sample_impl.h"

/* Narrows a token's flags by one filter: `in` canonical membership, `unc` within tol of it. */
static inline void narrow(uint8_t *f, bool in, bool unc) {
  uint8_t x = *f;
  if (!in) x &= (uint8_t)~LH__IN;
  if (!in && !unc) x &= (uint8_t)~LH__POSS;
  if (!in || unc) x &= (uint8_t)~LH__SURE;
  *f = x;
}

/* Top-k: a kept token may drop out only if a dropped token lies within tol below or above it
 * (its logit <= the best dropped logit + tol); a dropped token may come in only if it lies
 * within tol of the k-th best. */
static void check_topk(const lh__logits *g, int V, int k, double tol, lh_sample_scratch *s) {
  const float *l = g->l;
  uint8_t *flags = s->flags;
  lh__sample_topk(l, V, k, s->heap);
  int32_t kid = s->heap[0]; /* the k-th best */
  float lk = l[kid], out_best = -INFINITY;
  for (int i = 0; i < V; i++) {
    bool in = l[i] > lk || (l[i] == lk && i <= kid);
    flags[i] = in ? flags[i] : (uint8_t)(flags[i] & ~LH__IN);
    out_best = !in && l[i] > out_best ? l[i] : out_best;
  }
  for (int i = 0; i < V; i++) {
    bool in = flags[i] & LH__IN;
    bool unc = in ? (double)l[i] <= (double)out_best + tol : (double)l[i] >= (double)lk - tol;
    narrow(&flags[i], in, unc);
  }
}

/* Top-p over the tokens the top-k step left possible. For the candidate at rank q: canonically
 * kept iff the canonical mass ranked before it is below top_p*S; surely kept iff the mass of
 * every possible token with a logit >= l_q - tol is below (top_p - tol)*S; surely dropped iff
 * the mass of the sure tokens with a logit > l_q + tol reaches (top_p + tol)*S. Past the first
 * candidate that is surely dropped (after the canonical crossing), all are dropped. The scan
 * starts from the tokens whose w exceeds (1 - top_p - tol) S / (4V) (together they hold more
 * than (top_p + tol) S) and falls back to every possible token if that is not enough. */
static void check_topp(const lh__logits *g, int V, double T, double top_p, double tol,
                       lh_sample_scratch *s) {
  const float *l = g->l;
  const double *w = s->w;
  uint8_t *flags = s->flags;
  int32_t *cand = s->heap;
  uint64_t *keys = s->keys, *res = s->tmp;
  double S = g->S, target = top_p * S, hi_t = (top_p + tol) * S, lo_t = (top_p - tol) * S;
  int ib = s->idbits;
  float fl0 = lh__sample_logit_floor(g, T, (1.0 - top_p - tol) * S / (4.0 * V));
  size_t nc = lh__sample_above(l, V, fl0, cand);
  /* one bucket more than the mass needs, for the tol band below the last token scanned */
  float fl1 = lh__sample_narrow_floor(g, T, w, cand, nc, hi_t, 1, fl0);
  size_t n = 0, stop = 0;
  for (int tries = 0;; tries++) {
    /* 0: the histogram's choice; 1: every candidate; 2: every possible id */
    float fl = tries == 0 ? fl1 : tries == 1 ? fl0 : -INFINITY;
    bool complete = fl == -INFINITY; /* every possible id is gathered */
    n = 0;
    if (tries < 2) {
      for (size_t j = 0; j < nc; j++)
        if ((flags[cand[j]] & LH__POSS) && l[cand[j]] >= fl)
          keys[n++] = lh__rank_key(l[cand[j]], cand[j], ib);
    } else {
      for (int i = 0; i < V; i++)
        if (flags[i] & LH__POSS) keys[n++] = lh__rank_key(l[i], i, ib);
    }
    lh__sample_sort(keys, res, n, 32 + ib);
    double cum = 0.0, sure = 0.0, poss = 0.0;
    bool crossed = false, ok = true;
    size_t r1 = 0, r2 = 0;
    stop = n;
    for (size_t q = 0; q < n; q++) {
      int32_t id = lh__key_id(keys[q], ib);
      double lq = l[id];
      for (; r1 < q; r1++) {
        int32_t j = lh__key_id(keys[r1], ib);
        if (!((double)l[j] > lq + tol)) break;
        if (flags[j] & LH__SURE) sure += w[j];
      }
      if (crossed && sure >= hi_t) {
        stop = q;
        break;
      }
      for (; r2 < n; r2++) {
        int32_t j = lh__key_id(keys[r2], ib);
        if (!((double)l[j] >= lq - tol)) break;
        poss += w[j];
      }
      if (r2 == n && !complete) { /* the band below l_q may hold tokens not gathered */
        ok = false;
        break;
      }
      bool in = !crossed;
      if ((flags[id] & LH__IN) && !crossed) {
        cum += w[id];
        crossed = cum >= target;
      }
      bool unc = !(poss - w[id] < lo_t) && !(sure >= hi_t);
      res[q] = (uint64_t)in | (uint64_t)unc << 1;
    }
    if (complete || (ok && stop < n)) break;
  }
  for (size_t q = 0; q < stop; q++) {
    int32_t id = lh__key_id(keys[q], ib);
    narrow(&flags[id], res[q] & 1, (res[q] >> 1) & 1);
    flags[id] |= LH__SEEN;
  }
  for (int i = 0; i < V; i++) {
    if (flags[i] & LH__SEEN)
      flags[i] &= (uint8_t)~LH__SEEN;
    else
      flags[i] = 0;
  }
}

static inline double ratio(double a, double b) {
  return b > 0.0 ? a / b : 0.0;
}

static lh_sample_verdict check_greedy(const lh__logits *g, int V, int32_t token, double tol) {
  const float *l = g->l;
  double other = -INFINITY;
  for (int i = 0; i < V; i++)
    if (i != token && l[i] > other) other = l[i];
  double margin = (double)l[token] - other;
  if (margin > tol) return LH_SAMPLE_CONSISTENT;
  if (-margin > tol) return LH_SAMPLE_INCONSISTENT;
  return LH_SAMPLE_BORDERLINE;
}

/* Where the token sits: its canonical CDF interval and the mass that surely or possibly lies
 * before and after it. */
typedef struct {
  bool in, poss, sure;             /* canonically kept; possibly kept; surely kept */
  double c_before, c_after, total; /* canonical, added as the sampler adds them */
  double sb, ub, sa, ua;           /* sure and uncertain mass before (b) and after (a) */
} place;

/* the canonical c before and after the token, added as the sampler adds them: lh__tree64 of
 * the token's block up to it, after the earlier blocks' sums bs */
static void canonical_c(const double *bs, const double *x, int32_t token, place *pl) {
  enum { B = LH__SAMPLE_BLOCK };
  int tb = token / B, ot = token % B;
  double P = 0.0, y[B];
  for (int b = 0; b < tb; b++)
    P += bs[b];
  for (int o = 0; o < B; o++)
    y[o] = o < ot ? x[o] : 0.0;
  pl->c_before = P + lh__tree64(y);
  y[ot] = x[ot];
  pl->c_after = P + lh__tree64(y);
}

/* No top-k or top-p: the kept set is w >= min_p, and the block sums of lh__sample_weights are
 * the sampler's. */
static void place_plain(const double *w, const double *bs, int V, double minp, double tol,
                        int32_t token, place *pl) {
  enum { B = LH__SAMPLE_BLOCK };
  int nb = (V + B - 1) / B;
  double total = 0.0, x[B];
  for (int b = 0; b < nb; b++)
    total += bs[b];
  pl->total = total;
  int b0 = token / B * B;
  for (int o = 0; o < B; o++)
    x[o] = b0 + o < V && w[b0 + o] >= minp ? w[b0 + o] : 0.0;
  canonical_c(bs, x, token, pl);
  double wt = w[token];
  pl->in = wt >= minp;
  pl->poss = pl->in || (minp > 0.0 && fabs(wt - minp) <= tol);
  pl->sure = minp == 0.0 || (pl->in && !(fabs(wt - minp) <= tol));
  double sb = 0.0, ub = 0.0, sa = 0.0, ua = 0.0;
  if (minp > 0.0) {
    for (int i = 0; i < token; i++) {
      double v = w[i];
      bool unc = fabs(v - minp) <= tol;
      sb += v >= minp && !unc ? v : 0.0;
      ub += unc ? v : 0.0;
    }
    for (int i = token + 1; i < V; i++) {
      double v = w[i];
      bool unc = fabs(v - minp) <= tol;
      sa += v >= minp && !unc ? v : 0.0;
      ua += unc ? v : 0.0;
    }
  } else {
    for (int i = 0; i < token; i++)
      sb += w[i];
    for (int i = token + 1; i < V; i++)
      sa += w[i];
  }
  pl->sb = sb, pl->ub = ub, pl->sa = sa, pl->ua = ua;
}

/* With top-k or top-p: per-token flags, then sums over the possibly kept ids only. */
static void place_flags(const lh__logits *g, int V, const lh_sample_params *p, double tol,
                        int32_t token, lh_sample_scratch *s, place *pl) {
  enum { B = LH__SAMPLE_BLOCK };
  const double *w = s->w;
  uint8_t *flags = s->flags;
  memset(flags, LH__IN | LH__POSS | LH__SURE, (size_t)V);
  if (p->top_k > 0 && p->top_k < V) check_topk(g, V, p->top_k, tol, s);
  if (p->top_p < 1.0f) check_topp(g, V, p->temperature, p->top_p, tol, s);
  int32_t *ids = s->heap; /* the possibly kept ids, ascending */
  size_t n = 0;
  int i = 0;
  for (; i + 8 <= V; i += 8) {
    uint64_t f8;
    memcpy(&f8, flags + i, sizeof f8);
    if (!(f8 & 0x0202020202020202ull)) continue; /* LH__POSS in none of the eight */
    for (int j = i; j < i + 8; j++) {
      ids[n] = j;
      n += (flags[j] & LH__POSS) != 0;
    }
  }
  for (; i < V; i++)
    if (flags[i] & LH__POSS) ids[n++] = i;
  if (p->min_p > 0.0f) {
    double minp = p->min_p;
    for (size_t j = 0; j < n; j++) {
      double v = w[ids[j]];
      narrow(&flags[ids[j]], v >= minp, fabs(v - minp) <= tol);
    }
  }
  pl->in = flags[token] & LH__IN;
  pl->poss = flags[token] & LH__POSS;
  pl->sure = flags[token] & LH__SURE;
  /* canonical sums: blocks in order, each by lh__tree64 over its kept ids */
  int tb = token / B, ot = token % B;
  double total = 0.0, P_tok = 0.0, x[B], xt[B];
  bool seen_tb = false;
  for (int o = 0; o < B; o++)
    xt[o] = 0.0;
  for (size_t j = 0; j < n;) {
    int b = ids[j] / B;
    for (int o = 0; o < B; o++)
      x[o] = 0.0;
    for (; j < n && ids[j] / B == b; j++)
      if (flags[ids[j]] & LH__IN) x[ids[j] % B] = w[ids[j]];
    if (!seen_tb && b >= tb) P_tok = total, seen_tb = true;
    if (b == tb) memcpy(xt, x, sizeof x);
    total += lh__tree64(x);
  }
  if (!seen_tb) P_tok = total;
  pl->total = total;
  for (int o = ot; o < B; o++)
    x[o] = 0.0;
  for (int o = 0; o < ot; o++)
    x[o] = xt[o];
  pl->c_before = P_tok + lh__tree64(x);
  x[ot] = xt[ot];
  pl->c_after = P_tok + lh__tree64(x);
  double sb = 0.0, ub = 0.0, sa = 0.0, ua = 0.0;
  for (size_t j = 0; j < n; j++) {
    int32_t id = ids[j];
    if (id == token) continue;
    uint8_t f = flags[id];
    double v = w[id];
    if (f & LH__SURE)
      *(id < token ? &sb : &sa) += v;
    else if (f & LH__POSS)
      *(id < token ? &ub : &ua) += v;
  }
  pl->sb = sb, pl->ub = ub, pl->sa = sa, pl->ua = ua;
}

lh_sample_verdict lh_sample_check(const float *logits, int V, const lh_sample_params *p, double u,
                                  int32_t token, double tol, lh_sample_scratch *s) {
  LH_CHECK(logits && p && s, "lh_sample_check: logits, params and scratch are required");
  LH_CHECK(V > 0 && V <= s->V, "lh_sample_check: V = %d, scratch was created for %d", V, s->V);
  LH_CHECK(lh_sample_params_validate(p) == LH_ERR_OK, "lh_sample_check: %s", lh_last_error());
  LH_CHECK(tol >= 0.0 && tol < 1.0, "lh_sample_check: tol = %g, expected [0, 1)", tol);
  LH_CHECK(u >= 0.0 && u < 1.0, "lh_sample_check: u = %.17g, expected [0, 1) (lh_sample_uniform)",
           u);
  if (token < 0 || token >= V) return LH_SAMPLE_INCONSISTENT;
  lh__logits g;
  lh__sample_scan(logits, V, s, &g);
  if (p->temperature == 0.0f) return check_greedy(&g, V, token, tol);
  /* logit -inf or NaN: weight 0 on every machine, never chosen */
  if (g.l[token] == -INFINITY) return LH_SAMPLE_INCONSISTENT;

  bool plain = !(p->top_k > 0 && p->top_k < V) && !(p->top_p < 1.0f);
  lh__sample_weights(&g, V, p->temperature, plain ? p->min_p : 0.0, s);
  place pl;
  if (plain)
    place_plain(s->w, s->blocks, V, p->min_p, tol, token, &pl);
  else
    place_flags(&g, V, p, tol, token, s, &pl);
  if (!pl.poss) return LH_SAMPLE_INCONSISTENT;

  double sb = pl.sb, ub = pl.ub, sa = pl.sa, ua = pl.ua, wt = s->w[token];
  double lo_min = ratio(sb, sb + wt + sa + ua), lo_max = ratio(sb + ub, sb + ub + wt + sa);
  double hi_min = ratio(sb + wt, sb + wt + sa + ua),
         hi_max = ratio(sb + ub + wt, sb + ub + wt + sa);
  if (pl.in) { /* the canonical interval lies within the bounds; keep it so under rounding */
    double lo = pl.c_before / pl.total, hi = pl.c_after / pl.total;
    lo_min = fmin(lo_min, lo), lo_max = fmax(lo_max, lo);
    hi_min = fmin(hi_min, hi), hi_max = fmax(hi_max, hi);
  }
  /* the ends of the CDF are no boundary when no token can possibly lie beyond them */
  bool first = sb + ub == 0.0, last = sa + ua == 0.0;
  if (u < lo_min - tol || u >= hi_max + tol) return LH_SAMPLE_INCONSISTENT;
  if (pl.sure && (first || u >= lo_max + tol) && (last || u < hi_min - tol))
    return LH_SAMPLE_CONSISTENT;
  return LH_SAMPLE_BORDERLINE;
}
