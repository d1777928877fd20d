/* longhaul sync: applying a route's blobs (lh_sync_apply_blob, also a worker's sync), and
 * rebuilding a range of published versions from a blob store (a restarted publisher's kept
 * weights). One pass along the chain: the cheapest route to the first version,
 * then from each version to the next, so each blob is read and applied once and each slab is
 * checked against its manifest without hashing it again. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/patch.h"
#include "longhaul/sync.h"

lh_err lh_sync_apply_blob(const lh_sync_blob_ref *b, int64_t version, const uint8_t *data,
                          size_t len, uint64_t n, uint16_t **slab, uint8_t hash[LH_HASH_BYTES],
                          bool *known) {
  lh_err e;
  size_t cnt = 0;
  if (b->kind == LH_SYNC_SNAPSHOT) {
    uint16_t *fresh = NULL;
    if (!(e = lh_sync_snapshot_decode(data, len, (size_t)n, "snapshot", &fresh, &cnt)) && cnt != n)
      e = lh_errorf(LH_ERR_MISMATCH,
                    "version %" PRId64 ": the snapshot holds %zu values, the manifest %" PRIu64,
                    version, cnt, n);
    if (!e && !(e = lh_sync_snapshot_info(data, len, (size_t)n, "snapshot", &cnt, hash))) {
      free(*slab);
      *slab = fresh;
      fresh = NULL;
      *known = true;
    }
    free(fresh);
    return e;
  }
  if (!*slab)
    return lh_errorf(LH_ERR_FORMAT, "version %" PRId64 ": a patch before any snapshot", version);
  lh_patch_info info = {0};
  if (!(e = lh_patch_apply(*slab, n, data, len, *known ? hash : NULL)) &&
      !(e = lh_patch_read_info(data, len, &info))) {
    memcpy(hash, info.child_hash, LH_HASH_BYTES);
    *known = true;
  }
  lh_patch_info_free(&info);
  return e;
}

/* Applies a route's blobs from dir to *slab (n values; NULL: none yet), hash ending as the
 * result's (lh_sync_apply_blob). */
static lh_err apply_route(const lh_sync_manifest *versions, const lh_sync_route *route,
                          const char *dir, uint64_t n, uint16_t **slab, uint8_t hash[LH_HASH_BYTES],
                          bool *known) {
  lh_err e = LH_ERR_OK;
  for (int i = 0; !e && i < route->n; i++) {
    const lh_sync_manifest *m = &versions[route->steps[i].manifest];
    const lh_sync_blob_ref *b = &m->blobs[route->steps[i].blob];
    uint8_t *data = NULL;
    size_t len = 0;
    if ((e = lh_sync_blob_get(dir, b->hash, (size_t)b->size, &data, &len))) break;
    e = lh_sync_apply_blob(b, m->version, data, len, n, slab, hash, known);
    free(data);
  }
  return e;
}

lh_err lh_sync_rebuild(const lh_sync_manifest *versions, int n, const char *dir, int64_t lo,
                       int64_t hi, lh_sync_rebuild_fn each, void *ctx) {
  if (lo < 0 || hi < lo)
    return lh_errorf(LH_ERR_INVAL, "rebuild: versions %" PRId64 " .. %" PRId64 " asked", lo, hi);
  uint16_t *slab = NULL;
  uint8_t hash[LH_HASH_BYTES];
  bool known = false; /* whether hash is slab's */
  uint64_t count = 0; /* values of lo's slab: every later one has as many */
  lh_err e = LH_ERR_OK;
  for (int64_t v = lo; !e && v <= hi; v++) {
    lh_sync_route route = {0};
    if ((e = lh_sync_plan(versions, n, v == lo ? LH_SYNC_NONE : v - 1, v, &route))) break;
    const lh_sync_manifest *m = &versions[route.steps[route.n - 1].manifest];
    if (v == lo) count = m->elements;
    if (m->elements != count)
      e = lh_errorf(LH_ERR_MISMATCH,
                    "rebuild: version %" PRId64 " has %" PRIu64 " values, version %" PRId64
                    " has %" PRIu64,
                    v, m->elements, lo, count);
    if (!e) e = apply_route(versions, &route, dir, count, &slab, hash, &known);
    lh_sync_route_free(&route);
    if (!e && memcmp(hash, m->slab, LH_HASH_BYTES))
      e = lh_errorf(LH_ERR_MISMATCH,
                    "rebuild: version %" PRId64 ": the weights do not hash to the manifest's", v);
    if (!e) e = each(ctx, v, slab);
  }
  free(slab);
  return e;
}
