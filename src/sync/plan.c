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

lh_err lh_sync_plan(const lh_sync_manifest *versions, int n, int64_t from, int64_t to,
                    lh_sync_route *route) {
  memset(route, 0, sizeof *route);
  if (n < 0 || (n > 0 && !versions)) return lh_errorf(LH_ERR_INVAL, "plan: %d versions", n);
  if (from < LH_SYNC_NONE || to < 0)
    return lh_errorf(LH_ERR_INVAL,
                     "plan: from version %" PRId64 " to %" PRId64
                     ", expected versions >= 0 (from may be none)",
                     from, to);
  entry *order = malloc(((size_t)n + 1) * sizeof *order);
  best *b = malloc(((size_t)n + 1) * sizeof *b);
  lh_err e = LH_ERR_OK;
  if (!order || !b) {
    e = lh_errorf(LH_ERR_NOMEM, "plan: cannot allocate for %d versions", n);
    goto out;
  }
  for (int i = 0; i < n; i++)
    order[i] = (entry){versions[i].version, i};
  qsort(order, (size_t)n, sizeof *order, cmp_entry);
  for (int i = 0; i < n; i++) {
    const lh_sync_manifest *m = &versions[order[i].index];
    if (i > 0 && order[i - 1].version == m->version) {
      e = lh_errorf(LH_ERR_INVAL, "plan: version %" PRId64 " is listed twice", m->version);
      goto out;
    }
    if (m->n_blobs < 0 || m->n_blobs > LH_SYNC_MAX_BLOBS) {
      e = lh_errorf(LH_ERR_INVAL, "plan: version %" PRId64 " has %d blobs", m->version, m->n_blobs);
      goto out;
    }
    for (int k = 0; k < m->n_blobs; k++) {
      const lh_sync_blob_ref *r = &m->blobs[k];
      bool ok = r->kind == LH_SYNC_SNAPSHOT ||
                (r->kind == LH_SYNC_PATCH && r->from >= 0 && r->from < m->version);
      if (!ok) {
        e = lh_errorf(LH_ERR_INVAL,
                      "plan: version %" PRId64 ": blob %d is neither a snapshot nor a patch from "
                      "an older version",
                      m->version, k);
        goto out;
      }
    }
  }
  int t = find(order, n, to);
  if (t < 0) {
    e = lh_errorf(LH_ERR_NOTFOUND, "plan: version %" PRId64 " is not published", to);
    goto out;
  }
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
    char held[32];
    if (from == LH_SYNC_NONE)
      snprintf(held, sizeof held, "no weights");
    else
      snprintf(held, sizeof held, "version %" PRId64, from);
    e = lh_errorf(LH_ERR_NOTFOUND,
                  "plan: no published blobs lead from %s to version %" PRId64
                  " (no snapshot on the way, and no chain of patches from what is held)",
                  held, to);
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
