/* longhaul sync: policy manifests, canonical JSON signed with Ed25519 (docs/PROTOCOL.md,
 * "Manifests"). One serializer writes the canonical bytes; the verifier parses with jansson
 * (after bounding the cost), extracts the fields, re-serializes and requires the very same bytes,
 * so a manifest has exactly one encoding and the signature covers exactly what was read. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/sync.h"
#include "sync_impl.h"

#define CONTEXT_LEN (sizeof LH_SYNC_SIGNING_CONTEXT - 1)
/* jansson's cost bound: a valid manifest opens 2 + n_blobs brackets and has fewer than 600
 * separators; these leave room and still cap the tree at a few hundred kilobytes. */
#define MAX_OPEN   128
#define MAX_TOKENS 2048
/* The canonical text of the largest valid manifest (64 blobs of 20-digit numbers) is under
 * 13 KB; the serializer's buffer is the input limit. */
#define TEXT_CAP       LH_SYNC_MANIFEST_MAX_BYTES
#define MODEL_FILE_MAX ((uint64_t)256 << 20)

/* ---------------------------------------------------------------- canonical serializer */

typedef struct text {
  char *buf;
  size_t len, cap;
} text;

static void put(text *t, const char *s, size_t n) {
  LH_CHECK(t->len + n <= t->cap, "a valid manifest's canonical text fits in %zu bytes", t->cap);
  memcpy(t->buf + t->len, s, n);
  t->len += n;
}
static void puts_(text *t, const char *s) {
  put(t, s, strlen(s));
}
static void put_u64(text *t, uint64_t v) {
  char num[24];
  int n = snprintf(num, sizeof num, "%" PRIu64, v);
  put(t, num, (size_t)n);
}
static void put_hex(text *t, const uint8_t *bytes, size_t n) {
  char hex[2 * LH_SYNC_SIGNATURE_BYTES + 1];
  lh__sync_hex(bytes, n, hex);
  put(t, "\"", 1);
  put(t, hex, 2 * n);
  put(t, "\"", 1);
}

/* The canonical JSON of a checked manifest whose blobs are sorted, with or without its
 * "signature" member. Members in bytewise order of their names. */
static void serialize(const lh_sync_manifest *m, bool with_signature, text *t) {
  puts_(t, "{\"blobs\":[");
  for (int i = 0; i < m->n_blobs; i++) {
    const lh_sync_blob_ref *b = &m->blobs[i];
    if (i) puts_(t, ",");
    puts_(t, "{");
    if (b->kind == LH_SYNC_PATCH) {
      puts_(t, "\"from\":");
      put_u64(t, (uint64_t)b->from);
      puts_(t, ",");
    }
    puts_(t, "\"hash\":");
    put_hex(t, b->hash, LH_HASH_BYTES);
    puts_(t, b->kind == LH_SYNC_PATCH ? ",\"kind\":\"patch\",\"size\":"
                                      : ",\"kind\":\"snapshot\",\"size\":");
    put_u64(t, b->size);
    puts_(t, "}");
  }
  puts_(t, "],\"config\":");
  put_hex(t, m->config, LH_HASH_BYTES);
  puts_(t, ",\"elements\":");
  put_u64(t, m->elements);
  puts_(t, ",\"format\":1,\"generation\":");
  if (m->has_generation)
    put_hex(t, m->generation, LH_HASH_BYTES);
  else
    puts_(t, "null");
  puts_(t, ",\"key\":");
  put_hex(t, m->key.bytes, LH_SYNC_PUBLIC_KEY_BYTES);
  puts_(t, ",\"parent\":");
  if (m->parent == LH_SYNC_NONE)
    puts_(t, "null");
  else
    put_u64(t, (uint64_t)m->parent);
  if (with_signature) {
    puts_(t, ",\"signature\":");
    put_hex(t, m->signature, LH_SYNC_SIGNATURE_BYTES);
  }
  puts_(t, ",\"slab\":");
  put_hex(t, m->slab, LH_HASH_BYTES);
  puts_(t, ",\"tokenizer\":");
  if (m->has_tokenizer)
    put_hex(t, m->tokenizer, LH_HASH_BYTES);
  else
    puts_(t, "null");
  puts_(t, ",\"version\":");
  put_u64(t, (uint64_t)m->version);
  puts_(t, "}");
}

_Static_assert(LH_SYNC_MANIFEST_FORMAT == 1, "serialize writes \"format\":1");

static int cmp_blob(const void *a, const void *b) {
  return memcmp(((const lh_sync_blob_ref *)a)->hash, ((const lh_sync_blob_ref *)b)->hash,
                LH_HASH_BYTES);
}

static void sort_blobs(lh_sync_manifest *m) {
  if (m->n_blobs > 1) qsort(m->blobs, (size_t)m->n_blobs, sizeof m->blobs[0], cmp_blob);
}

/* ---------------------------------------------------------------- checks */

static lh_err check(const lh_sync_manifest *m, const char *what, lh_err code) {
  if (m->version < 0 || m->version > LH_SYNC_INT_MAX)
    return lh_errorf(code, "%s: version %" PRId64 ", expected 0 .. 2^53-1", what, m->version);
  if (m->parent != LH_SYNC_NONE && (m->parent < 0 || m->parent >= m->version))
    return lh_errorf(code,
                     "%s: parent %" PRId64 " of version %" PRId64 ", expected an older "
                     "version (or null)",
                     what, m->parent, m->version);
  if (m->elements < 1 || m->elements > (uint64_t)LH_SYNC_INT_MAX)
    return lh_errorf(code, "%s: elements %" PRIu64 ", expected 1 .. 2^53-1", what, m->elements);
  if (m->n_blobs < 1 || m->n_blobs > LH_SYNC_MAX_BLOBS)
    return lh_errorf(code, "%s: %d blobs, expected 1 .. %d", what, m->n_blobs, LH_SYNC_MAX_BLOBS);
  int snapshots = 0;
  for (int i = 0; i < m->n_blobs; i++) {
    const lh_sync_blob_ref *b = &m->blobs[i];
    if (b->kind == LH_SYNC_SNAPSHOT) {
      if (b->from != LH_SYNC_NONE)
        return lh_errorf(code, "%s: blob %d is a snapshot with a from version", what, i);
      if (++snapshots > 1)
        return lh_errorf(code, "%s: blob %d is a second snapshot; a version has one", what, i);
    } else if (b->kind == LH_SYNC_PATCH) {
      if (b->from < 0 || b->from >= m->version)
        return lh_errorf(code,
                         "%s: blob %d is a patch from version %" PRId64 " to %" PRId64
                         ", expected one from an older version",
                         what, i, b->from, m->version);
    } else {
      return lh_errorf(code, "%s: blob %d has kind %d, expected a snapshot or a patch", what, i,
                       (int)b->kind);
    }
    if (b->size < 1 || b->size > (uint64_t)LH_SYNC_INT_MAX)
      return lh_errorf(code, "%s: blob %d has size %" PRIu64 ", expected 1 .. 2^53-1", what, i,
                       b->size);
    for (int j = 0; j < i; j++) {
      if (!memcmp(m->blobs[j].hash, b->hash, LH_HASH_BYTES))
        return lh_errorf(code, "%s: blobs %d and %d have the same hash", what, j, i);
      if (b->kind == LH_SYNC_PATCH && m->blobs[j].kind == LH_SYNC_PATCH &&
          m->blobs[j].from == b->from)
        return lh_errorf(code, "%s: blobs %d and %d are both patches from version %" PRId64, what,
                         j, i, b->from);
    }
  }
  return LH_ERR_OK;
}

lh_err lh_sync_manifest_check(const lh_sync_manifest *m, const char *what) {
  return check(m, what ? what : "manifest", LH_ERR_INVAL);
}

/* ---------------------------------------------------------------- signing */

lh_err lh_sync_manifest_sign(const lh_sync_manifest *m, const lh_sync_secret_key *sk, char **out,
                             size_t *len) {
  *out = NULL;
  *len = 0;
  lh_sync_manifest c = *m;
  lh_err e = check(&c, "manifest", LH_ERR_INVAL); /* n_blobs first: then sorting is safe */
  if (e) return e;
  sort_blobs(&c);
  lh_sync_key_public(sk, &c.key);
  char *buf = malloc(CONTEXT_LEN + TEXT_CAP);
  if (!buf) return lh_errorf(LH_ERR_NOMEM, "manifest: cannot allocate %d bytes", TEXT_CAP);
  memcpy(buf, LH_SYNC_SIGNING_CONTEXT, CONTEXT_LEN);
  text t = {buf + CONTEXT_LEN, 0, TEXT_CAP};
  serialize(&c, false, &t);
  lh__sync_sodium();
  crypto_sign_detached(c.signature, NULL, (const unsigned char *)buf, CONTEXT_LEN + t.len, sk->sk);
  t = (text){buf, 0, TEXT_CAP};
  serialize(&c, true, &t);
  *out = buf;
  *len = t.len;
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- reading */

typedef enum { SIGNED, UNSIGNED } mode;

/* Context for field errors: "WHAT: field PATH: ..." */
typedef struct reader {
  const char *what;
} reader;

static lh_err type_error(const reader *r, const char *field, const char *want, const json_t *v) {
  return lh_errorf(LH_ERR_FORMAT, "%s: field %s: expected %s, found %s", r->what, field, want,
                   lh_json_type_name(v));
}

static lh_err get_int(const reader *r, const char *field, const json_t *v, int64_t lo,
                      int64_t *out) {
  if (!json_is_integer(v)) return type_error(r, field, "an integer", v);
  json_int_t x = json_integer_value(v);
  if (x < lo || x > LH_SYNC_INT_MAX)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: field %s: %lld is out of range, expected %" PRId64 " .. 2^53-1", r->what,
                     field, (long long)x, lo);
  *out = (int64_t)x;
  return LH_ERR_OK;
}

static lh_err get_hex(const reader *r, const char *field, const json_t *v, uint8_t *out, size_t n) {
  if (!json_is_string(v)) return type_error(r, field, "a string of hex digits", v);
  char name[64];
  snprintf(name, sizeof name, "field %s", field);
  return lh__sync_unhex(json_string_value(v), json_string_length(v), out, n, r->what, name, 0);
}

static lh_err get_blob(const reader *r, int i, const json_t *o, lh_sync_blob_ref *b) {
  char field[48];
  snprintf(field, sizeof field, "blobs[%d]", i);
  if (!json_is_object(o)) return type_error(r, field, "an object", o);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    if (strcmp(key, "from") && strcmp(key, "hash") && strcmp(key, "kind") && strcmp(key, "size")) {
      char shown[64];
      lh_escape(key, strlen(key), shown, sizeof shown);
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: field %s: unknown member \"%s\" (expected from, hash, kind, size)",
                       r->what, field, shown);
    }
  }
  const json_t *kind = json_object_get(o, "kind"), *hash = json_object_get(o, "hash"),
               *size = json_object_get(o, "size"), *from = json_object_get(o, "from");
  if (!kind || !hash || !size)
    return lh_errorf(LH_ERR_FORMAT, "%s: field %s: missing \"%s\"", r->what, field,
                     !kind   ? "kind"
                     : !hash ? "hash"
                             : "size");
  char sub[64];
  snprintf(sub, sizeof sub, "%s.kind", field);
  if (!json_is_string(kind)) return type_error(r, sub, "\"snapshot\" or \"patch\"", kind);
  const char *k = json_string_value(kind);
  size_t klen = json_string_length(kind);
  if (klen == 8 && !memcmp(k, "snapshot", 8)) {
    b->kind = LH_SYNC_SNAPSHOT;
  } else if (klen == 5 && !memcmp(k, "patch", 5)) {
    b->kind = LH_SYNC_PATCH;
  } else {
    char shown[64];
    lh_escape(k, klen, shown, sizeof shown);
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: field %s: expected \"snapshot\" or \"patch\", found "
                     "\"%s\"",
                     r->what, sub, shown);
  }
  snprintf(sub, sizeof sub, "%s.hash", field);
  lh_err e = get_hex(r, sub, hash, b->hash, LH_HASH_BYTES);
  if (e) return e;
  int64_t s = 0;
  snprintf(sub, sizeof sub, "%s.size", field);
  if ((e = get_int(r, sub, size, 1, &s))) return e;
  b->size = (uint64_t)s;
  b->from = LH_SYNC_NONE;
  if (b->kind == LH_SYNC_SNAPSHOT && from)
    return lh_errorf(LH_ERR_FORMAT, "%s: field %s: a snapshot has no \"from\"", r->what, field);
  if (b->kind == LH_SYNC_PATCH) {
    if (!from)
      return lh_errorf(LH_ERR_FORMAT, "%s: field %s: a patch needs \"from\" (its parent version)",
                       r->what, field);
    snprintf(sub, sizeof sub, "%s.from", field);
    if ((e = get_int(r, sub, from, 0, &b->from))) return e;
  }
  return LH_ERR_OK;
}

static const char *const top_fields[] = {"blobs",      "config",    "elements", "format",
                                         "generation", "key",       "parent",   "signature",
                                         "slab",       "tokenizer", "version"};

/* The fields of a parsed object; in SIGNED mode "key" and "signature" are required, in
 * UNSIGNED mode refused. Blobs come out sorted. */
static lh_err extract(const reader *r, const json_t *root, mode md, lh_sync_manifest *m) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)root, key, v) {
    size_t i = 0, n = sizeof top_fields / sizeof top_fields[0];
    while (i < n && strcmp(key, top_fields[i]))
      i++;
    if (i == n) {
      char shown[64];
      lh_escape(key, strlen(key), shown, sizeof shown);
      return lh_errorf(LH_ERR_FORMAT, "%s: unknown field \"%s\"", r->what, shown);
    }
    if (md == UNSIGNED && (!strcmp(key, "key") || !strcmp(key, "signature")))
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: field %s: an unsigned manifest has none (signing adds it)", r->what,
                       key);
  }
  for (size_t i = 0; i < sizeof top_fields / sizeof top_fields[0]; i++) {
    const char *f = top_fields[i];
    if (md == UNSIGNED && (!strcmp(f, "key") || !strcmp(f, "signature"))) continue;
    if (!json_object_get(root, f))
      return lh_errorf(LH_ERR_FORMAT, "%s: missing field \"%s\"", r->what, f);
  }
  lh_err e;
  int64_t x = 0;
  if ((e = get_int(r, "version", json_object_get(root, "version"), 0, &m->version))) return e;
  const json_t *parent = json_object_get(root, "parent");
  if (json_is_null(parent)) {
    m->parent = LH_SYNC_NONE;
  } else {
    if (!json_is_integer(parent)) return type_error(r, "parent", "an integer or null", parent);
    if ((e = get_int(r, "parent", parent, 0, &m->parent))) return e;
  }
  if ((e = get_int(r, "elements", json_object_get(root, "elements"), 1, &x))) return e;
  m->elements = (uint64_t)x;
  if ((e = get_hex(r, "slab", json_object_get(root, "slab"), m->slab, LH_HASH_BYTES))) return e;
  if ((e = get_hex(r, "config", json_object_get(root, "config"), m->config, LH_HASH_BYTES)))
    return e;
  const json_t *tok = json_object_get(root, "tokenizer");
  m->has_tokenizer = !json_is_null(tok);
  if (m->has_tokenizer) {
    if (!json_is_string(tok))
      return type_error(r, "tokenizer", "a string of hex digits or null", tok);
    if ((e = get_hex(r, "tokenizer", tok, m->tokenizer, LH_HASH_BYTES))) return e;
  }
  const json_t *gen = json_object_get(root, "generation");
  m->has_generation = !json_is_null(gen);
  if (m->has_generation) {
    if (!json_is_string(gen))
      return type_error(r, "generation", "a string of hex digits or null", gen);
    if ((e = get_hex(r, "generation", gen, m->generation, LH_HASH_BYTES))) return e;
  }
  if (md == SIGNED) {
    if ((e = get_hex(r, "key", json_object_get(root, "key"), m->key.bytes,
                     LH_SYNC_PUBLIC_KEY_BYTES)))
      return e;
    if ((e = get_hex(r, "signature", json_object_get(root, "signature"), m->signature,
                     LH_SYNC_SIGNATURE_BYTES)))
      return e;
  }
  const json_t *blobs = json_object_get(root, "blobs");
  if (!json_is_array(blobs)) return type_error(r, "blobs", "an array", blobs);
  size_t nb = json_array_size(blobs);
  if (nb < 1 || nb > LH_SYNC_MAX_BLOBS)
    return lh_errorf(LH_ERR_FORMAT, "%s: field blobs: %zu blobs, expected 1 .. %d", r->what, nb,
                     LH_SYNC_MAX_BLOBS);
  m->n_blobs = (int)nb;
  for (size_t i = 0; i < nb; i++)
    if ((e = get_blob(r, (int)i, json_array_get(blobs, i), &m->blobs[i]))) return e;
  if ((e = check(m, r->what, LH_ERR_FORMAT))) return e; /* blob numbers as in the input */
  sort_blobs(m);
  return LH_ERR_OK;
}

/* Parses text into m; with SIGNED, also requires text to be m's canonical encoding. */
static lh_err read_manifest(const char *text_in, size_t len, const char *what, mode md,
                            lh_sync_manifest *m) {
  memset(m, 0, sizeof *m);
  if (len > LH_SYNC_MANIFEST_MAX_BYTES)
    return lh_errorf(LH_ERR_LIMIT, "%s: %zu bytes, more than a manifest's limit of %d", what, len,
                     LH_SYNC_MANIFEST_MAX_BYTES);
  lh_err e = lh_json_check_cost(text_in, len, MAX_OPEN, MAX_TOKENS, what);
  if (e) return e;
  json_error_t jerr;
  json_t *root = json_loadb(text_in, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return lh_errorf(LH_ERR_FORMAT, "%s: not JSON: %s (byte %d)", what, jerr.text, jerr.position);
  reader r = {what};
  char *canon = NULL;
  if (!json_is_object(root)) {
    e = type_error(&r, "(the whole manifest)", "an object", root);
    goto out;
  }
  const json_t *format = json_object_get(root, "format");
  if (!format) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: no \"format\" field; not a longhaul manifest", what);
    goto out;
  }
  if (!json_is_integer(format)) {
    e = type_error(&r, "format", "an integer", format);
    goto out;
  }
  if (json_integer_value(format) != LH_SYNC_MANIFEST_FORMAT) {
    e = lh_errorf(LH_ERR_UNSUPPORTED,
                  "%s: manifest format %lld; this longhaul reads format %d (upgrade longhaul)",
                  what, (long long)json_integer_value(format), LH_SYNC_MANIFEST_FORMAT);
    goto out;
  }
  if ((e = extract(&r, root, md, m))) goto out;
  if (md == SIGNED) {
    canon = malloc(TEXT_CAP);
    if (!canon) {
      e = lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %d bytes", what, TEXT_CAP);
      goto out;
    }
    text t = {canon, 0, TEXT_CAP};
    serialize(m, true, &t);
    size_t i = 0;
    while (i < len && i < t.len && text_in[i] == canon[i])
      i++;
    if (i < len || i < t.len) {
      char found[16], want[16];
      lh_escape(text_in + i, i < len ? 1 : 0, found, sizeof found);
      lh_escape(canon + i, i < t.len ? 1 : 0, want, sizeof want);
      e = lh_errorf(
          LH_ERR_FORMAT,
          "%s: not in canonical form (docs/PROTOCOL.md, \"Manifests\"): at byte %zu %s%s%s,"
          " the canonical encoding %s%s%s",
          what, i, i < len ? "found \"" : "the input ends", found, i < len ? "\"" : "",
          i < t.len ? "has \"" : "ends there", want, i < t.len ? "\"" : "");
    }
  }
out:
  free(canon);
  json_decref(root);
  if (e) memset(m, 0, sizeof *m);
  return e;
}

lh_err lh_sync_manifest_parse(const void *data, size_t len, const char *what,
                              lh_sync_manifest *out) {
  return read_manifest(data, len, what, SIGNED, out);
}

lh_err lh_sync_manifest_from_json(const char *text_in, size_t len, const char *what,
                                  lh_sync_manifest *out) {
  return read_manifest(text_in, len, what, UNSIGNED, out);
}

lh_err lh_sync_manifest_verify(const void *data, size_t len, const lh_sync_public_key *pinned,
                               const char *what, lh_sync_manifest *out) {
  lh_err e = read_manifest(data, len, what, SIGNED, out);
  if (e) return e;
  if (sodium_memcmp(out->key.bytes, pinned->bytes, LH_SYNC_PUBLIC_KEY_BYTES) != 0) {
    char got[2 * LH_SYNC_PUBLIC_KEY_BYTES + 1], want[2 * LH_SYNC_PUBLIC_KEY_BYTES + 1];
    lh__sync_hex(out->key.bytes, LH_SYNC_PUBLIC_KEY_BYTES, got);
    lh__sync_hex(pinned->bytes, LH_SYNC_PUBLIC_KEY_BYTES, want);
    memset(out, 0, sizeof *out);
    return lh_errorf(LH_ERR_MISMATCH,
                     "%s: signed by key %s, not by the pinned trainer key %s; refusing it", what,
                     got, want);
  }
  char *buf = malloc(CONTEXT_LEN + TEXT_CAP);
  if (!buf) {
    memset(out, 0, sizeof *out);
    return lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %d bytes", what, TEXT_CAP);
  }
  memcpy(buf, LH_SYNC_SIGNING_CONTEXT, CONTEXT_LEN);
  text t = {buf + CONTEXT_LEN, 0, TEXT_CAP};
  serialize(out, false, &t);
  lh__sync_sodium();
  int bad = crypto_sign_verify_detached(out->signature, (const unsigned char *)buf,
                                        CONTEXT_LEN + t.len, pinned->bytes);
  free(buf);
  if (bad) {
    memset(out, 0, sizeof *out);
    return lh_errorf(LH_ERR_SIGNATURE,
                     "%s: the signature does not verify under the pinned trainer key: the "
                     "manifest was changed after signing (or its signature damaged); refusing it",
                     what);
  }
  return LH_ERR_OK;
}

lh_err lh_sync_manifest_load(const char *path, const lh_sync_public_key *pinned,
                             lh_sync_manifest *out) {
  memset(out, 0, sizeof *out);
  char *buf = NULL;
  size_t len = 0;
  lh_err e = lh_file_read(path, LH_SYNC_MANIFEST_MAX_BYTES, &buf, &len);
  if (e == LH_ERR_OK) e = lh_sync_manifest_verify(buf, len, pinned, path, out);
  free(buf);
  return e;
}

/* ---------------------------------------------------------------- model files */

/* BLAKE2b-256 of a file of at most MODEL_FILE_MAX bytes, read in chunks. */
static lh_err hash_file(const char *path, uint8_t out[LH_HASH_BYTES]) {
  int fd = -1;
  lh_err e = lh_file_open_read(path, &fd);
  if (e) return e;
  lh__sync_sodium();
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, LH_HASH_BYTES);
  uint8_t *buf = malloc(1 << 16);
  uint64_t total = 0;
  if (!buf) {
    e = lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate a read buffer", path);
    goto out;
  }
  for (;;) {
    ssize_t got = read(fd, buf, 1 << 16);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      e = lh_errorf(LH_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
      goto out;
    }
    if (got == 0) break;
    total += (uint64_t)got;
    if (total > MODEL_FILE_MAX) {
      e = lh_errorf(LH_ERR_LIMIT, "%s: more than the limit of %" PRIu64 " bytes", path,
                    MODEL_FILE_MAX);
      goto out;
    }
    crypto_generichash_update(&st, buf, (unsigned long long)got);
  }
  crypto_generichash_final(&st, out, LH_HASH_BYTES);
out:
  free(buf);
  close(fd);
  return e;
}

/* The hash of DIR/NAME, or *has false when the file does not exist. */
static lh_err hash_optional(const char *dir, const char *name, bool *has,
                            uint8_t out[LH_HASH_BYTES]) {
  char *path = lh_path_join(dir, name);
  struct stat st;
  *has = !(lstat(path, &st) != 0 && errno == ENOENT);
  memset(out, 0, LH_HASH_BYTES);
  lh_err e = *has ? hash_file(path, out) : LH_ERR_OK;
  free(path);
  return e;
}

lh_err lh_sync_model_hashes(const char *dir, lh_sync_manifest *m) {
  char *config = lh_path_join(dir, "config.json");
  lh_err e = hash_file(config, m->config);
  free(config);
  if (!e) e = hash_optional(dir, "tokenizer.json", &m->has_tokenizer, m->tokenizer);
  if (!e) e = hash_optional(dir, "generation_config.json", &m->has_generation, m->generation);
  return e;
}

lh_err lh_sync_chain_parse(const void *data, size_t len, const lh_sync_public_key *pinned, int max,
                           int64_t after, const char *what, lh_sync_manifest **out, int *n) {
  *out = NULL;
  *n = 0;
  const char *p = data, *end = p + len;
  lh_sync_manifest *ms = NULL;
  int k = 0;
  lh_err e = LH_ERR_OK;
  while (!e && p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl || k >= max) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: not at most %d manifests, one per line", what, max);
      break;
    }
    ms = lh_xrealloc(ms, (size_t)(k + 1) * sizeof *ms);
    if (!(e = lh_sync_manifest_verify(p, (size_t)(nl - p), pinned, what, &ms[k]))) k++;
    p = nl + 1;
  }
  for (int i = 1; !e && i < k; i++)
    if (ms[i].version != ms[i - 1].version + 1)
      e = lh_errorf(LH_ERR_FORMAT, "%s: versions %lld and %lld in a row", what,
                    (long long)ms[i - 1].version, (long long)ms[i].version);
  if (!e && (k == 0 || ms[k - 1].version <= after))
    e = lh_errorf(LH_ERR_FORMAT, "%s: no manifest newer than version %lld in the chain", what,
                  (long long)after);
  if (e) {
    free(ms);
    return e;
  }
  *out = ms;
  *n = k;
  return LH_ERR_OK;
}
