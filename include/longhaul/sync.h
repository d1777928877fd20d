/* longhaul sync: how a policy version travels from the trainer to a worker (docs/PROTOCOL.md).
 * The trainer's Ed25519 key signs one manifest per version (canonical JSON naming the slab's hash
 * and the blobs that produce it); blobs are content-addressed files (a full snapshot of the bf16
 * slab, or a patch from an older version, see patch.h); a worker pins the trainer's public key,
 * verifies the manifest, plans the cheapest blobs from the version it holds, and checks every
 * blob's hash as it reads it. Everything here that reads outside bytes returns an lh_err with a
 * message naming `what` and never aborts; every length is checked before allocation.
 *
 * Ownership: buffers returned are malloc'd for the caller (free()); lh_sync_route_free frees a
 * route's steps. Structs are plain values (no pointers) unless said otherwise.
 * Thread safety: no function keeps state; any thread may call any function on its own data. The
 * blob store is safe for concurrent writers and readers of one directory (atomic renames). */
#ifndef LONGHAUL_SYNC_H
#define LONGHAUL_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

/* ---------------------------------------------------------------- keys ("Keys") */

#define LH_SYNC_PUBLIC_KEY_BYTES 32
#define LH_SYNC_SEED_BYTES       32 /* an Ed25519 secret key is its 32-byte seed (RFC 8032) */
#define LH_SYNC_SIGNATURE_BYTES  64
/* The one line of each key file, without its newline. */
#define LH_SYNC_PUBLIC_KEY_PREFIX "longhaul-ed25519-public-v1 "
#define LH_SYNC_SECRET_KEY_PREFIX "longhaul-ed25519-secret-v1 "
/* Bytes of either line with its NUL: the 27-byte prefix, 64 hex digits, NUL. */
#define LH_SYNC_KEY_TEXT_BYTES 92
/* Key files larger than this are refused before they are read. */
#define LH_SYNC_KEY_FILE_MAX 4096

typedef struct lh_sync_public_key {
  uint8_t bytes[LH_SYNC_PUBLIC_KEY_BYTES];
} lh_sync_public_key;

/* libsodium's form of a secret key: the 32-byte seed followed by the public key derived from it.
 * Wipe it with lh_sync_secret_key_wipe when done. */
typedef struct lh_sync_secret_key {
  uint8_t sk[64];
} lh_sync_secret_key;

/* A new key pair from the system's random source. */
lh_err lh_sync_keygen(lh_sync_secret_key *sk);
/* The key pair of a 32-byte seed (deterministic; for tests and fixtures). */
void lh_sync_key_from_seed(const uint8_t seed[LH_SYNC_SEED_BYTES], lh_sync_secret_key *sk);
void lh_sync_key_public(const lh_sync_secret_key *sk, lh_sync_public_key *pk);
void lh_sync_secret_key_wipe(lh_sync_secret_key *sk);
/* The key's line (prefix and lowercase hex, no newline), NUL-terminated. */
void lh_sync_public_key_text(const lh_sync_public_key *pk, char out[LH_SYNC_KEY_TEXT_BYTES]);
void lh_sync_secret_key_text(const lh_sync_secret_key *sk, char out[LH_SYNC_KEY_TEXT_BYTES]);
/* Parse a key file's bytes: exactly the prefix, 64 lowercase hex digits, and an optional final
 * "\n"; anything else is LH_ERR_FORMAT saying what was found and where (a secret key given as a
 * public one, and the reverse, are named as such). A public key that is not a valid Ed25519 point
 * of the main subgroup is refused too. Messages start with `what`. */
lh_err lh_sync_public_key_parse(const char *text, size_t len, const char *what,
                                lh_sync_public_key *pk);
lh_err lh_sync_secret_key_parse(const char *text, size_t len, const char *what,
                                lh_sync_secret_key *sk);
/* Read and parse a key file (at most LH_SYNC_KEY_FILE_MAX bytes). lh_sync_secret_key_load also
 * refuses (LH_ERR_INVAL) a secret key file that users other than its owner may read or write
 * (mode & 077), as ssh does; a public key file given to it is named as such whatever its mode. */
lh_err lh_sync_public_key_load(const char *path, lh_sync_public_key *pk);
lh_err lh_sync_secret_key_load(const char *path, lh_sync_secret_key *sk);
/* Writes the secret key to PATH (mode 0600 from its creation) and the public key to PATH.pub
 * (mode 0644), each atomically (temporary file, fsync, rename). Without `force`, an existing
 * PATH or PATH.pub is an error (LH_ERR_INVAL) and nothing is written; with it, existing regular
 * files are replaced. */
lh_err lh_sync_keys_write(const char *path, const lh_sync_secret_key *sk, bool force);

/* ---------------------------------------------------------------- hashes */

/* 64 lowercase hex digits to 32 bytes; anything else is LH_ERR_FORMAT naming `what`. */
lh_err lh_sync_hash_parse(const char *hex, size_t len, const char *what,
                          uint8_t out[LH_HASH_BYTES]);

/* ---------------------------------------------------------------- manifests ("Manifests") */

#define LH_SYNC_MANIFEST_FORMAT    1
#define LH_SYNC_MANIFEST_MAX_BYTES 65536 /* a signed manifest's bytes at most */
#define LH_SYNC_MAX_BLOBS          64    /* blobs one manifest may list */
/* Every integer of a manifest lies in [0, 2^53 - 1], exact in any JSON implementation. */
#define LH_SYNC_INT_MAX ((int64_t)9007199254740991)
/* No version: a worker without weights, a first version without a parent. */
#define LH_SYNC_NONE ((int64_t)-1)
/* What the signature covers: this prefix, then the canonical JSON without "signature". */
#define LH_SYNC_SIGNING_CONTEXT "longhaul-manifest-v1\n"

typedef enum { LH_SYNC_SNAPSHOT = 0, LH_SYNC_PATCH = 1 } lh_sync_blob_kind;

/* One blob that produces the manifest's version: a snapshot (the whole slab), or a patch from
 * version `from` (< the manifest's version). */
typedef struct lh_sync_blob_ref {
  lh_sync_blob_kind kind;
  int64_t from;  /* a patch's parent version; LH_SYNC_NONE for a snapshot */
  uint64_t size; /* bytes of the blob, >= 1 */
  uint8_t hash[LH_HASH_BYTES];
} lh_sync_blob_ref;

typedef struct lh_sync_manifest {
  int64_t version;                   /* policy version, 0 .. LH_SYNC_INT_MAX */
  int64_t parent;                    /* the version it was trained from, or LH_SYNC_NONE */
  uint64_t elements;                 /* bf16 values of the slab, >= 1 */
  uint8_t slab[LH_HASH_BYTES];       /* BLAKE2b-256 of the slab's little-endian bytes */
  uint8_t config[LH_HASH_BYTES];     /* BLAKE2b-256 of the model's config.json */
  uint8_t tokenizer[LH_HASH_BYTES];  /* ... of its tokenizer.json, when has_tokenizer */
  bool has_tokenizer;                /* false: the model has none (JSON null) */
  uint8_t generation[LH_HASH_BYTES]; /* ... of its generation_config.json, when
                                      * has_generation (JSON "generation") */
  bool has_generation;
  lh_sync_public_key key;                     /* the signer (set by lh_sync_manifest_sign) */
  uint8_t signature[LH_SYNC_SIGNATURE_BYTES]; /* set by sign, checked by verify */
  int n_blobs;                                /* 1 .. LH_SYNC_MAX_BLOBS */
  lh_sync_blob_ref blobs[LH_SYNC_MAX_BLOBS];  /* in canonical order: by hash, bytewise */
} lh_sync_manifest;

/* Checks m's fields (ranges, at most one snapshot, at most one patch per `from`, no hash twice,
 * from < version, parent < version) and, with `what`, names the first bad one (LH_ERR_INVAL). */
lh_err lh_sync_manifest_check(const lh_sync_manifest *m, const char *what);
/* Signs m with the trainer's key: *out (malloc'd, *len bytes, not NUL-terminated) is the signed
 * manifest in canonical JSON, its "key" the public key of sk and its blobs sorted by hash
 * (m itself is not changed). Ed25519 is deterministic: the same m and key give the same bytes.
 * LH_ERR_INVAL (lh_sync_manifest_check) when m is not valid. */
lh_err lh_sync_manifest_sign(const lh_sync_manifest *m, const lh_sync_secret_key *sk, char **out,
                             size_t *len);
/* Verifies a signed manifest against the pinned trainer key and fills *out. The errors, in the
 * order they are checked:
 *   LH_ERR_LIMIT       more than LH_SYNC_MANIFEST_MAX_BYTES, or JSON too costly to parse;
 *   LH_ERR_FORMAT      not JSON, or not an object, or no integer "format";
 *   LH_ERR_UNSUPPORTED a format other than LH_SYNC_MANIFEST_FORMAT;
 *   LH_ERR_FORMAT      a field missing, unknown, of the wrong type or out of range (named), or
 *                      bytes that are not the canonical encoding (the first differing offset);
 *   LH_ERR_MISMATCH    signed by another key than `pinned` (both keys named);
 *   LH_ERR_SIGNATURE   the signature does not verify (any field changed after signing).
 * On failure *out is zeroed. Messages start with `what` (a path, a URL). */
lh_err lh_sync_manifest_verify(const void *data, size_t len, const lh_sync_public_key *pinned,
                               const char *what, lh_sync_manifest *out);
/* All of lh_sync_manifest_verify's checks but the key and the signature: for tools that show a
 * manifest and for fuzzing. Never trust what it returns. */
lh_err lh_sync_manifest_parse(const void *data, size_t len, const char *what,
                              lh_sync_manifest *out);
/* A chain of signed manifests, one per line, each line ended by '\n' (the server's
 * GET /v1/policy?chain=1 reply): at most `max` lines, each verified (lh_sync_manifest_verify,
 * `what` naming the source), versions consecutive, the last newer than `after`. *out is malloc'd
 * (*n entries, oldest first); on failure NULL and 0, LH_ERR_FORMAT for the layout and the order
 * (or the error of the first line that does not verify). */
lh_err lh_sync_chain_parse(const void *data, size_t len, const lh_sync_public_key *pinned, int max,
                           int64_t after, const char *what, lh_sync_manifest **out, int *n);
/* lh_sync_manifest_verify on a file (at most LH_SYNC_MANIFEST_MAX_BYTES). */
lh_err lh_sync_manifest_load(const char *path, const lh_sync_public_key *pinned,
                             lh_sync_manifest *out);
/* Reads an unsigned manifest written by a person or a script: the fields of a manifest but "key"
 * and "signature", in any order and layout, blobs in any order (sorted here), "format" 1. For
 * `longhaul manifest sign`; the result still goes through lh_sync_manifest_sign's checks. */
lh_err lh_sync_manifest_from_json(const char *text, size_t len, const char *what,
                                  lh_sync_manifest *out);
/* The hashes a manifest records for a model directory: DIR/config.json (required),
 * DIR/tokenizer.json and DIR/generation_config.json (has_tokenizer, has_generation false when
 * the file does not exist). Files of more than 256 MiB are refused. */
lh_err lh_sync_model_hashes(const char *dir, lh_sync_manifest *m);

/* ---------------------------------------------------------------- snapshots ("Snapshots") */

#define LH_SYNC_SNAPSHOT_FORMAT 1
#define LH_SYNC_SNAPSHOT_HEADER 64
#define LH_SYNC_SNAPSHOT_LEVEL  3  /* default zstd level */
#define LH_SYNC_SNAPSHOT_WINDOW 24 /* a decoder accepts zstd windows of at most 2^24 bytes */

/* Encodes the bf16 slab (n >= 1 values) as a snapshot blob: header, then one zstd frame (level
 * 1..19) of the slab's byte planes. *out is malloc'd. */
lh_err lh_sync_snapshot_encode(const uint16_t *slab, size_t n, int level, uint8_t **out,
                               size_t *len);
/* Reads the header only: the element count and the slab hash it declares (not yet checked).
 * Checks magic, format, reserved bytes, the payload length and max_elements. */
lh_err lh_sync_snapshot_info(const uint8_t *data, size_t len, size_t max_elements, const char *what,
                             size_t *n, uint8_t hash[LH_HASH_BYTES]);
/* Decodes a snapshot of at most max_elements values into *slab (malloc'd, 64-byte aligned,
 * *n values); the zstd frame must declare exactly 2n bytes and be the whole rest of the blob,
 * and the decoded slab must hash to the header's hash (LH_ERR_MISMATCH otherwise). */
lh_err lh_sync_snapshot_decode(const uint8_t *data, size_t len, size_t max_elements,
                               const char *what, uint16_t **slab, size_t *n);
/* BLAKE2b-256 of a slab's little-endian bytes: a policy version's identity. */
void lh_sync_slab_hash(const uint16_t *slab, size_t n, uint8_t hash[LH_HASH_BYTES]);

/* ---------------------------------------------------------------- blob store ("Blob store") */

/* Blobs live in a directory (a run's RUN/blobs) as files named by the lowercase hex of their
 * BLAKE2b-256 hash. lh_sync_blob_put writes a blob (creating dir; temporary file, fsync, rename,
 * mode 0644) and sets hash; a blob already there with the right content is left alone, one whose
 * content is wrong is replaced. lh_sync_blob_get reads at most max_bytes and recomputes the
 * hash: a missing blob is LH_ERR_NOTFOUND, a larger one LH_ERR_LIMIT, a corrupted one
 * LH_ERR_MISMATCH (the file is kept for inspection). lh_sync_blob_has says whether the file
 * exists (as a regular file; its content is checked only by get). lh_sync_blob_path is
 * DIR/<hex> (malloc'd). */
lh_err lh_sync_blob_put(const char *dir, const void *data, size_t len, uint8_t hash[LH_HASH_BYTES]);
lh_err lh_sync_blob_get(const char *dir, const uint8_t hash[LH_HASH_BYTES], size_t max_bytes,
                        uint8_t **data, size_t *len);
bool lh_sync_blob_has(const char *dir, const uint8_t hash[LH_HASH_BYTES]);
char *lh_sync_blob_path(const char *dir, const uint8_t hash[LH_HASH_BYTES]);

/* ---------------------------------------------------------------- planning ("Choosing what to
 * fetch") */

/* One blob to fetch and apply: versions[manifest].blobs[blob], producing that manifest's
 * version. */
typedef struct lh_sync_step {
  int manifest, blob;
} lh_sync_step;

typedef struct lh_sync_route {
  int n;               /* steps, in the order to apply them; 0 when nothing is needed */
  uint64_t bytes;      /* their total size */
  double seconds;      /* lh_sync_plan_time's estimate of fetching them; 0 from lh_sync_plan */
  lh_sync_step *steps; /* (n) malloc'd; NULL when n is 0 */
} lh_sync_route;

/* The cheapest blobs (fewest total bytes) that take a worker holding version `from`
 * (LH_SYNC_NONE: no weights) to version `to`, among the published versions[0..n) (any order,
 * each version once; `from` need not be among them). A snapshot of any version may start a
 * route; a patch needs the weights of its `from` version. Ties: fewer steps; then, for the blob
 * that produces each version, a snapshot over a patch and a patch from a newer version over one
 * from an older. from == to is an empty route; a `from`
 * newer than `to` can only use snapshots. LH_ERR_NOTFOUND when `to` is not published or no
 * route exists, LH_ERR_INVAL for a duplicate version or a blob that is not valid. */
lh_err lh_sync_plan(const lh_sync_manifest *versions, int n, int64_t from, int64_t to,
                    lh_sync_route *route);
void lh_sync_route_free(lh_sync_route *route);
/* What fetching blobs costs a worker, as it measured it: a request's round trip, the download
 * rate of its connections together, and how many blobs it fetches at once (each on its own
 * connection, kept open). */
typedef struct lh_sync_cost {
  double rtt_s;       /* seconds, >= 0 */
  double bytes_per_s; /* > 0 */
  int parallel;       /* >= 1 */
} lh_sync_cost;

#define LH_SYNC_PLAN_MAX_STEPS                                                                     \
  64 /* lh_sync_plan_time looks at routes of at most this many blobs                               \
      */

/* The estimated seconds of fetching `steps` blobs of `bytes` in all: bytes / bytes_per_s, plus a
 * round trip for each `parallel` blobs (ceil(steps / parallel) round trips). */
double lh_sync_route_seconds(const lh_sync_cost *c, uint64_t bytes, int steps);
/* The fastest route, by lh_sync_route_seconds, from `from` to `to` (the same inputs, rules and
 * errors as lh_sync_plan; also LH_ERR_INVAL for a cost out of range). Far behind, one snapshot
 * may beat a chain of patches of fewer bytes (the chain's round trips); over a fast link the
 * fewest bytes win. Ties: fewer bytes, then fewer steps, then lh_sync_plan's rules.
 * route->seconds is the estimate. Time and memory grow as n x min(n, LH_SYNC_PLAN_MAX_STEPS):
 * meant for a worker's chain of manifests (at most 64). */
lh_err lh_sync_plan_time(const lh_sync_manifest *versions, int n, int64_t from, int64_t to,
                         const lh_sync_cost *cost, lh_sync_route *route);

/* The publisher's keyframe rule: whether version `version` must also be published as a snapshot.
 * last_keyframe is the newest version published as a snapshot (LH_SYNC_NONE: none yet);
 * chain_bytes the sizes of the patches a worker at last_keyframe would fetch to reach `version`,
 * this version's patch included; snapshot_bytes the size of a snapshot (the last one's is a good
 * estimate). Due when there is no keyframe yet, when `every` >= 1 and version - last_keyframe >=
 * every, or when chain_bytes > snapshot_bytes. every 0: only the cost rule. */
bool lh_sync_keyframe_due(int64_t every, int64_t version, int64_t last_keyframe,
                          uint64_t chain_bytes, uint64_t snapshot_bytes);

/* ---------------------------------------------------------------- rebuilding (a server's
 * "Restarts") */

/* Applies one blob of a route (data, len: its bytes; b: its reference in version's manifest) to
 * *slab of n values: a snapshot replaces it (*slab NULL: none yet), a patch changes it in place.
 * hash is the slab's hash when *known (a patch's apply then checks its parent hash against it)
 * and ends as the result's: a snapshot's is the one its decode verified, a patch's the child hash
 * its apply verified, so nothing is hashed here; *known is true after a success. Errors: a bad
 * snapshot's or patch's; LH_ERR_FORMAT for a patch with no slab to apply it to. */
lh_err lh_sync_apply_blob(const lh_sync_blob_ref *b, int64_t version, const uint8_t *data,
                          size_t len, uint64_t n, uint16_t **slab, uint8_t hash[LH_HASH_BYTES],
                          bool *known);

/* Given each rebuilt version's slab: the slab is lh_sync_rebuild's and changes once this returns
 * (copy what is kept). A non-zero return stops the rebuild, which returns it. */
typedef lh_err (*lh_sync_rebuild_fn)(void *ctx, int64_t version, const uint16_t *slab);

/* Rebuilds the slabs of versions lo .. hi (0 <= lo <= hi, all among the published versions[0..n),
 * with the versions their routes need: back to a snapshot at or before lo) from the blobs in the
 * store dir, in one pass: the cheapest route to lo (lh_sync_plan from no weights), then from each
 * version to the next, so each blob is read and applied once; `each` is called for lo .. hi in
 * order. Every slab is checked against its manifest's slab hash (the hash a snapshot's decode or a
 * patch's apply verified: no slab is hashed twice). Errors: LH_ERR_INVAL for a bad range;
 * lh_sync_plan's, lh_sync_blob_get's, a bad snapshot's or patch's; LH_ERR_MISMATCH for a slab
 * that does not hash to its manifest, or a version whose element count differs from lo's. */
lh_err lh_sync_rebuild(const lh_sync_manifest *versions, int n, const char *dir, int64_t lo,
                       int64_t hi, lh_sync_rebuild_fn each, void *ctx);

#endif
