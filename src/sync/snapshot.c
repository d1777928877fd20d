/* longhaul sync: snapshot blobs, the whole bf16 slab as one zstd frame of its two byte planes
 * (docs/PROTOCOL.md, "Snapshots"). The header is checked against the caller's element limit
 * before anything is allocated; the frame must declare exactly the slab's size and end the blob;
 * the decoded slab must hash to the header's hash. Streaming both ways: no second copy. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "longhaul/sync.h"
#include "sync_impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error                                                                                             \
    "a slab's identity is the hash of its little-endian bytes: longhaul needs a little-endian host"
#endif

#define MAGIC "LHSN"
#define CHUNK ((size_t)1 << 16)

/* Header fields, by byte offset. */
enum {
  H_MAGIC = 0,     /* 4 bytes "LHSN" */
  H_FORMAT = 4,    /* u16 LH_SYNC_SNAPSHOT_FORMAT */
  H_RESERVED = 6,  /* u16, 0 */
  H_ELEMENTS = 8,  /* u64 n, bf16 values */
  H_PAYLOAD = 16,  /* u64 bytes of the zstd frame that follows the header */
  H_HASH = 24,     /* 32 bytes BLAKE2b-256 of the slab's 2n little-endian bytes */
  H_RESERVED2 = 56 /* 8 bytes, 0 */
};
_Static_assert(H_RESERVED2 + 8 == LH_SYNC_SNAPSHOT_HEADER, "the snapshot header is 64 bytes");
_Static_assert(H_HASH + LH_HASH_BYTES == H_RESERVED2, "the hash ends at the second reserved field");

void lh_sync_slab_hash(const uint16_t *slab, size_t n, uint8_t hash[LH_HASH_BYTES]) {
  lh_hash256(slab, n * sizeof *slab, hash);
}

/* ---------------------------------------------------------------- encoding */

lh_err lh_sync_snapshot_encode(const uint16_t *slab, size_t n, int level, uint8_t **out,
                               size_t *len) {
  *out = NULL;
  *len = 0;
  if (n < 1 || n > (size_t)LH_SYNC_INT_MAX)
    return lh_errorf(LH_ERR_INVAL, "snapshot: %zu values, expected 1 .. 2^53-1", n);
  if (level < 1 || level > 19)
    return lh_errorf(LH_ERR_INVAL, "snapshot: zstd level %d, expected 1 .. 19", level);
  size_t raw = 2 * n, bound = ZSTD_compressBound(raw);
  if (ZSTD_isError(bound) || bound > SIZE_MAX - LH_SYNC_SNAPSHOT_HEADER)
    return lh_errorf(LH_ERR_LIMIT, "snapshot: %zu values are too many for one zstd frame", n);
  uint8_t *buf = lh_try_malloc_aligned(LH_SYNC_SNAPSHOT_HEADER + bound, "snapshot");
  uint8_t *chunk = malloc(CHUNK);
  ZSTD_CCtx *cc = ZSTD_createCCtx();
  lh_err e = LH_ERR_OK;
  if (!buf || !chunk || !cc) {
    e = lh_errorf(LH_ERR_NOMEM, "snapshot: cannot allocate the compressor");
    goto out;
  }
  size_t r = ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1);
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 0);
  /* levels 1..19 use windows of at most 2^23 bytes: within LH_SYNC_SNAPSHOT_WINDOW */
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setPledgedSrcSize(cc, raw);
  if (ZSTD_isError(r)) {
    e = lh_errorf(LH_ERR_IO, "snapshot: zstd: %s", ZSTD_getErrorName(r));
    goto out;
  }
  ZSTD_outBuffer ob = {buf + LH_SYNC_SNAPSHOT_HEADER, bound, 0};
  /* the high byte of every value (sign, exponent, top mantissa bit), then every low byte */
  for (int plane = 0; plane < 2; plane++) {
    for (size_t i = 0; i < n; i += CHUNK) {
      size_t m = n - i < CHUNK ? n - i : CHUNK;
      for (size_t j = 0; j < m; j++)
        chunk[j] = plane == 0 ? (uint8_t)(slab[i + j] >> 8) : (uint8_t)slab[i + j];
      ZSTD_inBuffer ib = {chunk, m, 0};
      while (ib.pos < ib.size) {
        r = ZSTD_compressStream2(cc, &ob, &ib, ZSTD_e_continue);
        if (ZSTD_isError(r)) {
          e = lh_errorf(LH_ERR_IO, "snapshot: zstd: %s", ZSTD_getErrorName(r));
          goto out;
        }
        LH_CHECK(ob.pos < ob.size || ib.pos == ib.size, "ZSTD_compressBound is enough");
      }
    }
  }
  ZSTD_inBuffer none = {NULL, 0, 0};
  do {
    r = ZSTD_compressStream2(cc, &ob, &none, ZSTD_e_end);
    if (ZSTD_isError(r)) {
      e = lh_errorf(LH_ERR_IO, "snapshot: zstd: %s", ZSTD_getErrorName(r));
      goto out;
    }
    LH_CHECK(r == 0 || ob.pos < ob.size, "ZSTD_compressBound is enough");
  } while (r != 0);
  memcpy(buf + H_MAGIC, MAGIC, 4);
  lh_put_le16(buf + H_FORMAT, LH_SYNC_SNAPSHOT_FORMAT);
  lh_put_le16(buf + H_RESERVED, 0);
  lh_put_le64(buf + H_ELEMENTS, n);
  lh_put_le64(buf + H_PAYLOAD, ob.pos);
  lh_sync_slab_hash(slab, n, buf + H_HASH);
  memset(buf + H_RESERVED2, 0, 8);
  *out = buf;
  *len = LH_SYNC_SNAPSHOT_HEADER + ob.pos;
  buf = NULL;
out:
  ZSTD_freeCCtx(cc);
  free(chunk);
  free(buf);
  return e;
}

/* ---------------------------------------------------------------- decoding */

lh_err lh_sync_snapshot_info(const uint8_t *data, size_t len, size_t max_elements, const char *what,
                             size_t *n, uint8_t hash[LH_HASH_BYTES]) {
  *n = 0;
  if (len < LH_SYNC_SNAPSHOT_HEADER)
    return lh_errorf(LH_ERR_FORMAT, "%s: %zu bytes, shorter than the %d-byte snapshot header", what,
                     len, LH_SYNC_SNAPSHOT_HEADER);
  if (memcmp(data + H_MAGIC, MAGIC, 4)) {
    char shown[32];
    lh_escape((const char *)data, 4, shown, sizeof shown);
    return lh_errorf(LH_ERR_FORMAT, "%s: magic \"%s\", expected \"%s\": not a longhaul snapshot",
                     what, shown, MAGIC);
  }
  uint16_t format = lh_get_le16(data + H_FORMAT);
  if (format != LH_SYNC_SNAPSHOT_FORMAT)
    return lh_errorf(LH_ERR_UNSUPPORTED, "%s: snapshot format %u; this longhaul reads format %d",
                     what, format, LH_SYNC_SNAPSHOT_FORMAT);
  static const int reserved[] = {H_RESERVED,      H_RESERVED + 1,  H_RESERVED2,     H_RESERVED2 + 1,
                                 H_RESERVED2 + 2, H_RESERVED2 + 3, H_RESERVED2 + 4, H_RESERVED2 + 5,
                                 H_RESERVED2 + 6, H_RESERVED2 + 7};
  for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
    if (data[reserved[i]])
      return lh_errorf(LH_ERR_FORMAT, "%s: reserved header byte %d is 0x%02x, expected 0", what,
                       reserved[i], data[reserved[i]]);
  uint64_t elements = lh_get_le64(data + H_ELEMENTS), payload = lh_get_le64(data + H_PAYLOAD);
  if (elements < 1 || elements > max_elements)
    return lh_errorf(LH_ERR_LIMIT, "%s: %" PRIu64 " values, expected 1 .. %zu", what, elements,
                     max_elements);
  if (payload != len - LH_SYNC_SNAPSHOT_HEADER)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: the header declares a %" PRIu64 "-byte zstd frame, the blob holds %zu "
                     "bytes after the header (truncated or padded)",
                     what, payload, len - LH_SYNC_SNAPSHOT_HEADER);
  *n = (size_t)elements;
  if (hash) memcpy(hash, data + H_HASH, LH_HASH_BYTES);
  return LH_ERR_OK;
}

lh_err lh_sync_snapshot_decode(const uint8_t *data, size_t len, size_t max_elements,
                               const char *what, uint16_t **slab, size_t *n) {
  *slab = NULL;
  *n = 0;
  size_t count = 0;
  uint8_t want[LH_HASH_BYTES];
  if (max_elements > SIZE_MAX / 2) max_elements = SIZE_MAX / 2;
  lh_err e = lh_sync_snapshot_info(data, len, max_elements, what, &count, want);
  if (e) return e;
  const uint8_t *frame = data + LH_SYNC_SNAPSHOT_HEADER;
  size_t flen = len - LH_SYNC_SNAPSHOT_HEADER, raw = 2 * count;
  unsigned long long declared = ZSTD_getFrameContentSize(frame, flen);
  if (declared == ZSTD_CONTENTSIZE_ERROR)
    return lh_errorf(LH_ERR_FORMAT, "%s: byte %d: not a zstd frame", what, LH_SYNC_SNAPSHOT_HEADER);
  if (declared == ZSTD_CONTENTSIZE_UNKNOWN)
    return lh_errorf(LH_ERR_FORMAT, "%s: the zstd frame does not declare its size", what);
  if (declared != raw)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: the zstd frame holds %llu bytes, the header's %zu values need %zu", what,
                     declared, count, raw);
  uint16_t *out = lh_try_malloc_aligned(raw, what);
  uint8_t *chunk = malloc(CHUNK);
  ZSTD_DCtx *dc = ZSTD_createDCtx();
  if (!out || !chunk || !dc) {
    e = lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %zu bytes for the slab", what, raw);
    goto out;
  }
  size_t r = ZSTD_DCtx_setParameter(dc, ZSTD_d_windowLogMax, LH_SYNC_SNAPSHOT_WINDOW);
  if (ZSTD_isError(r)) {
    e = lh_errorf(LH_ERR_IO, "%s: zstd: %s", what, ZSTD_getErrorName(r));
    goto out;
  }
  ZSTD_inBuffer ib = {frame, flen, 0};
  size_t pos = 0; /* bytes of the two planes decoded so far */
  for (;;) {
    size_t in_before = ib.pos;
    ZSTD_outBuffer ob = {chunk, CHUNK, 0};
    r = ZSTD_decompressStream(dc, &ob, &ib);
    if (ZSTD_isError(r)) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: zstd frame: %s (near byte %zu)", what, ZSTD_getErrorName(r),
                    LH_SYNC_SNAPSHOT_HEADER + ib.pos);
      goto out;
    }
    if (ob.pos > raw - pos) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: the zstd frame decodes to more than %zu bytes", what, raw);
      goto out;
    }
    for (size_t j = 0; j < ob.pos; j++, pos++) {
      if (pos < count)
        out[pos] = (uint16_t)(chunk[j] << 8);
      else
        out[pos - count] |= chunk[j];
    }
    if (r == 0) break; /* the frame is complete */
    if (ob.pos == 0 && (ib.pos == ib.size || ib.pos == in_before)) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: the zstd frame is truncated (%zu of %zu bytes decoded)",
                    what, pos, raw);
      goto out;
    }
  }
  if (ib.pos != ib.size) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: %zu bytes after the zstd frame's end (byte %zu)", what,
                  ib.size - ib.pos, LH_SYNC_SNAPSHOT_HEADER + ib.pos);
    goto out;
  }
  if (pos != raw) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: the zstd frame decodes to %zu bytes, expected %zu", what, pos,
                  raw);
    goto out;
  }
  uint8_t got[LH_HASH_BYTES];
  lh_sync_slab_hash(out, count, got);
  if (memcmp(got, want, LH_HASH_BYTES)) {
    char gh[2 * LH_HASH_BYTES + 1], wh[2 * LH_HASH_BYTES + 1];
    lh__sync_hex(got, LH_HASH_BYTES, gh);
    lh__sync_hex(want, LH_HASH_BYTES, wh);
    e = lh_errorf(LH_ERR_MISMATCH, "%s: the slab decodes to hash %s, the header says %s", what, gh,
                  wh);
    goto out;
  }
  *slab = out;
  *n = count;
  out = NULL;
out:
  ZSTD_freeDCtx(dc);
  free(chunk);
  free(out);
  return e;
}
