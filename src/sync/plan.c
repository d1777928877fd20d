/* longhaul sync: choosing what to fetch (docs/PROTOCOL.md, "Choosing what to fetch"). Pure
 * functions: the cheapest route of blobs from the version a worker holds to the one it wants, and
 * the publisher's rule for when a version also ships as a keyframe (a full snapshot). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/sync.h"

#define UNREACHED UINT64_MAX
#define START     (-1) /* the route starts here: from the held weights, or from nothing */

typedef struct best {
  uint64_t cost; /* bytes of the route to this version, UNREACHED when there is none */
  int steps;
  int prev; /* position (in version order) of the version the last blob starts from, or START */
  int blob; /* the last blob, an index into that manifest's blobs; -1 for the held version */
} best;

/* A published version and its index in the caller's array, sorted by version. */
typedef struct entry {
  int64_t version;
  int index;
} entry;

static int cmp_entry(const void *a, const void *b) {
  int64_t x = ((const entry *)a)->version, y = ((const entry *)b)->version;
  return (x > y) - (x < y);
}

/* Position of version v among the sorted ones, or -1. */
static int find(const entry *order, int n, int64_t v) {
  int lo = 0, hi = n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int64_t x = order[mid].version;
    if (x == v) return mid;
    if (x < v)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return -1;
}

static uint64_t add_sat(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - 1 - b ? UINT64_MAX - 1 : a + b;
}

/* Whether candidate c (last blob kind ck, from version cu) beats the current b (bk, bu). */
static bool better(const best *c, lh_sync_blob_kind ck, int64_t cu, const best *b,
                   lh_sync_blob_kind bk, int64_t bu) {
  if (b->cost == UNREACHED) return true;
  if (c->cost != b->cost) return c->cost < b->cost;
  if (c->steps != b->steps) return c->steps < b->steps;
  if (ck != bk) return ck == LH_SYNC_SNAPSHOT;
  return cu > bu;
}

/* Checks the published versions and sorts them into order[0..n): a duplicate version, a bad
 * blob count or a blob that is neither a snapshot nor a patch from an older version is
 * LH_ERR_INVAL; `to` not among them LH_ERR_NOTFOUND. *t: the position of `to`. */
static lh_err prepare(const lh_sync_manifest *versions, int n, int64_t from, int64_t to,
                      entry *order, int *t) {
  if (from < LH_SYNC_NONE || to < 0)
    return lh_errorf(LH_ERR_INVAL,
                     "plan: from version %" PRId64 " to %" PRId64
                     ", expected versions >= 0 (from may be none)",
                     from, to);
  for (int i = 0; i < n; i++)
    order[i] = (entry){versions[i].version, i};
  qsort(order, (size_t)n, sizeof *order, cmp_entry);
  for (int i = 0; i < n; i++) {
    const lh_sync_manifest *m = &versions[order[i].index];
    if (i > 0 && order[i - 1].version == m->version)
      return lh_errorf(LH_ERR_INVAL, "plan: version %" PRId64 " is listed twice", m->version);
    if (m->n_blobs < 0 || m->n_blobs > LH_SYNC_MAX_BLOBS)
      return lh_errorf(LH_ERR_INVAL, "plan: version %" PRId64 " has %d blobs", m->version,
                       m->n_blobs);
    for (int k = 0; k < m->n_blobs; k++) {
      const lh_sync_blob_ref *r = &m->blobs[k];
      bool ok = r->kind == LH_SYNC_SNAPSHOT ||
                (r->kind == LH_SYNC_PATCH && r->from >= 0 && r->from < m->version);
      if (!ok)
        return lh_errorf(LH_ERR_INVAL,
                         "plan: version %" PRId64 ": blob %d is neither a snapshot nor a patch "
                         "from an older version",
                         m->version, k);
    }
  }
  if ((*t = find(order, n, to)) < 0)
    return lh_errorf(LH_ERR_NOTFOUND, "plan: version %" PRId64 " is not published", to);
  return LH_ERR_OK;
}

/* The error for a version that no blobs lead to. */
static lh_err no_route(int64_t from, int64_t to) {
  char held[32];
  if (from == LH_SYNC_NONE)
    snprintf(held, sizeof held, "no weights");
  else
    snprintf(held, sizeof held, "version %" PRId64, from);
  return lh_errorf(LH_ERR_NOTFOUND,
                   "plan: no published blobs lead from %s to version %" PRId64
                   " (no snapshot on the way, and no chain of patches from what is held)",
                   held, to);
}

lh_err lh_sync_plan(const lh_sync_manifest *versions, int n, int64_t from, int64_t to,
                    lh_sync_route *route) {
  memset(route, 0, sizeof *route);
  if (n < 0 || (n > 0 && !versions)) return lh_errorf(LH_ERR_INVAL, "plan: %d versions", n);
  entry *order = malloc(((size_t)n + 1) * sizeof *order);
  best *b = malloc(((size_t)n + 1) * sizeof *b);
  lh_err e = LH_ERR_OK;
  int t = -1;
  if (!order || !b) {
    e = lh_errorf(LH_ERR_NOMEM, "plan: cannot allocate for %d versions", n);
    goto out;
  }
  if ((e = prepare(versions, n, from, to, order, &t))) goto out;
  if (from == to) goto out; /* nothing to fetch */
  /* Every patch goes from an older version to a newer one, so one pass in version order settles
   * each version before any patch from it is looked at. */
  for (int i = 0; i <= t; i++) {
    const lh_sync_manifest *m = &versions[order[i].index];
    b[i] = (best){UNREACHED, 0, START, -1};
    if (m->version == from) {
      b[i].cost = 0;
      continue;
    }
    lh_sync_blob_kind bk = LH_SYNC_SNAPSHOT;
    int64_t bu = LH_SYNC_NONE;
    for (int k = 0; k < m->n_blobs; k++) {
      const lh_sync_blob_ref *r = &m->blobs[k];
      best c = {r->size, 1, START, k};
      if (r->kind == LH_SYNC_PATCH) {
        if (r->from != from) {
          int j = find(order, n, r->from);
          if (j < 0 || b[j].cost == UNREACHED) continue;
          c = (best){add_sat(b[j].cost, r->size), b[j].steps + 1, j, k};
        }
      }
      if (better(&c, r->kind, r->from, &b[i], bk, bu)) {
        b[i] = c;
        bk = r->kind;
        bu = r->from;
      }
    }
  }
  if (b[t].cost == UNREACHED) {
    e = no_route(from, to);
    goto out;
  }
  int steps = b[t].steps;
  route->steps = malloc((size_t)steps * sizeof *route->steps);
  if (!route->steps) {
    e = lh_errorf(LH_ERR_NOMEM, "plan: cannot allocate %d steps", steps);
    goto out;
  }
  route->n = steps;
  route->bytes = b[t].cost;
  for (int i = t, s = steps - 1; s >= 0; i = b[i].prev, s--)
    route->steps[s] = (lh_sync_step){order[i].index, b[i].blob};
out:
  free(order);
  free(b);
  return e;
}

/* One state of the timed planner: the fewest bytes that reach a version in exactly s steps. */
typedef struct hop {
  uint64_t bytes; /* UNREACHED when no route of s steps reaches it */
  int prev;       /* position of the version the last blob starts from, or START */
  int blob;       /* the last blob, an index into that manifest's blobs */
  lh_sync_blob_kind kind;
  int64_t from; /* the last blob's `from` (ties: a patch from a newer version) */
} hop;

double lh_sync_route_seconds(const lh_sync_cost *c, uint64_t bytes, int steps) {
  int p = c->parallel >= 1 ? c->parallel : 1;
  return (double)bytes / c->bytes_per_s + c->rtt_s * (double)((steps + p - 1) / p);
}

lh_err lh_sync_plan_time(const lh_sync_manifest *versions, int n, int64_t from, int64_t to,
                         const lh_sync_cost *cost, lh_sync_route *route) {
  memset(route, 0, sizeof *route);
  if (n < 0 || (n > 0 && !versions)) return lh_errorf(LH_ERR_INVAL, "plan: %d versions", n);
  if (!(cost->rtt_s >= 0 && cost->rtt_s < 1e6) ||
      !(cost->bytes_per_s > 0 && cost->bytes_per_s < 1e300) || cost->parallel < 1)
    return lh_errorf(LH_ERR_INVAL,
                     "plan: round trip %g s, %g bytes/s, %d blobs at once: expected a round "
                     "trip >= 0, a rate > 0 and at least 1 blob at once",
                     cost->rtt_s, cost->bytes_per_s, cost->parallel);
  entry *order = malloc(((size_t)n + 1) * sizeof *order);
  hop *h = NULL;
  lh_err e = LH_ERR_OK;
  int t = -1;
  if (!order) {
    e = lh_errorf(LH_ERR_NOMEM, "plan: cannot allocate for %d versions", n);
    goto out;
  }
  if ((e = prepare(versions, n, from, to, order, &t))) goto out;
  if (from == to) goto out; /* nothing to fetch */
  /* A route's versions increase with every step, so it has at most t + 1 steps (and at most
   * LH_SYNC_PLAN_MAX_STEPS are looked at). h[s * (t + 1) + i]: version i in s steps. */
  int max_steps = t + 1 < LH_SYNC_PLAN_MAX_STEPS ? t + 1 : LH_SYNC_PLAN_MAX_STEPS, w = t + 1;
  h = malloc((size_t)(max_steps + 1) * (size_t)w * sizeof *h);
  if (!h) {
    e = lh_errorf(LH_ERR_NOMEM, "plan: cannot allocate for %d versions", n);
    goto out;
  }
  int held = find(order, t + 1, from); /* the held version's position, or -1 */
  for (int s = 0; s <= max_steps; s++) {
    for (int i = 0; i < w; i++) {
      hop *c = &h[s * w + i];
      *c = (hop){UNREACHED, START, -1, LH_SYNC_SNAPSHOT, LH_SYNC_NONE};
      if (s == 0) {
        if (i == held) c->bytes = 0;
        continue;
      }
      const lh_sync_manifest *m = &versions[order[i].index];
      if (m->version == from) continue; /* held: never fetched again */
      for (int k = 0; k < m->n_blobs; k++) {
        const lh_sync_blob_ref *r = &m->blobs[k];
        hop x = {r->size, START, k, r->kind, r->from};
        if (r->kind == LH_SYNC_PATCH) {
          if (r->from == from && held < 0) {
            if (s != 1) continue; /* a patch from a held version with no manifest of its own */
          } else {
            int j = find(order, i, r->from);
            if (j < 0 || h[(s - 1) * w + j].bytes == UNREACHED) continue;
            x.bytes = add_sat(h[(s - 1) * w + j].bytes, r->size);
            x.prev = j;
          }
        } else if (s != 1) {
          continue; /* a snapshot starts a route */
        }
        bool wins = c->bytes == UNREACHED || x.bytes < c->bytes ||
                    (x.bytes == c->bytes && x.kind != c->kind && x.kind == LH_SYNC_SNAPSHOT) ||
                    (x.bytes == c->bytes && x.kind == c->kind && x.from > c->from);
        if (wins) *c = x;
      }
    }
  }
  int steps = -1;
  double secs = 0;
  uint64_t bytes = 0;
  for (int s = 1; s <= max_steps; s++) {
    const hop *c = &h[s * w + t];
    if (c->bytes == UNREACHED) continue;
    double x = lh_sync_route_seconds(cost, c->bytes, s);
    if (steps < 0 || x < secs || (x == secs && c->bytes < bytes))
      steps = s, secs = x, bytes = c->bytes;
  }
  if (steps < 0) {
    e = no_route(from, to);
    goto out;
  }
  route->steps = malloc((size_t)steps * sizeof *route->steps);
  if (!route->steps) {
    e = lh_errorf(LH_ERR_NOMEM, "plan: cannot allocate %d steps", steps);
    goto out;
  }
  route->n = steps;
  route->bytes = bytes;
  route->seconds = secs;
  for (int i = t, s = steps; s >= 1; i = h[s * w + i].prev, s--)
    route->steps[s - 1] = (lh_sync_step){order[i].index, h[s * w + i].blob};
out:
  free(order);
  free(h);
  return e;
}

void lh_sync_route_free(lh_sync_route *route) {
  if (!route) return;
  free(route->steps);
  memset(route, 0, sizeof *route);
}

bool lh_sync_keyframe_due(int64_t every, int64_t version, int64_t last_keyframe,
                          uint64_t chain_bytes, uint64_t snapshot_bytes) {
  if (last_keyframe < 0 || version <= last_keyframe) return true;
  if (every >= 1 && version - last_keyframe >= every) return true;
  return chain_bytes > snapshot_bytes;
}
