/* longhaul sync: the content-addressed blob store (docs/PROTOCOL.md, "Blob store"). A blob is the
 * file DIR/<lowercase hex of its BLAKE2b-256>, written atomically and checked against its name
 * every time it is read, so a truncated or altered file is never served or applied as good. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "longhaul/sync.h"
#include "sync_impl.h"

char *lh_sync_blob_path(const char *dir, const uint8_t hash[LH_HASH_BYTES]) {
  char hex[2 * LH_HASH_BYTES + 1];
  lh__sync_hex(hash, LH_HASH_BYTES, hex);
  return lh_path_join(dir, hex);
}

bool lh_sync_blob_has(const char *dir, const uint8_t hash[LH_HASH_BYTES]) {
  char *path = lh_sync_blob_path(dir, hash);
  struct stat st;
  bool ok = stat(path, &st) == 0 && S_ISREG(st.st_mode);
  free(path);
  return ok;
}

lh_err lh_sync_blob_get(const char *dir, const uint8_t hash[LH_HASH_BYTES], size_t max_bytes,
                        uint8_t **data, size_t *len) {
  *data = NULL;
  *len = 0;
  char *path = lh_sync_blob_path(dir, hash);
  char *buf = NULL;
  size_t n = 0;
  lh_err e;
  struct stat st;
  if (stat(path, &st) != 0 && errno == ENOENT) {
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: no such blob in the store", path);
    goto out;
  }
  if ((e = lh_file_read(path, max_bytes, &buf, &n))) goto out;
  uint8_t got[LH_HASH_BYTES];
  lh_hash256(buf, n, got);
  if (memcmp(got, hash, LH_HASH_BYTES)) {
    char hex[2 * LH_HASH_BYTES + 1];
    lh__sync_hex(got, LH_HASH_BYTES, hex);
    e = lh_errorf(LH_ERR_MISMATCH,
                  "%s: the blob's %zu bytes hash to %s, not to its name: it is corrupted (remove "
                  "it and fetch it again)",
                  path, n, hex);
    goto out;
  }
  *data = (uint8_t *)buf;
  *len = n;
  buf = NULL;
out:
  free(buf);
  free(path);
  return e;
}

lh_err lh_sync_blob_put(const char *dir, const void *data, size_t len,
                        uint8_t hash[LH_HASH_BYTES]) {
  lh_hash256(data, len, hash);
  lh_err e = lh_mkdir_p(dir);
  if (e) return e;
  char *path = lh_sync_blob_path(dir, hash);
  struct stat st;
  if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == len) {
    /* already stored: keep the file (and its mtime, which caches see) when it is intact */
    uint8_t *old = NULL;
    size_t n = 0;
    e = lh_sync_blob_get(dir, hash, len, &old, &n);
    free(old);
    if (e == LH_ERR_OK) goto out;
  }
  e = lh_file_write_atomic(path, data, len);
out:
  free(path);
  return e;
}
