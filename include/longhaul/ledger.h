/* longhaul store: the ledger of `longhaul serve`, one SQLite database in WAL mode
 * (docs/ARCHITECTURE.md, "The ledger"). It owns what must survive a kill -9 of the server:
 * workers and their keys, leases and the prompt groups they hand out, every submitted rollout
 * batch (the body) until it is trained, the training log, and the published policy versions with
 * their blobs. Every call that changes the ledger is durable when it returns (synchronous=FULL:
 * the commit is fsynced), and leaves nothing changed when it is refused. The changes of the
 * submission path and of the training thread (lh_ledger_lease, _group_accept, _train,
 * _prune_bodies, _version_put) are group-committed: the calls that arrive while a commit is being
 * written wait, and are then written together in one transaction (one fsync) by one of their
 * threads (a change refused before it wrote anything fails alone, any other failure fails the
 * whole commit); each call returns once the commit holding it is durable. The two
 * long ones, lh_ledger_train and lh_ledger_prune_bodies, are written in parts, one per commit,
 * so that they share the writer with the submissions instead of holding it.
 *
 * Errors: every SQLite failure becomes an lh_err whose message names the ledger's path, what was
 * being done and SQLite's own words; a lock held by another process is waited for (busy timeout,
 * LH_LEDGER_BUSY_MS), then reported as LH_ERR_IO. Strings and bytes from outside (a worker's
 * name and hardware, a reason, meta, a spec, a body) are bounded by the LH_LEDGER_*_MAX limits
 * below: more is LH_ERR_LIMIT and nothing is written. Nothing here aborts.
 *
 * Ownership: arrays and buffers returned (ids, workers, specs, bodies, manifests, log entries)
 * are malloc'd for the caller (free()); lh_ledger_group_clear frees what lh_ledger_group_get put
 * in a group. On failure every returned pointer is NULL and every count 0 (the ids a failed
 * lh_ledger_lease wrote into group_ids mean nothing: that lease does not exist).
 *
 * Thread safety: one lh_ledger may be used by any number of threads at once (the HTTP threads and
 * the training thread). It has SQLite connections each behind a mutex: one for every change
 * (calls that write wait for the commit in progress, its fsync included: commits take
 * milliseconds; the group-committed ones in the order they arrived), and four for the reads of the
 * request path (a thread always uses the same one) (lh_ledger_worker_get, _group_get, _group_body,
 * _version_get, _blob_find, _stats), which in WAL mode see the last commit without waiting for a
 * commit being written. A call that returned has committed, so a read started after it sees it.
 * lh_ledger_open and lh_ledger_close are not to race with other calls on the same ledger. Do not
 * carry an open ledger across fork(); open it again in the child.
 *
 * Integers: ids and versions are int64_t; a task_index (uint64_t) is stored as the int64_t of the
 * same bits. Times are milliseconds of the caller's clock (the server's wall clock), stored as
 * given. */
#ifndef LONGHAUL_LEDGER_H
#define LONGHAUL_LEDGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

/* ---------------------------------------------------------------- limits and format */

#define LH_LEDGER_SCHEMA_VERSION 2          /* PRAGMA user_version of the schema written here */
#define LH_LEDGER_APPLICATION_ID 0x4c484c47 /* PRAGMA application_id: "LHLG" */
#define LH_LEDGER_BUSY_MS        5000       /* how long a lock of another process is waited for */
#define LH_LEDGER_KEY_BYTES      32         /* a worker's Ed25519 public key */
#define LH_LEDGER_HASH_BYTES     32         /* BLAKE2b-256 of a slab or a blob */
#define LH_LEDGER_NAME_MAX       128        /* bytes of a worker's name, NUL not counted */
#define LH_LEDGER_HARDWARE_MAX   4096       /* bytes of a worker's hardware JSON */
#define LH_LEDGER_REASON_MAX     256        /* bytes of a rejection reason */
#define LH_LEDGER_META_MAX       65536      /* bytes of a submission's meta JSON */
#define LH_LEDGER_SPEC_MAX       65536      /* bytes of a group's spec */
#define LH_LEDGER_BODY_MAX       ((size_t)64 << 20) /* bytes of a submitted body */
#define LH_LEDGER_MANIFEST_MAX   65536              /* bytes of a signed manifest */
#define LH_LEDGER_MAX_BLOBS      64                 /* blobs of one version */
#define LH_LEDGER_LEASE_MAX      1024               /* groups of one lease */
#define LH_LEDGER_TRAIN_MAX      65536 /* groups of one lh_ledger_train call, both lists */
#define LH_LEDGER_TOP_REASONS    8     /* rejection reasons lh_ledger_stats reports */
#define LH_LEDGER_TRAIN_PART     256   /* marks of lh_ledger_train written per group commit */
#define LH_LEDGER_PRUNE_PART     512   /* bodies lh_ledger_prune_bodies deletes per group commit */

typedef struct lh_ledger lh_ledger;

/* Creates the ledger at PATH (schema LH_LEDGER_SCHEMA_VERSION) or opens an existing one, with
 * journal_mode=WAL (LH_ERR_UNSUPPORTED when the file system refuses it), synchronous=FULL,
 * foreign_keys=ON and the busy timeout. A file that is not an SQLite database, or a database of
 * another program (another application_id, or tables without a schema version), is
 * LH_ERR_FORMAT; a ledger of an older schema version (from 1) is migrated to
 * LH_LEDGER_SCHEMA_VERSION in one transaction, once; a newer version, or 0, is
 * LH_ERR_UNSUPPORTED; a file that cannot be opened or created is LH_ERR_IO. Messages start with
 * PATH. The directory of a new ledger is fsynced, so the file survives a crash too. */
lh_err lh_ledger_open(const char *path, lh_ledger **out);
/* Closes the connection (SQLite checkpoints the WAL) and frees; accepts NULL. */
void lh_ledger_close(lh_ledger *l);
/* The path the ledger was opened with. */
const char *lh_ledger_path(const lh_ledger *l);

/* ---------------------------------------------------------------- workers */

typedef enum {
  LH_GROUP_LEASED,   /* handed to a worker, waiting for its submission */
  LH_GROUP_ACCEPTED, /* submitted, verified and stored (with its body): waiting to be trained */
  LH_GROUP_REJECTED, /* submitted and refused (reason) */
  LH_GROUP_TRAINED,  /* trained on in the update that made version trained_at */
  LH_GROUP_DROPPED,  /* not trained: too stale at version trained_at (reason "stale") */
  LH_GROUP_EXPIRED   /* its lease ran out before a submission (a late one is still accepted) */
} lh_group_state;
#define LH_GROUP__COUNT 6
/* "leased", "accepted", "rejected", "trained", "dropped", "expired"; "unknown" otherwise. */
const char *lh_group_state_name(lh_group_state s);

typedef struct lh_ledger_worker {
  uint8_t key[LH_LEDGER_KEY_BYTES];
  char name[LH_LEDGER_NAME_MAX + 1];
  int64_t registered_ms; /* the first registration */
  int64_t last_seen_ms;  /* the latest registration or lh_ledger_worker_seen (never decreases) */
  int64_t groups[LH_GROUP__COUNT]; /* this worker's groups, by state */
} lh_ledger_worker;

/* Registers key (a new worker, *is_new true) or updates the name, hardware and last_seen of a
 * known one (*is_new false; is_new may be NULL). name and hardware_json (stored as given, not
 * parsed; NULL is "") are bounded by LH_LEDGER_NAME_MAX and LH_LEDGER_HARDWARE_MAX. */
lh_err lh_ledger_worker_register(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES],
                                 const char *name, const char *hardware_json, int64_t now_ms,
                                 bool *is_new);
/* One worker; LH_ERR_NOTFOUND for a key never registered. One row: the counts by state are kept
 * with every change of a group's state, not counted here. */
lh_err lh_ledger_worker_get(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES],
                            lh_ledger_worker *out);
/* The hardware JSON of a worker as registered (malloc'd, NUL-terminated); LH_ERR_NOTFOUND. */
lh_err lh_ledger_worker_hardware(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES],
                                 char **hardware_json);
/* Moves last_seen_ms to now_ms (kept when later already); LH_ERR_NOTFOUND for an unknown key. */
lh_err lh_ledger_worker_seen(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES], int64_t now_ms);
/* Every worker, in the order of their first registration (*out malloc'd, NULL when none). */
lh_err lh_ledger_workers(lh_ledger *l, lh_ledger_worker **out, int *n);

/* What a worker did with its latest groups (lh_ledger_worker_recent): the reputation window. */
typedef struct lh_ledger_recent {
  int64_t n;                       /* groups in the window (at most its size) */
  int64_t groups[LH_GROUP__COUNT]; /* of them, by state (groups[LH_GROUP_LEASED] is always 0) */
  int64_t excused; /* of the REJECTED ones, those whose reason starts with the excused prefix */
} lh_ledger_recent;
/* Counts a worker's `window` (>= 1, else LH_ERR_INVAL) most recently leased groups (highest
 * ids) among those no longer out on a lease: ACCEPTED, REJECTED, TRAINED and DROPPED ones (the
 * groups it submitted), and EXPIRED ones too when with_expired (the groups it abandoned).
 * excused (NULL or "": none) is a reason prefix for rejections the worker did not cause (the
 * server's own failures); they are counted in groups[LH_GROUP_REJECTED] and in excused. A key
 * never registered, or one with no such group, gives all zeros (LH_ERR_OK). One query that
 * reads the worker's groups newest first and stops when the window is full: the window's groups
 * and those between them outside the class (still leased; for the submitted class, expired),
 * not the worker's whole history. */
lh_err lh_ledger_worker_recent(lh_ledger *l, const uint8_t key[LH_LEDGER_KEY_BYTES], int window,
                               bool with_expired, const char *excused, lh_ledger_recent *out);

/* ---------------------------------------------------------------- groups */

/* What the server hands out as one group: a task of its environment and its own encoding of how
 * to generate it (seed, sampling parameters, ...), at most LH_LEDGER_SPEC_MAX bytes. */
typedef struct lh_ledger_group_spec {
  uint64_t task_index;
  const void *spec; /* may be NULL when spec_len is 0 */
  size_t spec_len;
} lh_ledger_group_spec;

typedef struct lh_ledger_group {
  int64_t id;
  int64_t lease;
  uint8_t worker[LH_LEDGER_KEY_BYTES]; /* the key of the worker it was leased to */
  uint64_t task_index;
  void *spec; /* malloc'd copy (spec_len bytes; NULL when 0) */
  size_t spec_len;
  lh_group_state state;
  int64_t version_used; /* the policy version the submission says it used; -1 until submitted */
  int64_t trained_at;   /* the version whose update trained or dropped it; -1 otherwise */
  char reason[LH_LEDGER_REASON_MAX + 1]; /* why rejected or dropped; "" when none */
  char *meta;                            /* the submission's meta JSON (malloc'd), NULL when none */
  size_t body_len;                       /* bytes of its stored body, 0 when none */
  int64_t leased_ms, expires_ms;         /* of its lease */
  int64_t received_ms;                   /* when accepted or rejected; -1 before */
} lh_ledger_group;

/* Frees what lh_ledger_group_get allocated in g and zeroes it; accepts NULL. */
void lh_ledger_group_clear(lh_ledger_group *g);

/* Group-committed: a lease of n groups (1 .. LH_LEDGER_LEASE_MAX) to a registered worker
 * (LH_ERR_NOTFOUND otherwise), expiring at expires_ms (>= now_ms), and a group in state LEASED
 * for each spec. Writes the lease's id and the groups' ids (group_ids has room for n; the ids are
 * consecutive and increasing, never reused, the first group of a ledger is 1). */
lh_err lh_ledger_lease(lh_ledger *l, const uint8_t worker[LH_LEDGER_KEY_BYTES], int64_t now_ms,
                       int64_t expires_ms, int n, const lh_ledger_group_spec *specs,
                       int64_t *lease_id, int64_t *group_ids);
/* Everything about one group (out is cleared first; lh_ledger_group_clear it after success);
 * LH_ERR_NOTFOUND for an id never issued. */
lh_err lh_ledger_group_get(lh_ledger *l, int64_t group, lh_ledger_group *out);
/* LEASED or EXPIRED -> ACCEPTED, with the body (the encoded rollout batch, 1 ..
 * LH_LEDGER_BODY_MAX bytes), version_used (>= 0), meta_json (NULL for none, at most
 * LH_LEDGER_META_MAX bytes) and received_ms = now_ms. Durable when it returns LH_ERR_OK: the
 * server may answer 202. A group in any other state is LH_ERR_INVAL naming that state; an
 * unknown one LH_ERR_NOTFOUND. Group-committed (above): a failure of the database fails every
 * change of that commit and writes none of them. Two accepts of one group, in one commit or not,
 * settle it once: the later one is LH_ERR_INVAL (the group is accepted). */
lh_err lh_ledger_group_accept(lh_ledger *l, int64_t group, int64_t version_used, const void *body,
                              size_t len, const char *meta_json, int64_t now_ms);
/* Group commits written so far that held accepts (lh_ledger_group_accept), and the accepts they
 * wrote (their ratio is the mean batch; an accept refused in a commit, as a repeat, is not
 * counted). */
void lh_ledger_accept_stats(lh_ledger *l, int64_t *commits, int64_t *accepts);
/* LEASED or EXPIRED -> REJECTED with the reason (1 .. LH_LEDGER_REASON_MAX bytes) and
 * version_used (-1 when the submission did not say); no body is kept. Other states LH_ERR_INVAL. */
lh_err lh_ledger_group_reject(lh_ledger *l, int64_t group, int64_t version_used, const char *reason,
                              int64_t now_ms);
/* ACCEPTED -> REJECTED with the reason (1 .. LH_LEDGER_REASON_MAX bytes): a group that verification
 * refused after it was stored (the server verifies on the training thread's forward). Its body
 * is kept as evidence. Other states LH_ERR_INVAL naming the state; an unknown id LH_ERR_NOTFOUND.
 */
lh_err lh_ledger_group_refute(lh_ledger *l, int64_t group, const char *reason, int64_t now_ms);
/* A copy of a group's body (malloc'd, *len bytes). LH_ERR_NOTFOUND for an unknown group or one
 * without a body (never accepted, or pruned), the message saying which. */
lh_err lh_ledger_group_body(lh_ledger *l, int64_t group, void **body, size_t *len);
/* One transaction: every LEASED group whose lease's expires_ms < now_ms becomes EXPIRED; *groups
 * (malloc'd, in id order, NULL when none) lists them so the server can lease their tasks again. */
lh_err lh_ledger_expire(lh_ledger *l, int64_t now_ms, int64_t **groups, int *n);
/* The ACCEPTED groups in id order (*groups malloc'd, NULL when none): the server's queue. */
lh_err lh_ledger_accepted(lh_ledger *l, int64_t **groups, int *n);

/* ---------------------------------------------------------------- training */

/* For the update that makes policy version `version` (>= 0): the groups of `trained` become
 * TRAINED and those of `dropped` DROPPED (reason "stale"), both with trained_at = version, and
 * each gets one event in the training log. Every id must be ACCEPTED and appear once in the two
 * lists (n_trained + n_dropped in 1 .. LH_LEDGER_TRAIN_MAX), else LH_ERR_INVAL (LH_ERR_NOTFOUND
 * for an id never issued) naming the first offender, and nothing changes. Group-committed in
 * parts: every id is checked first (on a read connection, holding no commit), then the marks are
 * written LH_LEDGER_TRAIN_PART per commit, beside the submissions; the call returns when the last
 * part is durable. A crash between parts, or a part that fails (the database, or a group another
 * thread changed since the check: that part's whole commit fails), leaves the earlier parts marked
 * at `version`: a rewind to an earlier version (a restart from its checkpoint) undoes them, as it
 * undoes a whole update whose version was not checkpointed. */
lh_err lh_ledger_train(lh_ledger *l, int64_t version, const int64_t *trained, int n_trained,
                       const int64_t *dropped, int n_dropped);
/* After a restart from the checkpoint at `version` (-1: from no checkpoint at all), one
 * transaction: every group TRAINED or DROPPED at a later version goes back to ACCEPTED
 * (trained_at -1, reason ""), their log events are marked undone by this rewind (never deleted),
 * and the versions after `version` are forgotten with their blobs. *n_back (may be NULL) is how
 * many groups went back. Refused (LH_ERR_INVAL) below the version bodies were pruned to
 * (lh_ledger_prune_bodies): those groups could not be trained again. */
lh_err lh_ledger_rewind(lh_ledger *l, int64_t version, int64_t *n_back);
/* Deletes the bodies of groups TRAINED or DROPPED at or before `version`, which must be a
 * checkpoint the server will never rewind past (every later rewind must be to `version` or
 * after). *n (may be NULL) is how many bodies went. The space is reused by later bodies.
 * Group-committed in parts: the first commit records `version` as the one rewinds may not go
 * below, then the bodies go LH_LEDGER_PRUNE_PART per commit. */
lh_err lh_ledger_prune_bodies(lh_ledger *l, int64_t version, int64_t *n);

/* One event of the append-only training log. */
typedef struct lh_ledger_log_entry {
  int64_t seq;         /* 1, 2, 3, ... in the order of the events */
  int64_t version;     /* the update's version */
  int64_t group;       /* the group trained or dropped */
  lh_group_state what; /* LH_GROUP_TRAINED or LH_GROUP_DROPPED */
  int64_t undone_by;   /* the rewind (1, 2, ...) that undid it; 0 while it stands (live) */
} lh_ledger_log_entry;
/* The whole training log in order (*out malloc'd, NULL when empty). */
lh_err lh_ledger_log(lh_ledger *l, lh_ledger_log_entry **out, int *n);

/* ---------------------------------------------------------------- versions and blobs */

typedef struct lh_ledger_blob {
  uint8_t hash[LH_LEDGER_HASH_BYTES];
  int kind;             /* 0 snapshot, 1 patch */
  int64_t from_version; /* a patch's parent version (< the version); -1 for a snapshot */
  uint64_t size;        /* bytes, >= 1 */
} lh_ledger_blob;

/* Group-committed: records a published version (>= 0) with its parent (-1 .. version - 1), the
 * slab's hash, the signed manifest's bytes (1 .. LH_LEDGER_MANIFEST_MAX) and its blobs (0 ..
 * LH_LEDGER_MAX_BLOBS, no hash twice). Putting a version again with the same parent, slab hash,
 * manifest and blobs (in any order) is LH_ERR_OK and changes nothing; with anything else
 * different it is LH_ERR_MISMATCH, naming what differs. */
lh_err lh_ledger_version_put(lh_ledger *l, int64_t version, int64_t parent,
                             const uint8_t slab_hash[LH_LEDGER_HASH_BYTES], const void *manifest,
                             size_t manifest_len, int64_t now_ms, int n_blobs,
                             const lh_ledger_blob *blobs);
/* A version's signed manifest (malloc'd, *len bytes, with a NUL after them); LH_ERR_NOTFOUND. */
lh_err lh_ledger_version_get(lh_ledger *l, int64_t version, char **manifest, size_t *len);
/* A version's blobs, ordered by hash (*out malloc'd, NULL when none); LH_ERR_NOTFOUND for a
 * version not published. */
lh_err lh_ledger_version_blobs(lh_ledger *l, int64_t version, lh_ledger_blob **out, int *n);
/* Whether a blob of that hash belongs to a published version: *out (may be NULL) is its record,
 * *version (may be NULL) the lowest such version; LH_ERR_NOTFOUND otherwise. For serving only
 * the blobs of versions that stand. */
lh_err lh_ledger_blob_find(lh_ledger *l, const uint8_t hash[LH_LEDGER_HASH_BYTES],
                           lh_ledger_blob *out, int64_t *version);
/* One past the highest task_index any group was leased with (0 when none): where a restarted
 * server continues handing out new tasks. */
lh_err lh_ledger_next_task(lh_ledger *l, uint64_t *task);
/* The highest published version; LH_ERR_NOTFOUND when none. */
lh_err lh_ledger_latest_version(lh_ledger *l, int64_t *version);

/* ---------------------------------------------------------------- status and audit */

typedef struct lh_ledger_reason_count {
  char reason[LH_LEDGER_REASON_MAX + 1];
  int64_t count;
} lh_ledger_reason_count;

/* What the server's /v1/status shows, read in one transaction (a consistent picture). */
typedef struct lh_ledger_stats_result {
  int64_t groups[LH_GROUP__COUNT]; /* groups by state */
  int64_t workers, leases;
  int64_t versions;             /* published versions that stand */
  int64_t latest_version;       /* -1 when none */
  int64_t blob_bytes;           /* bytes of the distinct blobs of those versions */
  int64_t body_bytes;           /* bytes of the bodies stored */
  int64_t log_live, log_undone; /* training events that stand, and those undone by rewinds */
  int64_t rewinds;
  int n_reasons; /* entries of `rejected`, at most LH_LEDGER_TOP_REASONS */
  lh_ledger_reason_count rejected[LH_LEDGER_TOP_REASONS]; /* most frequent first, ties by text */
} lh_ledger_stats_result;
/* Counts come from a table the ledger keeps in step with every change (state_counts); the other
 * numbers cost a pass over their tables' rows (fast for the tables of a run: no bodies are read).
 */
lh_err lh_ledger_stats(lh_ledger *l, lh_ledger_stats_result *out);

typedef struct lh_ledger_audit_result {
  int64_t groups[LH_GROUP__COUNT]; /* groups by state, counted from the groups themselves */
  int64_t log_live, log_undone;
  int64_t latest_version; /* -1 when none */
  int64_t bad_group;      /* the lowest id of a group that breaks an invariant; 0 when none */
  char problem[512];      /* what is wrong (also the error message); "" when nothing */
} lh_ledger_audit_result;
/* Checks, in one read transaction, the invariants a run must keep (docs/ARCHITECTURE.md, "The
 * ledger"): each group has at most one live training event; a TRAINED or DROPPED group has
 * exactly one, of its state at its trained_at, and any other group none; no trained_at beyond
 * the latest version; every ACCEPTED group has its body; trained_at is -1 outside TRAINED and
 * DROPPED; the state counts kept for lh_ledger_stats agree with the groups, and each worker's
 * kept counts with its groups. Fills *r and returns
 * LH_ERR_OK, or LH_ERR_MISMATCH naming the lowest group id that breaks one (r->bad_group; 0 for
 * a worker's counts), r->problem saying what. Run it when the server is quiet (after the version of
 * the last update is put): between lh_ledger_train and that version's lh_ledger_version_put,
 * trained_at is beyond it. */
lh_err lh_ledger_audit(lh_ledger *l, lh_ledger_audit_result *r);

#endif
