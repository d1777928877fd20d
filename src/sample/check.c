/* The verifier's side of sampling: recompute the canonical kept set and the submitted token's
 * CDF interval, and say whether the token is chosen on every machine whose logits differ from
 * the verifier's by at most logit_tol each, on none of them, or on some (docs/ALGORITHMS.md,
 * "The check"). Never allocates; O(V) plus a candidate sort. */
#include <math.h>

#include "sample_impl.h"

/* What the noise model allows, in the numbers every test uses. A worker's logits l' differ
 * from the verifier's l by at most tol each. A difference of two logits then moves by at most
 * 2 tol; the ratio of two weights w = exp((l - l_max) / T) by at most a factor exp(2 tol / T),
 * and so does w_i = p_i / max p, the ratio min-p tests. Each comparison of one sum of weights
 * with another is a ratio too (the common factor exp(-(l'_max - l_max) / T) cancels), so the
 * bounds below take each weight independently within a factor exp(tol / T) of the others'
 * scale, i.e. the weights on one side against those on the other within r = exp(2 tol / T). */
typedef struct {
  double tol2;    /* 2 tol, a hair wider so that the float differences compared with it are safe */
  bool cold;      /* 2 tol / T >= 300: r and the weights computed here bound nothing (check_cold) */
  double r;       /* exp(2 tol / T), raised by eps (when not cold) */
  double u_faint; /* below this u, weights near exp's underflow decide (faint_weights) */
  double eps;     /* relative rounding allowance: 8 (V + 2048) 2^-53, where (V + 713) 2^-53 bounds
                     the relative error of any weight (exp's argument and result) and sum of weights
                     (up to V terms) on either machine */
} noise;

static noise noise_of(double tol, double T, int V) {
  noise nz;
  nz.tol2 = 2.0 * tol * (1.0 + 0x1p-40);
  nz.eps = ((double)V + 2048.0) * 0x1p-50;
  double x = T > 0.0 ? nz.tol2 * (1.0 / T) : INFINITY; /* as the sampler scales: * (1 / T) */
  nz.cold = !(x < 300.0);
  nz.r = nz.cold ? INFINITY : exp(x) * (1.0 + nz.eps);
  /* a weight that is 0 on one machine and not on another is below exp(x - 708) of the total
   * on either, so such weights move each bound by at most f = 2 V exp(x - 708), which the
   * allowance eps covers unless u < 2 f / eps < 2^53 exp(x - 708) */
  nz.u_faint = nz.cold ? 1.0 : fmax(0x1p-900, 0x1p53 * exp(x - 708.0));
  return nz;
}

/* l_a - l_b; equal logits (-inf included) differ by 0. Exact for floats unless their exponents
 * are far apart, and then the difference dwarfs any tol. */
static inline double gap(float a, float b) {
  return a == b ? 0.0 : (double)a - (double)b;
}

/* a ranks above b (logit descending, id ascending) on every machine */
static inline bool above_always(const float *l, int32_t a, int32_t b, double tol2) {
  double d = gap(l[a], l[b]);
  return d > tol2 || (d == tol2 && a < b);
}

/* a ranks above b on some machine (a == b included when tol > 0) */
static inline bool above_maybe(const float *l, int32_t a, int32_t b, double tol2) {
  double d = gap(l[a], l[b]);
  return d > -tol2 || (d == -tol2 && a < b);
}

/* Narrows a token's flags by one filter: `in` its canonical membership, `sure` that every
 * machine agrees with it (keeps it if in, drops it if not). */
static inline void narrow(uint8_t *f, bool in, bool sure) {
  uint8_t x = *f;
  if (!in) x &= (uint8_t)~LH__IN;
  if (!in && sure) x &= (uint8_t)~LH__POSS;
  if (!in || !sure) x &= (uint8_t)~LH__SURE;
  *f = x;
}

/* Min-p keeps w >= min_p; w moves by at most a factor r. */
static inline void minp_class(double w, double minp, double r, bool *in, bool *sure) {
  *in = w >= minp;
  *sure = *in ? w >= minp * r : w * r < minp;
}

/* Top-k: the tokens that rank above a given one on some machine (or on every machine) are a
 * prefix of the rank order. A kept token stays kept on every machine iff the best dropped one
 * cannot rank above it; a dropped token stays out iff the k-th best always ranks above it. */
static void check_topk(const lh__logits *g, int V, int k, const noise *nz, lh_sample_scratch *s) {
  const float *l = g->l;
  uint8_t *flags = s->flags;
  lh__sample_topk(l, V, k, s->heap);
  int32_t kid = s->heap[0], out = -1; /* the k-th best; the best dropped */
  float lk = l[kid];
  for (int i = 0; i < V; i++) {
    bool in = l[i] > lk || (l[i] == lk && i <= kid);
    flags[i] = in ? flags[i] : (uint8_t)(flags[i] & ~LH__IN);
    out = !in && (out < 0 || l[i] > l[out]) ? i : out;
  }
  for (int i = 0; i < V; i++) {
    bool in = flags[i] & LH__IN;
    bool sure = in ? above_always(l, i, out, nz->tol2) : above_always(l, kid, i, nz->tol2);
    narrow(&flags[i], in, sure);
  }
}

/* Top-p over the tokens the top-k step left possible. The candidate at rank q (id i) is kept
 * iff the weight of the kept tokens ranked above it is below top_p * S: canonically, with the
 * sampler's own sum; on every machine if P, the weight of the possible tokens that may rank
 * above it, has P r < top_p S (with eps S for rounding); on no machine if Q, the weight of the
 * possible tokens that always rank above it, has Q >= top_p S r. (Q need not be surely kept by
 * top-k: top-k keeps a prefix of the rank order, so on a machine where i survives top-k, so do
 * they; where it does not, it is dropped anyway.) Past the first candidate dropped on every
 * machine, all are. The scan starts from the tokens whose w exceeds
 * (1 - top_p r) S / (4V) (together they hold more than top_p r S) and falls back to every
 * possible token if that is not enough. */
static void check_topp(const lh__logits *g, int V, double T, double top_p, const noise *nz,
                       lh_sample_scratch *s) {
  const float *l = g->l;
  const double *w = s->w;
  uint8_t *flags = s->flags;
  int32_t *cand = s->heap;
  uint64_t *keys = s->keys, *res = s->tmp;
  double S = g->S, target = top_p * S, r = nz->r, tol2 = nz->tol2;
  double drop_at = target * r, slack = nz->eps * S;
  int ib = s->idbits;
  float fl0 = lh__sample_logit_floor(g, T, (1.0 - top_p * r) * S / (4.0 * V));
  size_t nc = lh__sample_above(l, V, fl0, cand);
  /* the stop lies up to 2 tol below the crossing, and its band 2 tol below that: buckets
   * of a power of two in w */
  double span = 2.0 * tol2 / (T * 0.6931471805599453);
  int extra = 1 + (span < 60.0 ? (int)ceil(span) : 60);
  float fl1 = lh__sample_narrow_floor(g, T, w, cand, nc, drop_at, extra, fl0);
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
    double cum = 0.0, always = 0.0, poss = 0.0;
    bool crossed = false, ok = true;
    size_t r1 = 0, r2 = 0;
    stop = n;
    for (size_t q = 0; q < n; q++) {
      int32_t id = lh__key_id(keys[q], ib);
      for (; r1 < q; r1++) { /* Q: always above id */
        int32_t j = lh__key_id(keys[r1], ib);
        if (!above_always(l, j, id, tol2)) break;
        always += w[j];
      }
      if (crossed && always >= drop_at) {
        stop = q;
        break;
      }
      for (; r2 < n; r2++) { /* P: maybe above id, id itself included when tol > 0 */
        int32_t j = lh__key_id(keys[r2], ib);
        if (!above_maybe(l, j, id, tol2)) break;
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
      double P = r2 > q ? poss - w[id] : poss;
      bool sure_q = in ? (P + slack) * r < target : always >= drop_at;
      res[q] = (uint64_t)in | (uint64_t)sure_q << 1;
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

/* Greedy: every machine picks its argmax, ties to the lowest id. The best other token (in rank
 * order) decides: the token is chosen everywhere iff it always ranks above that one, nowhere
 * iff that one always ranks above it. */
static lh_sample_verdict check_greedy(const lh__logits *g, int V, int32_t token, double tol2) {
  const float *l = g->l;
  int32_t o = token == 0 ? 1 : 0;
  if (o >= V) return LH_SAMPLE_CONSISTENT; /* V = 1 */
  for (int i = o + 1; i < V; i++)
    if (i != token && l[i] > l[o]) o = i;
  if (above_always(l, token, o, tol2)) return LH_SAMPLE_CONSISTENT;
  if (above_always(l, o, token, tol2)) return LH_SAMPLE_INCONSISTENT;
  return LH_SAMPLE_BORDERLINE;
}

/* A token whose weight is 0 here but may be positive on another machine (a finite logit within
 * 2 tol below where exp gives 0, about 708 T below the maximum), or positive here but 0 on
 * another machine (within 2 tol above that point). Its weight, near 1e-308, moves no bound by
 * anything the rounding allowance does not cover, unless u is that small. */
static bool faint_weights(const lh__logits *g, const double *w, int V, double T, double tol2) {
  for (int i = 0; i < V; i++) {
    double d = (double)g->l[i] - g->lmax;
    if (w[i] == 0.0 && g->l[i] > -INFINITY && (d + tol2) / T >= -708.000001) return true;
    if (w[i] > 0.0 && (d - tol2) / T < -707.999999) return true;
  }
  return false;
}

/* 2 tol / T >= 300: a weight ratio moves by up to exp(300) or more, and a weight that is 0 here
 * (or 1e-300) may be 1 on another machine, so the weights computed here bound nothing. Only what
 * the logits alone decide: dropped by top-k on every machine, or no other weight positive on any
 * machine (every other logit more than 2 tol + 708 T below the token's), where every machine keeps
 * the token and picks it at every u. Everything else is BORDERLINE. */
static lh_sample_verdict check_cold(const lh__logits *g, int V, const lh_sample_params *p,
                                    int32_t token, const noise *nz, lh_sample_scratch *s) {
  const float *l = g->l;
  if (p->top_k > 0 && p->top_k < V) {
    memset(s->flags, LH__IN | LH__POSS | LH__SURE, (size_t)V);
    check_topk(g, V, p->top_k, nz, s);
    if (!(s->flags[token] & LH__POSS)) return LH_SAMPLE_INCONSISTENT;
  }
  double T = p->temperature;
  for (int i = 0; i < V; i++)
    if (i != token && !((gap(l[i], l[token]) + nz->tol2) / T < -708.000001))
      return LH_SAMPLE_BORDERLINE;
  return LH_SAMPLE_CONSISTENT;
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
static void place_plain(const double *w, const double *bs, int V, double minp, const noise *nz,
                        int32_t token, place *pl) {
  enum { B = LH__SAMPLE_BLOCK };
  int nb = (V + B - 1) / B;
  double total = 0.0, x[B], r = nz->r;
  for (int b = 0; b < nb; b++)
    total += bs[b];
  pl->total = total;
  int b0 = token / B * B;
  for (int o = 0; o < B; o++)
    x[o] = b0 + o < V && w[b0 + o] >= minp ? w[b0 + o] : 0.0;
  canonical_c(bs, x, token, pl);
  minp_class(w[token], minp, r, &pl->in, &pl->sure);
  pl->poss = pl->in || !pl->sure;
  double sb = 0.0, ub = 0.0, sa = 0.0, ua = 0.0;
  if (minp > 0.0) { /* minp_class, without branches */
    double keep = minp * r;
    for (int i = 0; i < token; i++) {
      double v = w[i];
      sb += v >= keep ? v : 0.0;
      ub += !(v >= keep) && !(v * r < minp) ? v : 0.0;
    }
    for (int i = token + 1; i < V; i++) {
      double v = w[i];
      sa += v >= keep ? v : 0.0;
      ua += !(v >= keep) && !(v * r < minp) ? v : 0.0;
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
static void place_flags(const lh__logits *g, int V, const lh_sample_params *p, const noise *nz,
                        int32_t token, lh_sample_scratch *s, place *pl) {
  enum { B = LH__SAMPLE_BLOCK };
  const double *w = s->w;
  uint8_t *flags = s->flags;
  memset(flags, LH__IN | LH__POSS | LH__SURE, (size_t)V);
  if (p->top_k > 0 && p->top_k < V) check_topk(g, V, p->top_k, nz, s);
  if (p->top_p < 1.0f) check_topp(g, V, p->temperature, p->top_p, nz, s);
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
      bool in, sure;
      minp_class(w[ids[j]], minp, nz->r, &in, &sure);
      narrow(&flags[ids[j]], in, sure);
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

/* Token k's share of the u at which the verifier's own pick is CONSISTENT: its pick interval
 * [cb, cb + v) / total inside [lo_max (1 + eps), hi_min (1 - eps)), the upper end waived when no
 * weight can lie after it (A = As + Au = 0); Bs, Bu (As, Au) the surely and the possibly kept
 * weight before (after) it. The interval is empty unless hi_min > lo_max, tested first without a
 * division (cross-multiplied). */
static inline double consistent_share(double Bs, double Bu, double v, double As, double Au,
                                      double cb, double total, double r, double e) {
  double B = Bs + Bu, A = As + Au;
  if (!((Bs + v) * (B * r + v + As) > B * r * (Bs + v + A * r))) return 0.0;
  double lo = ratio(B * r, B * r + v + As) * (1.0 + e), c0 = cb / total;
  double hi = A == 0.0 ? 1.0 : ratio(Bs + v, Bs + v + A * r) * (1.0 - e), c1 = (cb + v) / total;
  lo = lo > c0 ? lo : c0;
  hi = hi < c1 ? hi : c1;
  return hi > lo ? hi - lo : 0.0;
}

/* How one token is classed for consistent_mass: canonically kept, surely kept, possibly but not
 * surely kept. flags: place_flags's; NULL: min_p alone (minp_class; min_p 0 keeps every token
 * surely). */
static inline void classify(const uint8_t *flags, int i, double v, double minp, double keep,
                            double r, bool *in, bool *sure, bool *unc) {
  if (flags) {
    *in = flags[i] & LH__IN;
    *sure = flags[i] & LH__SURE;
    *unc = (flags[i] & (LH__SURE | LH__POSS)) == LH__POSS;
  } else {
    *in = v >= minp;
    *sure = v >= keep;
    *unc = !*sure && !(v * r < minp);
  }
}

/* Running sums over the ids before the one at hand. */
typedef struct {
  double Bs, Bu, cb; /* surely kept, possibly but not surely kept, canonically kept weight */
} prefix;

/* consistent_share of the ids [i0, i1), advancing the prefix over them. Ts, Tu: the totals of
 * the surely and of the other possibly kept weight. */
static double shares(const double *w, const uint8_t *flags, int i0, int i1, double minp, double Ts,
                     double Tu, double total, const noise *nz, prefix *pf) {
  double r = nz->r, e = nz->eps, keep = minp * r, mass = 0.0;
  double Bs = pf->Bs, Bu = pf->Bu, cb = pf->cb;
  if (!flags && !(minp > 0.0)) { /* every token surely kept */
    for (int i = i0; i < i1; i++) {
      double v = w[i], As = Ts - Bs - v;
      if (v > 0.0) mass += consistent_share(Bs, 0.0, v, As > 0.0 ? As : 0.0, 0.0, Bs, total, r, e);
      Bs += v;
    }
    pf->Bs = pf->cb = Bs;
    return mass;
  }
  for (int i = i0; i < i1; i++) {
    double v = w[i];
    bool in, sure, unc;
    classify(flags, i, v, minp, keep, r, &in, &sure, &unc);
    if (in && sure && v > 0.0) {
      double As = Ts - Bs - v, Au = Tu - Bu;
      mass +=
          consistent_share(Bs, Bu, v, As > 0.0 ? As : 0.0, Au > 0.0 ? Au : 0.0, cb, total, r, e);
    }
    cb += in ? v : 0.0;
    Bs += sure ? v : 0.0;
    Bu += unc ? v : 0.0;
  }
  pf->Bs = Bs, pf->Bu = Bu, pf->cb = cb;
  return mass;
}

/* The measure of the u in [0, 1) at which the verifier's own pick is CONSISTENT: the sum of
 * consistent_share over the canonically and surely kept tokens, ids ascending, with the sums of
 * the bounds over the ids before and after each. cb is a plain running sum here, not the
 * sampler's tree: the difference, about V 2^-53 of total, is far below the allowance the caller
 * adds. Most tokens of a large vocabulary have an empty share, and whole blocks of 64 are passed
 * over: a share is empty when B A r^2 >= (Bs + v)(v + As) (hi_min <= lo_max, multiplied out), so
 * whenever B A (r^2 - 1) >= v (Ts + Tu), and that holds for every token of a block if it holds
 * with B the weight possibly kept before the block, A after it, and v the block's largest
 * (passing over a non-empty share by rounding only raises the chance: safe). Two O(V) passes; the
 * block sums live in the scratch's sort buffers (keys, tmp), unused by then. */
static double consistent_mass(const double *w, const uint8_t *flags, int V, double minp,
                              double total, const noise *nz, lh_sample_scratch *s) {
  enum { BL = LH__SAMPLE_BLOCK };
  int nb = (V + BL - 1) / BL;
  double r = nz->r, keep = minp * r, Ts = 0.0, Tu = 0.0;
  prefix pf = {0.0, 0.0, 0.0};
  if (nb < 4) { /* a small vocabulary: every token */
    for (int i = 0; i < V; i++) {
      bool in, sure, unc;
      classify(flags, i, w[i], minp, keep, r, &in, &sure, &unc);
      Ts += sure ? w[i] : 0.0;
      Tu += unc ? w[i] : 0.0;
    }
    return shares(w, flags, 0, V, minp, Ts, Tu, total, nz, &pf);
  }
  /* per block: surely kept, other possibly kept, canonically kept weight, the largest surely kept
   * weight (4 nb doubles in 2 V: nb >= 4 means V > 192) */
  double *bs = (double *)s->keys, *bu = bs + nb, *bi = (double *)s->tmp, *bm = bi + nb;
  bool all_sure = !flags && !(minp > 0.0);
  for (int b = 0; b < nb; b++) {
    /* eight lanes, so that neither the sums nor the maximum wait on one another */
    double xs[8] = {0}, xu[8] = {0}, xi[8] = {0}, xm[8] = {0};
    int i0 = b * BL, i1 = i0 + BL < V ? i0 + BL : V;
    if (all_sure && i1 - i0 == BL) { /* the sampler's block sum, and the largest weight */
      for (int o = 0; o < BL; o += 8)
        for (int j = 0; j < 8; j++)
          xm[j] = w[i0 + o + j] > xm[j] ? w[i0 + o + j] : xm[j];
      xs[0] = xi[0] = s->blocks[b];
    } else {
      for (int i = i0; i < i1; i++) {
        double v = w[i];
        bool in, sure, unc;
        classify(flags, i, v, minp, keep, r, &in, &sure, &unc);
        int j = i % 8;
        xs[j] += sure ? v : 0.0;
        xu[j] += unc ? v : 0.0;
        xi[j] += in ? v : 0.0;
        xm[j] = sure && v > xm[j] ? v : xm[j];
      }
    }
    for (int j = 1; j < 8; j++) {
      xs[0] += xs[j], xu[0] += xu[j], xi[0] += xi[j];
      xm[0] = xm[j] > xm[0] ? xm[j] : xm[0];
    }
    bs[b] = xs[0], bu[b] = xu[0], bi[b] = xi[0], bm[b] = xm[0];
    Ts += xs[0];
    Tu += xu[0];
  }
  double mass = 0.0, r21 = r * r - 1.0, T = Ts + Tu;
  for (int b = 0; b < nb; b++) {
    double before = pf.Bs + pf.Bu, after = T - before - bs[b] - bu[b];
    if (before * after * r21 >= bm[b] * T) {
      pf.Bs += bs[b], pf.Bu += bu[b], pf.cb += bi[b];
      continue;
    }
    int i1 = (b + 1) * BL < V ? (b + 1) * BL : V;
    mass += shares(w, flags, b * BL, i1, minp, Ts, Tu, total, nz, &pf);
  }
  return mass;
}

/* 1 - mass, raised by the rounding allowance and the faint-weight band, within [0, 1] */
static double chance_of(double mass, const noise *nz) {
  double c = 1.0 - mass + 4.0 * nz->eps + nz->u_faint;
  return c < 0.0 ? 0.0 : c > 1.0 ? 1.0 : c;
}

lh_sample_verdict lh_sample_check_chance(const float *logits, int V, const lh_sample_params *p,
                                         double u, int32_t token, double logit_tol,
                                         lh_sample_scratch *s, double *chance) {
  LH_CHECK(logits && p && s, "lh_sample_check: logits, params and scratch are required");
  LH_CHECK(V > 0 && V <= s->V, "lh_sample_check: V = %d, scratch was created for %d", V, s->V);
  LH_CHECK(lh_sample_params_validate(p) == LH_ERR_OK, "lh_sample_check: %s", lh_last_error());
  LH_CHECK(logit_tol >= 0.0 && logit_tol < 1.0,
           "lh_sample_check: logit_tol = %g, expected [0, 1) (logit units)", logit_tol);
  LH_CHECK(u >= 0.0 && u < 1.0, "lh_sample_check: u = %.17g, expected [0, 1) (lh_sample_uniform)",
           u);
  double unused;
  if (!chance) chance = &unused;
  *chance = 1.0; /* for an INCONSISTENT token: not computed */
  if (token < 0 || token >= V) return LH_SAMPLE_INCONSISTENT;
  lh__logits g;
  lh__sample_scan(logits, V, s, &g);
  double T = p->temperature;
  noise nz = noise_of(logit_tol, T, V);
  /* Greedy and cold sampling: only the argmax can be CONSISTENT, and then at every u, so the
   * chance is 0 or 1. The token's verdict gives it: a CONSISTENT token is the argmax, and a
   * BORDERLINE one is the argmax in a near tie or a token that shows the argmax is not
   * CONSISTENT (it would be INCONSISTENT then). */
  if (T == 0.0) {
    lh_sample_verdict v = check_greedy(&g, V, token, nz.tol2);
    *chance = v == LH_SAMPLE_CONSISTENT ? 0.0 : 1.0;
    return v;
  }
  /* weight 0 on every machine (logit -inf or NaN, or so far below the maximum that exp gives 0
   * even 2 tol higher): never chosen */
  if (((double)g.l[token] - g.lmax + nz.tol2) / T < -708.000001) return LH_SAMPLE_INCONSISTENT;
  if (nz.cold) {
    lh_sample_verdict v = check_cold(&g, V, p, token, &nz, s);
    *chance = v == LH_SAMPLE_CONSISTENT ? 0.0 : 1.0;
    return v;
  }

  bool plain = !(p->top_k > 0 && p->top_k < V) && !(p->top_p < 1.0f);
  lh__sample_weights(&g, V, T, plain ? p->min_p : 0.0, s);
  place pl;
  if (plain)
    place_plain(s->w, s->blocks, V, p->min_p, &nz, token, &pl);
  else
    place_flags(&g, V, p, &nz, token, s, &pl);
  if (!pl.poss) return LH_SAMPLE_INCONSISTENT;
  if (chance != &unused)
    *chance = chance_of(
        consistent_mass(s->w, plain ? NULL : s->flags, V, p->min_p, pl.total, &nz, s), &nz);

  /* u near 0 picks the first token of any weight, which a faint one may be on another machine */
  if (u < nz.u_faint && faint_weights(&g, s->w, V, T, nz.tol2)) return LH_SAMPLE_BORDERLINE;
  /* the verifier's own choice, decided as lh_sample decides it */
  double thr = u * pl.total;
  bool pick = pl.in && pl.c_before <= thr && thr < pl.c_after;
  /* the token's interval [lo, hi) over every kept set between the sure and the possible ones
   * and every admissible weight: the weight on one side of a boundary against the other's
   * within the factor r */
  double r = nz.r, e = nz.eps, wt = s->w[token];
  double sb = pl.sb, sa = pl.sa, B = pl.sb + pl.ub, A = pl.sa + pl.ua;
  double lo_min = ratio(sb, sb + (wt + A) * r), hi_max = ratio((B + wt) * r, (B + wt) * r + sa);
  if (!pick && (u < lo_min * (1.0 - e) || u >= hi_max * (1.0 + e))) return LH_SAMPLE_INCONSISTENT;
  double lo_max = ratio(B * r, B * r + wt + sa), hi_min = ratio(sb + wt, sb + wt + A * r);
  /* the end 1 of the CDF is no boundary when no weight can lie after the token (nor is the
   * start 0: lo_max is 0 when none can lie before it) */
  if (pick && pl.sure && u >= lo_max * (1.0 + e) && (A == 0.0 || u < hi_min * (1.0 - e)))
    return LH_SAMPLE_CONSISTENT;
  return LH_SAMPLE_BORDERLINE;
}

lh_sample_verdict lh_sample_check(const float *logits, int V, const lh_sample_params *p, double u,
                                  int32_t token, double logit_tol, lh_sample_scratch *s) {
  return lh_sample_check_chance(logits, V, p, u, token, logit_tol, s, NULL);
}
