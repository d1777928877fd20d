/* `longhaul serve` (node.h): the trainer and coordinator in one process. HTTP threads (one per
 * connection, http.h) register workers, lease prompt groups, check and score submitted groups
 * and put them in the ledger (durable before the 202) and in the queue; the calling thread is
 * the training thread: it takes the oldest groups within the staleness bound K, recomputes their
 * logits under the version that generated each (the bf16 weights of the last K + 1 versions are
 * kept, within --max-kept-mb), verifies every token on them (trust.h) and takes the behaviour
 * log-probs from them when the loss uses them, trains, and publishes the new version (patch,
 * keyframe, signed manifest), checkpointed before any worker can see it. Leases are bounded by the
 * lease window (lh_serve_lease_window: what keeps the trainer fed, measured), not by the staleness
 * bound. docs/PROTOCOL.md, "The networked protocol", has the endpoints and what a restart
 * guarantees. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "longhaul/http.h"
#include "longhaul/ledger.h"
#include "longhaul/node.h"
#include "longhaul/patch.h"
#include "longhaul/rundir.h"
#include "longhaul/tensor.h"
#include "longhaul/trainer.h"

/* Signed requests remembered (16 bytes each): about 100 s of 2,600 requests/s (the load target's
 * submissions and leases) before an entry within the window is forgotten (trust.h) */
#define REPLAY_SLOTS     ((int64_t)1 << 18)
#define MAX_OUTSTANDING  256 /* leased, unanswered groups per worker at most */
#define POLL_WAIT_MAX_S  30  /* a long poll waits at most this */
#define CHAIN_MAX        64  /* manifests one chain=1 answer holds at most */
#define ROLLOUT_BODY_MAX ((size_t)32 << 20)
#define SMALL_BODY_MAX   ((size_t)64 << 10)
#define CACHE_IMMUTABLE  "public, max-age=31536000, immutable"
#define REPUTE_SLOTS     1024 /* keys whose reputation is remembered (a miss reads the ledger) */
#define EXPIRE_EVERY_S   0.25 /* the training thread expires leases at most this often */
/* A rejection whose reason starts so is the server's own failure, not the worker's: it never
 * counts toward a ban (docs/SECURITY.md, "Reputation"). */
#define EXCUSED_PREFIX "env:"

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A group waiting to be trained on. */
typedef struct queued {
  int64_t group, version, arrived;
  lh_rollout_batch b;
  bool verified; /* checked (trust.h) on the forward that recomputed its log-probs */
} queued;

/* The bf16 weights of a published version, kept for recomputing behaviour log-probs. */
typedef struct kept {
  int64_t version; /* -1: empty */
  uint16_t *slab;
} kept;

/* A key's standing as last read from the ledger (lh_ledger_worker_recent), kept while its group
 * counts say it cannot have changed: a ban verdict changes only with a new rejection (a banned
 * key submits nothing more, and more accepted work only moves rejections out of the window); an
 * abandonment verdict only with a new expiry, or, once refused, with any new submission. */
typedef struct repute {
  uint8_t key[32];
  bool used;
  int64_t counts[LH_GROUP__COUNT]; /* the worker's groups by state when judged */
  bool banned, abandoning;
  int64_t bad, submitted;   /* rejections of its own among its latest `submitted` groups */
  int64_t expired, settled; /* expired among its latest `settled` groups */
} repute;

typedef struct server {
  const lh_serve_config *c;
  lh_rl_run_config rl; /* the run's settings (from run.json on resume) */
  int stale_k;         /* the staleness bound applied: rl.staleness within --max-kept-mb */
  lh_rundir *rd;
  lh_ledger *ledger;
  lh_trainer *tr;
  lh_env *env;
  lh_env *eval_env;     /* --eval-every's own, so scoring never waits for it (NULL: off) */
  int64_t heldout_step; /* the latest held-out evaluation (-1: none yet) */
  lh_eval_heldout heldout;
  lh_tokenizer *tok;
  lh_model_files files;
  lh_sync_secret_key sk;
  lh_sync_public_key pk;
  char *blob_dir;
  int vocab;
  size_t n_params;
  lh_patch_section *sections;
  int n_sections;
  uint8_t h_config[LH_HASH_BYTES], h_tok[LH_HASH_BYTES], h_gen[LH_HASH_BYTES];
  bool has_tok, has_gen;
  int64_t start_ms;
  double t_start;
  lh_http_server *http;

  pthread_mutex_t mu; /* everything below */
  pthread_cond_t published_cv, queue_cv;
  int64_t version; /* newest published */
  char *manifest;  /* its signed manifest */
  size_t manifest_len;
  int64_t last_keyframe;   /* the newest snapshot made (the training thread's) */
  int64_t served_keyframe; /* the newest snapshot published (where chain=1 may start) */
  uint64_t snapshot_bytes, chain_bytes; /* the last snapshot's size; patches since it */
  kept *kept;
  int n_kept;
  queued *q;
  int q_len, q_cap;
  uint64_t next_task;
  uint64_t *reissue; /* tasks of expired or rejected groups, to lease again */
  int n_reissue, reissue_cap;
  lh_trust_replay *replay;    /* the signed requests seen */
  int64_t outstanding;        /* groups leased and not yet answered or expired */
  int64_t sync_version;       /* --sync: the version whose groups are being leased, */
  int sync_issued;            /* and how many of them are out */
  pthread_mutex_t env_mu;     /* scoring: an environment is used by one thread at a time */
  lh_trust_config trust;      /* the tolerances, with the model's stop ids */
  lh_sample_scratch *scratch; /* the training thread's, for verification */
  lh_trust_limiter *limiter;  /* per-key rate limits, or NULL */
  lh_sync_public_key
      *allow;     /* --allow-keys sorted by bytes (admit searches it), or NULL (any key) */
  repute *repute; /* REPUTE_SLOTS, by the key's first bytes */
  int n_allow;
  bool stopping;
  /* counters */
  int64_t accepted, rejected, trained, dropped, repeats;
  int64_t refuted, verified, verified_tokens; /* groups verification rejected, checked; tokens */
  int64_t refused[4];   /* requests refused: banned, not allowed, rate, abandoning (leases) */
  int64_t before_start; /* signed requests refused for a time before the server started */
  double verify_s;      /* time spent in the check itself (not the forward) */
  double forward_s;     /* time spent in the forwards that recompute the logits */
  double step_verify_s, step_forward_s;    /* the same since the last metrics line */
  double step_lp_err;                      /* the largest log-prob difference since then */
  double step_border_expected;             /* the honest BORDERLINE chances summed since then */
  int64_t step_tokens, step_borderline;    /* tokens checked since then, BORDERLINE among them */
  int step_border_member;                  /* the most BORDERLINE positions in one member */
  uint64_t bytes_shipped, bytes_snapshots; /* blob bytes served; of full snapshots that many */
  int64_t versions_published;
  double busy_s;   /* the training thread's time in updates: verification, update, publishing */
  double lease_s;  /* mean time from a lease to its group's arrival (s; 0: none yet) */
  double update_s; /* the training thread's mean time per update (s; 0: none yet) */
  double last_staleness;
  int64_t stale_hist[65]; /* staleness of trained groups, 64 = 64 or more */
} server;

/* ---------------------------------------------------------------- helpers */

/* The MB a version's kept bf16 weights take. */
static double version_mb(size_t n_params) {
  return (double)n_params * sizeof(uint16_t) / 1e6;
}

int lh_serve_staleness_bound(int max_staleness, size_t n_params, double kept_max_mb) {
  double per = version_mb(n_params);
  double fit = per > 0 ? floor(kept_max_mb / per) : (double)max_staleness + 1;
  if (fit < 1) return -1;
  return fit - 1 < max_staleness ? (int)fit - 1 : max_staleness;
}

int64_t lh_serve_lease_window(int prompts, double lease_s, double update_s) {
  if (!(lease_s > 0) || !(update_s > 0)) return (int64_t)prompts * 4;
  double u = ceil(lease_s / update_s);
  if (u > LH_SERVE_WINDOW_UPDATES - 2) u = LH_SERVE_WINDOW_UPDATES - 2;
  return (int64_t)prompts * (2 + (int64_t)u);
}

bool lh_serve_lease_full(int64_t q_len, int64_t out, int prompts, double lease_s, double update_s) {
  return q_len >= (int64_t)LH_SERVE_QUEUE_UPDATES * prompts ||
         q_len + out >= lh_serve_lease_window(prompts, lease_s, update_s);
}

/* An exponentially weighted mean: x folded into *mean with weight w (the first x is taken). */
static void ewma(double *mean, double x, double w) {
  *mean = *mean > 0 ? (1 - w) * *mean + w * x : x;
}

/* The kept slab of a version, or NULL. Caller holds mu. */
static const uint16_t *kept_slab(server *s, int64_t v) {
  for (int i = 0; i < s->n_kept; i++)
    if (s->kept[i].version == v) return s->kept[i].slab;
  return NULL;
}

/* Keeps a copy of version v's slab, replacing the oldest. Caller holds mu. */
static void keep_slab(server *s, int64_t v, const uint16_t *slab) {
  int oldest = 0;
  for (int i = 0; i < s->n_kept; i++) {
    if (s->kept[i].version < 0) {
      oldest = i;
      break;
    }
    if (s->kept[i].version < s->kept[oldest].version) oldest = i;
  }
  kept *k = &s->kept[oldest];
  if (!k->slab) k->slab = lh_xmalloc(s->n_params * sizeof *k->slab);
  memcpy(k->slab, slab, s->n_params * sizeof *k->slab);
  k->version = v;
}

static void reissue_push(server *s, uint64_t task) {
  if (s->n_reissue == s->reissue_cap) {
    s->reissue_cap = s->reissue_cap ? 2 * s->reissue_cap : 64;
    s->reissue = lh_xrealloc(s->reissue, (size_t)s->reissue_cap * sizeof *s->reissue);
  }
  s->reissue[s->n_reissue++] = task;
}

static void queue_push(server *s, queued *e) {
  if (s->q_len == s->q_cap) {
    s->q_cap = s->q_cap ? 2 * s->q_cap : 64;
    s->q = lh_xrealloc(s->q, (size_t)s->q_cap * sizeof *s->q);
  }
  s->q[s->q_len++] = *e;
}

/* ---------------------------------------------------------------- publishing */

/* Signs and records version v (blobs already in the store), then makes it visible. */
static lh_err publish(server *s, int64_t v, const uint16_t *slab, const lh_sync_blob_ref *blobs,
                      int n_blobs, const int64_t *trained, int n_trained, const int64_t *dropped,
                      int n_dropped) {
  lh_sync_manifest m;
  memset(&m, 0, sizeof m);
  m.version = v;
  m.parent = v > 0 ? v - 1 : LH_SYNC_NONE;
  m.elements = s->n_params;
  lh_sync_slab_hash(slab, s->n_params, m.slab);
  memcpy(m.config, s->h_config, LH_HASH_BYTES);
  memcpy(m.tokenizer, s->h_tok, LH_HASH_BYTES);
  m.has_tokenizer = s->has_tok;
  memcpy(m.generation, s->h_gen, LH_HASH_BYTES);
  m.has_generation = s->has_gen;
  m.n_blobs = n_blobs;
  memcpy(m.blobs, blobs, (size_t)n_blobs * sizeof *blobs);
  char *text = NULL;
  size_t len = 0;
  lh_err e;
  if ((e = lh_sync_manifest_sign(&m, &s->sk, &text, &len))) return e;
  lh_ledger_blob lb[LH_SYNC_MAX_BLOBS];
  for (int i = 0; i < n_blobs; i++) {
    memcpy(lb[i].hash, blobs[i].hash, LH_HASH_BYTES);
    lb[i].kind = blobs[i].kind == LH_SYNC_PATCH ? 1 : 0;
    lb[i].from_version = blobs[i].kind == LH_SYNC_PATCH ? blobs[i].from : -1;
    lb[i].size = blobs[i].size;
  }
  /* Ledger first, checkpoint second: a crash between them rewinds the ledger to the
   * checkpoint on restart, so these groups are trained again, once. */
  if ((n_trained + n_dropped > 0 &&
       (e = lh_ledger_train(s->ledger, v, trained, n_trained, dropped, n_dropped))) ||
      (e = lh_ledger_version_put(s->ledger, v, m.parent, m.slab, text, len, now_ms(), n_blobs,
                                 lb)) ||
      (e = lh_trainer_checkpoint(s->tr, s->rd, &s->files, s->rl.keep, NULL))) {
    free(text);
    return e;
  }
  /* The bodies of groups trained at or before the oldest checkpoint kept are never needed again
   * (a restart rewinds to a checkpoint at the oldest): the ledger stays bounded. */
  int64_t oldest = s->rl.keep > 0 ? v - s->rl.keep + 1 : 0;
  if (oldest > 0 && (e = lh_ledger_prune_bodies(s->ledger, oldest, NULL))) {
    free(text);
    return e;
  }
  pthread_mutex_lock(&s->mu);
  free(s->manifest);
  s->manifest = text;
  s->manifest_len = len;
  s->version = v;
  for (int i = 0; i < n_blobs; i++)
    if (blobs[i].kind == LH_SYNC_SNAPSHOT) s->served_keyframe = v;
  s->versions_published++;
  keep_slab(s, v, slab);
  pthread_cond_broadcast(&s->published_cv);
  pthread_mutex_unlock(&s->mu);
  return LH_ERR_OK;
}

/* The blobs of version v: a patch from the previous version's slab (when there is one) and,
 * when the keyframe rule says so, a snapshot. */
static lh_err make_blobs(server *s, int64_t v, const uint16_t *prev, const uint16_t *slab,
                         lh_sync_blob_ref *blobs, int *n) {
  *n = 0;
  lh_err e;
  uint64_t patch_len = 0;
  if (prev) {
    uint8_t *p = NULL;
    size_t len = 0;
    if ((e = lh_patch_make(prev, slab, s->n_params, s->sections, s->n_sections, v - 1, v, &p,
                           &len)))
      return e;
    lh_sync_blob_ref *b = &blobs[(*n)++];
    b->kind = LH_SYNC_PATCH;
    b->from = v - 1;
    b->size = len;
    e = lh_sync_blob_put(s->blob_dir, p, len, b->hash);
    free(p);
    if (e) return e;
    patch_len = len;
  }
  if (!prev || lh_sync_keyframe_due(s->c->keyframe_every, v, s->last_keyframe,
                                    s->chain_bytes + patch_len, s->snapshot_bytes)) {
    uint8_t *p = NULL;
    size_t len = 0;
    if ((e = lh_sync_snapshot_encode(slab, s->n_params, LH_SYNC_SNAPSHOT_LEVEL, &p, &len)))
      return e;
    lh_sync_blob_ref *b = &blobs[(*n)++];
    b->kind = LH_SYNC_SNAPSHOT;
    b->from = LH_SYNC_NONE;
    b->size = len;
    e = lh_sync_blob_put(s->blob_dir, p, len, b->hash);
    free(p);
    if (e) return e;
    s->last_keyframe = v;
    s->snapshot_bytes = len;
    s->chain_bytes = 0;
  } else {
    s->chain_bytes += patch_len;
  }
  return LH_ERR_OK;
}

static lh_err keep_rebuilt(void *ctx, int64_t v, const uint16_t *slab) {
  keep_slab(ctx, v, slab);
  return LH_ERR_OK;
}

/* Keeps the slabs of published versions lo .. hi, rebuilt from the blob store in one pass along
 * the chain (a restart's staleness window): their manifests from the ledger, back to the newest
 * snapshot at or before lo. */
static lh_err keep_from_blobs(server *s, int64_t lo, int64_t hi) {
  lh_sync_manifest *ms = NULL;
  int n = 0;
  lh_err e = LH_ERR_OK;
  for (int64_t u = hi; u >= 0; u--) {
    char *text = NULL;
    size_t len = 0;
    if ((e = lh_ledger_version_get(s->ledger, u, &text, &len))) break;
    ms = lh_xrealloc(ms, (size_t)(n + 1) * sizeof *ms);
    e = lh_sync_manifest_verify(text, len, &s->pk, "ledger manifest", &ms[n]);
    free(text);
    if (e) break;
    bool snap = false;
    for (int i = 0; i < ms[n].n_blobs; i++)
      snap = snap || ms[n].blobs[i].kind == LH_SYNC_SNAPSHOT;
    n++;
    if (snap && u <= lo) break;
  }
  if (!e) e = lh_sync_rebuild(ms, n, s->blob_dir, lo, hi, keep_rebuilt, s);
  free(ms);
  return e;
}

/* ---------------------------------------------------------------- HTTP: authentication */

/* The standing of worker w (docs/SECURITY.md, "Reputation"): banned when at least ban_after of
 * its latest ban_window submitted groups were rejected for a cause of its own (a rejection
 * starting with EXCUSED_PREFIX is the server's); abandoning when at least abandon_after of its
 * latest abandon_window settled groups (submitted or expired) expired without a submission, and
 * more than half did. Read from the ledger, so it survives restarts; remembered per key while
 * w's counts say it cannot have changed (struct repute), so an honest key costs no query. */
static lh_err judge(server *s, const lh_ledger_worker *w, repute *out) {
  const lh_serve_config *c = s->c;
  memset(out, 0, sizeof *out);
  bool may_ban = c->ban_after > 0 && w->groups[LH_GROUP_REJECTED] >= c->ban_after;
  bool may_abandon = c->abandon_after > 0 && w->groups[LH_GROUP_EXPIRED] >= c->abandon_after;
  if (!may_ban && !may_abandon) return LH_ERR_OK;
  uint64_t h;
  memcpy(&h, w->key, sizeof h);
  repute *slot = &s->repute[h & (REPUTE_SLOTS - 1)];
  pthread_mutex_lock(&s->mu);
  repute was = *slot;
  pthread_mutex_unlock(&s->mu);
  bool known = was.used && !memcmp(was.key, w->key, sizeof was.key);
  bool same = known && !memcmp(was.counts, w->groups, sizeof was.counts);
  bool ban_fresh = known && was.counts[LH_GROUP_REJECTED] == w->groups[LH_GROUP_REJECTED];
  bool abandon_fresh =
      known && was.counts[LH_GROUP_EXPIRED] == w->groups[LH_GROUP_EXPIRED] && !was.abandoning;
  if (same || ((!may_ban || ban_fresh) && (!may_abandon || abandon_fresh))) {
    *out = was;
    out->banned = out->banned && may_ban;
    out->abandoning = out->abandoning && may_abandon;
    return LH_ERR_OK;
  }
  lh_ledger_recent r;
  lh_err e;
  if (may_ban) {
    if ((e = lh_ledger_worker_recent(s->ledger, w->key, c->ban_window, false, EXCUSED_PREFIX, &r)))
      return e;
    out->submitted = r.n;
    out->bad = r.groups[LH_GROUP_REJECTED] - r.excused;
    out->banned = out->bad >= c->ban_after;
  }
  if (may_abandon) {
    if ((e = lh_ledger_worker_recent(s->ledger, w->key, c->abandon_window, true, NULL, &r)))
      return e;
    out->settled = r.n;
    out->expired = r.groups[LH_GROUP_EXPIRED];
    out->abandoning = out->expired >= c->abandon_after && 2 * out->expired > out->settled;
  }
  memcpy(out->key, w->key, sizeof out->key);
  memcpy(out->counts, w->groups, sizeof out->counts);
  out->used = true;
  pthread_mutex_lock(&s->mu);
  *slot = *out;
  pthread_mutex_unlock(&s->mu);
  return LH_ERR_OK;
}

static int cmp_key(const void *a, const void *b) {
  return memcmp(((const lh_sync_public_key *)a)->bytes, ((const lh_sync_public_key *)b)->bytes,
                LH_SYNC_PUBLIC_KEY_BYTES);
}

/* Whether a key that signed a request is served: on the allowlist (when there is one), not
 * banned (fewer than ban_after rejected groups), within its rate. Writes the refusal itself. */
static bool admit(server *s, const lh_sync_public_key *pk, const lh_ledger_worker *known,
                  lh_http_response *res) {
  if (s->n_allow > 0) {
    if (!bsearch(pk, s->allow, (size_t)s->n_allow, sizeof *s->allow, cmp_key)) {
      pthread_mutex_lock(&s->mu);
      s->refused[1]++;
      pthread_mutex_unlock(&s->mu);
      lh_http_respond_error(res, 403, "not_allowed", "this key is not on the server's allowlist");
      return false;
    }
  }
  if (s->c->ban_after > 0) {
    lh_ledger_worker w;
    lh_err e = LH_ERR_OK;
    if (known) /* read by authenticate a moment ago */
      w = *known;
    else
      e = lh_ledger_worker_get(s->ledger, pk->bytes, &w);
    repute r;
    if (!e) e = judge(s, &w, &r);
    if (e && e != LH_ERR_NOTFOUND) {
      lh_http_respond_error(res, 500, "ledger", "%s", lh_last_error());
      return false;
    }
    if (!e && r.banned) {
      pthread_mutex_lock(&s->mu);
      s->refused[0]++;
      pthread_mutex_unlock(&s->mu);
      lh_http_respond_error(res, 403, "banned",
                            "this key is banned: %lld of its latest %lld submitted groups were "
                            "rejected (the limit is %d in %d)",
                            (long long)r.bad, (long long)r.submitted, s->c->ban_after,
                            s->c->ban_window);
      return false;
    }
  }
  double retry = 0;
  if (s->limiter && !lh_trust_limiter_take(s->limiter, pk->bytes, lh_time_now(), &retry)) {
    pthread_mutex_lock(&s->mu);
    s->refused[2]++;
    pthread_mutex_unlock(&s->mu);
    char ra[24];
    snprintf(ra, sizeof ra, "%d", (int)ceil(retry));
    lh_http_response_header(res, "Retry-After", ra);
    lh_http_respond_error(res, 429, "rate_limited",
                          "more than %g requests per second from this key; retry in %.2f s",
                          s->c->rate_limit, retry);
    return false;
  }
  return true;
}

/* Checks a signed request; *pk is the signer, and *who (when not NULL, and not registering) its
 * record as read for the check. Writes the error response itself. */
static bool authenticate(server *s, const lh_http_request *req, lh_http_response *res,
                         bool registering, lh_sync_public_key *pk, lh_ledger_worker *who) {
  lh_node_auth a;
  char path[2048];
  if (snprintf(path, sizeof path, "%s%s%s", req->path, req->query[0] ? "?" : "", req->query) >=
      (int)sizeof path) {
    lh_http_respond_error(res, 414, "uri_too_long", "the path and query exceed %zu bytes",
                          sizeof path);
    return false;
  }
  if (lh_node_auth_parse(lh_http_request_header(req, LH_NODE_HDR_KEY),
                         lh_http_request_header(req, LH_NODE_HDR_TIME),
                         lh_http_request_header(req, LH_NODE_HDR_NONCE),
                         lh_http_request_header(req, LH_NODE_HDR_SIGNATURE), &a)) {
    lh_http_respond_error(res, 401, "bad_auth", "%s", lh_last_error());
    return false;
  }
  lh_ledger_worker w; /* the signer's record (not read when registering) */
  if (!registering) {
    lh_err e = lh_ledger_worker_get(s->ledger, a.key.bytes, &w);
    if (e == LH_ERR_NOTFOUND) {
      lh_http_respond_error(res, 401, "unknown_key",
                            "this key is not registered: POST /v1/workers first");
      return false;
    }
    if (e) {
      lh_http_respond_error(res, 500, "ledger", "%s", lh_last_error());
      return false;
    }
  }
  if (lh_node_auth_verify(&a, req->method, path, req->body, req->body_len)) {
    lh_http_respond_error(res, 401, "bad_signature",
                          "the signature does not cover this request with this key");
    return false;
  }
  /* the time (when the request began to arrive, so a slow upload is not stale) and the nonce:
   * once per key (trust.h, the replay table) */
  lh_trust_replay_verdict v =
      a.time_ms < s->start_ms ? LH_REPLAY_STALE
                              : lh_trust_replay_check(s->replay, a.key.bytes, a.nonce,
                                                      sizeof a.nonce, a.time_ms, req->arrived_ms);
  if (a.time_ms < s->start_ms) {
    pthread_mutex_lock(&s->mu);
    s->before_start++;
    pthread_mutex_unlock(&s->mu);
  }
  if (v == LH_REPLAY_STALE || v == LH_REPLAY_FORGOTTEN) {
    json_t *o = json_pack("{s:{s:s,s:s},s:I}", "error", "code", "stale_time", "message",
                          v == LH_REPLAY_STALE
                              ? "the request's time is outside the server's window: sign it again "
                                "with the current time (server_time_ms)"
                              : "the request's time is older than the requests the server still "
                                "remembers: sign it again with the current time (server_time_ms)",
                          "server_time_ms", (json_int_t)now_ms());
    lh_http_respond_json(res, 401, o);
    json_decref(o);
    return false;
  }
  if (v == LH_REPLAY_SEEN) {
    lh_http_respond_error(res, 409, "replayed_nonce", "this request was received before");
    return false;
  }
  *pk = a.key;
  if (who && !registering) *who = w;
  return admit(s, pk, registering ? NULL : &w, res);
}

/* ---------------------------------------------------------------- HTTP: endpoints */

static void h_register(server *s, const lh_http_request *req, lh_http_response *res) {
  lh_sync_public_key pk;
  if (!authenticate(s, req, res, true, &pk, NULL)) return;
  char *name = NULL, *hw_text = NULL;
  if (lh_node_register_parse(req->body, req->body_len, &name, &hw_text)) {
    lh_http_respond_error(res, 400, "bad_body",
                          "%s; expected {\"name\": STRING, \"hardware\": OBJECT}", lh_last_error());
    return;
  }
  bool is_new = false;
  lh_err e = lh_ledger_worker_register(s->ledger, pk.bytes, name, hw_text, now_ms(), &is_new);
  free(name);
  free(hw_text);
  if (e) {
    lh_http_respond_error(res, e == LH_ERR_LIMIT ? 413 : 500,
                          e == LH_ERR_LIMIT ? "too_large" : "ledger", "%s", lh_last_error());
    return;
  }
  pthread_mutex_lock(&s->mu);
  int64_t v = s->version;
  pthread_mutex_unlock(&s->mu);
  json_t *r = json_pack("{s:b,s:I,s:I}", "new", is_new, "version", (json_int_t)v, "server_time_ms",
                        (json_int_t)now_ms());
  lh_http_respond_json(res, is_new ? 201 : 200, r);
  json_decref(r);
}

/* The spec of a group for task `task` (prompt tokens encoded here), or false when the task
 * cannot be used (logged). */
static bool make_group(server *s, uint64_t task, int64_t min_version, lh_node_group *g) {
  memset(g, 0, sizeof *g);
  lh_env_task t;
  pthread_mutex_lock(&s->env_mu);
  lh_err e = lh_env_task_get(s->env, LH_SPLIT_TRAIN, task, &t);
  pthread_mutex_unlock(&s->env_mu);
  if (e) {
    lh_log(LH_LOG_WARN, "serve: task %llu skipped: %s", (unsigned long long)task, lh_last_error());
    return false;
  }
  size_t n = 0;
  e = lh_tokenizer_encode(s->tok, t.prompt, strlen(t.prompt), true, &g->prompt, &n);
  lh_env_task_clear(&t);
  if (e || n < 1 || n > (size_t)s->rl.max_prompt) {
    if (!e)
      lh_log(LH_LOG_WARN, "serve: task %llu skipped: a prompt of %zu tokens (--max-prompt %d)",
             (unsigned long long)task, n, s->rl.max_prompt);
    lh_node_group_clear(g);
    return false;
  }
  g->prompt_len = (int)n;
  g->task = task;
  g->group_size = s->rl.group;
  /* The server chooses every group's sampler streams: the run's seed, and a random base of
   * 52 bits (so base + j stays below 2^53), so a worker can generate many groups together. */
  g->seed = s->rl.seed;
  randombytes_buf(&g->stream_base, sizeof g->stream_base);
  g->stream_base &= ((uint64_t)1 << 52) - 1;
  g->max_new = s->rl.max_new;
  g->sample = lh_sample_defaults();
  g->min_version = min_version;
  return true;
}

static void h_lease(server *s, const lh_http_request *req, lh_http_response *res) {
  lh_sync_public_key pk;
  lh_ledger_worker w; /* as authenticate read it a moment ago */
  if (!authenticate(s, req, res, false, &pk, &w)) return;
  lh_node_lease_request lr;
  if (lh_node_lease_request_parse(req->body, req->body_len, &lr)) {
    lh_http_respond_error(res, 400, "bad_body", "%s", lh_last_error());
    return;
  }
  repute rp;
  if (judge(s, &w, &rp)) {
    lh_http_respond_error(res, 500, "ledger", "%s", lh_last_error());
    return;
  }
  if (rp.abandoning) { /* selective submission: its late submissions are still taken */
    pthread_mutex_lock(&s->mu);
    s->refused[3]++;
    pthread_mutex_unlock(&s->mu);
    lh_http_respond_error(res, 403, "abandoning",
                          "%lld of this key's latest %lld groups expired without a submission "
                          "(at most %d, or half, may): no new leases until it submits them",
                          (long long)rp.expired, (long long)rp.settled, s->c->abandon_after - 1);
    return;
  }
  int64_t outstanding = w.groups[LH_GROUP_LEASED];
  if (outstanding >= MAX_OUTSTANDING) {
    lh_http_response_header(res, "Retry-After", "5");
    lh_http_respond_error(res, 429, "too_many_leases",
                          "%lld groups leased and not answered; at most %d", (long long)outstanding,
                          MAX_OUTSTANDING);
    return;
  }
  int want = lr.groups;
  if (want > MAX_OUTSTANDING - outstanding) want = (int)(MAX_OUTSTANDING - outstanding);
  pthread_mutex_lock(&s->mu);
  int64_t v = s->version;
  /* backpressure: what keeps the trainer fed and no more (with one update's worth queued as the
   * gate, the queue ran dry behind a 300 ms link: docs/PERFORMANCE.md, "The queue gate") */
  int64_t out = s->outstanding > 0 ? s->outstanding : 0; /* (a race of expiry and accept) */
  bool full = lh_serve_lease_full(s->q_len, out, s->rl.prompts, s->lease_s, s->update_s);
  if (s->c->sync_mode) { /* only the groups of the current version's update */
    if (s->sync_version != v) s->sync_version = v, s->sync_issued = 0;
    if (want > s->rl.prompts - s->sync_issued) want = s->rl.prompts - s->sync_issued;
    s->sync_issued += want;
  }
  pthread_mutex_unlock(&s->mu);
  if (want <= 0) { /* --sync: this version's groups are out; ask again after the next */
    res->status = 204;
    return;
  }
  lh_node_group *gs = lh_xcalloc((size_t)want, sizeof *gs);
  int n = 0;
  int64_t min_version = v - s->stale_k > 0 ? v - s->stale_k : 0;
  if (s->c->sync_mode) min_version = v;
  for (int tries = 0; !full && n < want && tries < 4 * want; tries++) {
    pthread_mutex_lock(&s->mu);
    uint64_t task = s->n_reissue > 0 ? s->reissue[--s->n_reissue] : s->next_task++;
    pthread_mutex_unlock(&s->mu);
    if (make_group(s, task, min_version, &gs[n])) n++;
  }
  if (s->c->sync_mode && n < want) {
    pthread_mutex_lock(&s->mu);
    if (s->sync_version == v) s->sync_issued -= want - n;
    pthread_mutex_unlock(&s->mu);
  }
  if (n == 0) {
    free(gs);
    lh_http_response_header(res, "Retry-After", "1");
    lh_http_respond_error(res, 503, full ? "queue_full" : "no_tasks",
                          full ? "the training queue is full; try again"
                               : "no task could be "
                                 "leased");
    return;
  }
  lh_ledger_group_spec specs[LH_NODE_MAX_LEASE_GROUPS];
  char *texts[LH_NODE_MAX_LEASE_GROUPS];
  for (int i = 0; i < n; i++) {
    json_t *o = lh_node_group_json(&gs[i]);
    texts[i] = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    specs[i] = (lh_ledger_group_spec){gs[i].task, texts[i], strlen(texts[i])};
  }
  lh_node_lease l = {0, now_ms() + s->c->lease_ms, n, gs};
  int64_t ids[LH_NODE_MAX_LEASE_GROUPS];
  lh_err e = lh_ledger_lease(s->ledger, pk.bytes, now_ms(), l.expires_ms, n, specs, &l.lease, ids);
  for (int i = 0; i < n; i++) {
    free(texts[i]);
    gs[i].group = ids[i];
  }
  if (e) { /* nothing was leased: the tasks are leased again to whoever asks next */
    lh_http_respond_error(res, 500, "ledger", "%s", lh_last_error());
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < n; i++)
      reissue_push(s, gs[i].task);
    if (s->c->sync_mode && s->sync_version == v) s->sync_issued -= n;
    pthread_mutex_unlock(&s->mu);
  } else {
    pthread_mutex_lock(&s->mu);
    s->outstanding += n;
    pthread_mutex_unlock(&s->mu);
    size_t len = 0;
    char *text = lh_node_lease_json(&l, &len);
    lh_http_respond_bytes(res, 200, "application/json", text, len);
    free(text);
  }
  lh_node_lease_clear(&l);
}

/* Whether the submitted batch is the group that was leased: one group of its size, its task,
 * seed, stream, sampling parameters, completion bound and prompt; and a version the server has
 * published, not older than the lease allows. Writes why not. */
static bool matches_lease(server *s, const lh_rollout_batch *b, const lh_node_group *g, char *why,
                          size_t cap) {
  pthread_mutex_lock(&s->mu);
  int64_t v = s->version;
  pthread_mutex_unlock(&s->mu);
  const lh_sample_params *p = &b->sample, *q = &g->sample;
  if (b->n_groups != 1 || b->group_size != g->group_size)
    snprintf(why, cap, "shape: %d groups of %d, leased 1 of %d", b->n_groups, b->group_size,
             g->group_size);
  else if (b->task_index[0] != g->task || b->split != LH_SPLIT_TRAIN)
    snprintf(why, cap, "task: %llu, leased %llu", (unsigned long long)b->task_index[0],
             (unsigned long long)g->task);
  else if (b->seed != g->seed || b->stream_base != g->stream_base)
    snprintf(why, cap, "seed: not the seed the server chose");
  else if (p->temperature != q->temperature || p->top_k != q->top_k || p->top_p != q->top_p ||
           p->min_p != q->min_p)
    snprintf(why, cap, "sampling: other sampling parameters than leased");
  else if (b->max_new != g->max_new)
    snprintf(why, cap, "max_new: %d, leased %d", b->max_new, g->max_new);
  else if (b->version > v)
    snprintf(why, cap, "version: %lld, not published yet (newest %lld)", (long long)b->version,
             (long long)v);
  else if (b->version < g->min_version)
    snprintf(why, cap, "version: %lld, older than the lease's %lld", (long long)b->version,
             (long long)g->min_version);
  else if (!b->group_ok[0])
    snprintf(why, cap, "group: marked failed");
  else {
    for (int j = 0; j < b->group_size; j++) {
      const int32_t *t = b->tokens + b->seq_start[j];
      if (b->prompt_len[j] != g->prompt_len ||
          memcmp(t, g->prompt, (size_t)g->prompt_len * sizeof *t)) {
        snprintf(why, cap, "prompt: completion %d does not start with the leased prompt", j);
        return false;
      }
      if (b->seq_start[j + 1] - b->seq_start[j] - b->prompt_len[j] > g->max_new) {
        snprintf(why, cap, "max_new: completion %d is longer than %d tokens", j, g->max_new);
        return false;
      }
    }
    return true;
  }
  return false;
}

static void answer_state(lh_http_response *res, const lh_ledger_group *g) {
  if (g->state == LH_GROUP_REJECTED) {
    lh_http_respond_error(res, 422, "rejected", "group %lld was rejected: %s", (long long)g->id,
                          g->reason);
    return;
  }
  json_t *o =
      json_pack("{s:I,s:s}", "group", (json_int_t)g->id, "state", lh_group_state_name(g->state));
  lh_http_respond_json(res, 202, o);
  json_decref(o);
}

/* After a ledger call that settles a group failed: when the group was settled meanwhile by
 * another submission of it (the same group submitted twice at once), this one is a repeat and
 * is answered as such; otherwise it is the ledger's error, 500. */
static void answer_failed_settle(server *s, lh_http_response *res, int64_t group, lh_err e) {
  char why[512];
  snprintf(why, sizeof why, "%s", lh_last_error());
  lh_ledger_group g;
  if (e == LH_ERR_INVAL && !lh_ledger_group_get(s->ledger, group, &g)) {
    if (g.state != LH_GROUP_LEASED && g.state != LH_GROUP_EXPIRED) {
      pthread_mutex_lock(&s->mu);
      s->repeats++;
      pthread_mutex_unlock(&s->mu);
      answer_state(res, &g);
      lh_ledger_group_clear(&g);
      return;
    }
    lh_ledger_group_clear(&g);
  }
  lh_http_respond_error(res, 500, "ledger", "%s", why);
}

static void reject(server *s, lh_http_response *res, const lh_ledger_group *g, int64_t version,
                   const char *why) {
  int64_t group = g->id;
  lh_err e = lh_ledger_group_reject(s->ledger, group, version, why, now_ms());
  if (e) {
    answer_failed_settle(s, res, group, e);
    return;
  }
  pthread_mutex_lock(&s->mu);
  s->rejected++;
  if (g->state == LH_GROUP_LEASED) s->outstanding--;
  reissue_push(s, g->task_index);
  pthread_mutex_unlock(&s->mu);
  lh_http_respond_error(res, 422, "rejected", "group %lld: %s", (long long)group, why);
}

static void h_rollout(server *s, const lh_http_request *req, lh_http_response *res) {
  lh_sync_public_key pk;
  if (!authenticate(s, req, res, false, &pk, NULL)) return;
  char lease_s[24], group_s[24], gen_s[24] = "0";
  char *end1 = NULL, *end2 = NULL;
  if (lh_http_query_get(req->query, "lease", lease_s, sizeof lease_s) ||
      lh_http_query_get(req->query, "group", group_s, sizeof group_s)) {
    lh_http_respond_error(res, 400, "bad_query", "POST /v1/rollouts?lease=L&group=G");
    return;
  }
  lh_http_query_get(req->query, "gen_ms", gen_s, sizeof gen_s);
  long long lease = strtoll(lease_s, &end1, 10), gid = strtoll(group_s, &end2, 10);
  if (*end1 || *end2 || lease < 1 || gid < 1) {
    lh_http_respond_error(res, 400, "bad_query", "lease and group must be positive integers");
    return;
  }
  lh_ledger_group g;
  lh_err e = lh_ledger_group_get(s->ledger, gid, &g);
  if (e == LH_ERR_NOTFOUND) {
    lh_http_respond_error(res, 404, "unknown_group", "no group %lld was leased", gid);
    return;
  }
  if (e) {
    lh_http_respond_error(res, 500, "ledger", "%s", lh_last_error());
    return;
  }
  if (g.lease != lease || memcmp(g.worker, pk.bytes, sizeof pk.bytes)) {
    lh_http_respond_error(res, 403, "not_your_group",
                          "group %lld was not leased to this key in lease %lld", gid, lease);
    goto out;
  }
  if (g.state != LH_GROUP_LEASED && g.state != LH_GROUP_EXPIRED) { /* a repeat */
    pthread_mutex_lock(&s->mu);
    s->repeats++;
    pthread_mutex_unlock(&s->mu);
    answer_state(res, &g);
    goto out;
  }
  lh_node_group spec;
  if (lh_node_group_parse(g.spec, g.spec_len, s->vocab, "ledger spec", &spec)) {
    lh_http_respond_error(res, 500, "ledger", "%s", lh_last_error());
    goto out;
  }
  lh_rollout_limits lim = lh_rollout_default_limits();
  lim.max_groups = 1;
  lim.vocab = s->vocab;
  lim.max_tokens = (int64_t)spec.group_size * (spec.prompt_len + spec.max_new);
  lh_rollout_batch b;
  char why[256];
  if (lh_rollout_decode(req->body, req->body_len, &lim, "rollout body", &b)) {
    snprintf(why, sizeof why, "bad_body: %s", lh_last_error());
    reject(s, res, &g, -1, why);
  } else if (!matches_lease(s, &b, &spec, why, sizeof why)) {
    reject(s, res, &g, b.version, why);
  } else {
    free(b.old); /* never the worker's */
    b.old = NULL;
    pthread_mutex_lock(&s->env_mu);
    e = lh_rollout_score(s->tok, s->env, NULL, &b); /* the rewards are the server's */
    pthread_mutex_unlock(&s->env_mu);
    uint8_t *body = NULL;
    size_t len = 0;
    char meta[96];
    snprintf(meta, sizeof meta, "{\"gen_ms\":%lld}", atoll(gen_s));
    if (e) {
      lh_http_respond_error(res, 500, "scoring", "%s", lh_last_error());
    } else if (!b.group_ok[0]) {
      reject(s, res, &g, b.version, EXCUSED_PREFIX " the environment failed to score it");
    } else if ((e = lh_rollout_encode(&b, &body, &len))) {
      lh_http_respond_error(res, 500, "encoding", "%s", lh_last_error());
    } else if ((e = lh_ledger_group_accept(s->ledger, gid, b.version, body, len, meta,
                                           now_ms()))) { /* durable once it returns OK */
      answer_failed_settle(s, res, gid, e);
    } else {
      queued q = {gid, b.version, now_ms(), b, false};
      memset(&b, 0, sizeof b);
      double out_s = (double)(q.arrived - g.leased_ms) / 1000.0; /* its lease's time out */
      if (out_s < 0) out_s = 0;
      if (out_s > s->c->lease_ms / 1000.0) out_s = s->c->lease_ms / 1000.0;
      pthread_mutex_lock(&s->mu);
      queue_push(s, &q);
      s->accepted++;
      ewma(&s->lease_s, out_s, 0.05);
      if (g.state == LH_GROUP_LEASED) s->outstanding--;
      /* the trainer waits for an update's worth (or 200 ms): woken for every group, it read
       * the ledger's expired leases once per group accepted */
      if (s->q_len >= s->rl.prompts) pthread_cond_signal(&s->queue_cv);
      pthread_mutex_unlock(&s->mu);
      json_t *o = json_pack("{s:I,s:s}", "group", (json_int_t)gid, "state", "accepted");
      lh_http_respond_json(res, 202, o);
      json_decref(o);
    }
    free(body);
  }
  lh_rollout_batch_free(&b);
  lh_node_group_clear(&spec);
out:
  lh_ledger_group_clear(&g);
}

static void h_policy(server *s, const lh_http_request *req, lh_http_response *res) {
  char after_s[24] = "-1", wait_s[24] = "0", chain_s[8] = "0";
  lh_http_query_get(req->query, "after", after_s, sizeof after_s);
  lh_http_query_get(req->query, "wait", wait_s, sizeof wait_s);
  lh_http_query_get(req->query, "chain", chain_s, sizeof chain_s);
  char *end = NULL;
  long long after = strtoll(after_s, &end, 10);
  double wait = atof(wait_s);
  if (*end || after < -1 || !(wait >= 0)) {
    lh_http_respond_error(res, 400, "bad_query", "GET /v1/policy?after=V&wait=SECONDS");
    return;
  }
  if (wait > POLL_WAIT_MAX_S) wait = POLL_WAIT_MAX_S;
  double deadline = lh_time_now() + wait;
  pthread_mutex_lock(&s->mu);
  while (s->version <= after && !s->stopping && !lh_http_request_stopping(req)) {
    double left = deadline - lh_time_now();
    if (left <= 0) break;
    if (left > 0.1) left = 0.1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)(left * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&s->published_cv, &s->mu, &ts);
  }
  int64_t newest = s->version, keyframe = s->served_keyframe;
  bool newer = newest > after, chain = !strcmp(chain_s, "1");
  if (newer && !chain) {
    lh_http_respond_bytes(res, 200, "application/json", s->manifest, s->manifest_len);
    lh_http_response_header(res, "Cache-Control", "no-store");
  } else if (!newer) {
    res->status = 204;
    lh_http_response_header(res, "Cache-Control", "no-store");
  }
  pthread_mutex_unlock(&s->mu);
  if (!newer || !chain) return;
  /* chain=1: the manifests after `after`, one per line. All of them when they are at most
   * CHAIN_MAX and the worker holds a version, so that it may choose the patches from its own
   * version over the newest keyframe (one version behind a keyframe, a patch is a sixth of a
   * snapshot); otherwise from the newest keyframe on (CHAIN_MAX at most). */
  int64_t first = after + 1;
  if (after < 0 || newest - first + 1 > CHAIN_MAX)
    first = after + 1 > keyframe ? after + 1 : keyframe;
  if (newest - first + 1 > CHAIN_MAX) first = newest - CHAIN_MAX + 1;
  size_t cap = 0, len = 0;
  char *body = NULL;
  for (int64_t v = first; v <= newest; v++) {
    char *text = NULL;
    size_t n = 0;
    if (lh_ledger_version_get(s->ledger, v, &text, &n)) {
      free(body);
      lh_http_respond_error(res, 500, "ledger", "%s", lh_last_error());
      return;
    }
    if (len + n + 1 > cap) body = lh_xrealloc(body, cap = 2 * (len + n + 1));
    memcpy(body + len, text, n);
    len += n;
    body[len++] = '\n';
    free(text);
  }
  lh_http_respond_bytes(res, 200, "application/x-ndjson", body, len);
  lh_http_response_header(res, "Cache-Control", "no-store");
  free(body);
}

static void h_manifest(server *s, const char *arg, lh_http_response *res) {
  char *end = NULL;
  long long v = strtoll(arg, &end, 10);
  char *text = NULL;
  size_t len = 0;
  if (*end || v < 0 || lh_ledger_version_get(s->ledger, v, &text, &len)) {
    lh_http_respond_error(res, 404, "unknown_version", "no version %s is published", arg);
    return;
  }
  lh_http_respond_bytes(res, 200, "application/json", text, len);
  free(text);
}

static void h_blob(server *s, const lh_http_request *req, const char *arg, lh_http_response *res) {
  uint8_t h[LH_HASH_BYTES];
  if (lh_sync_hash_parse(arg, strlen(arg), "blob", h)) {
    lh_http_respond_error(res, 404, "unknown_blob", "a blob is named by 64 lowercase hex digits");
    return;
  }
  lh_ledger_blob b;
  bool model_file = !memcmp(h, s->h_config, LH_HASH_BYTES) ||
                    (s->has_tok && !memcmp(h, s->h_tok, LH_HASH_BYTES)) ||
                    (s->has_gen && !memcmp(h, s->h_gen, LH_HASH_BYTES));
  if (!model_file && lh_ledger_blob_find(s->ledger, h, &b, NULL)) {
    lh_http_respond_error(res, 404, "unknown_blob", "no published version has blob %s", arg);
    return;
  }
  char *path = lh_sync_blob_path(s->blob_dir, h);
  if (lh_http_respond_file(res, path, arg, CACHE_IMMUTABLE)) {
    lh_http_respond_error(res, 404, "unknown_blob", "blob %s is not in the store", arg);
  } else if (strcmp(req->method, "HEAD")) {
    uint64_t start = 0, len = 0;
    lh_http_range r =
        lh_http_parse_range(lh_http_request_header(req, "Range"), res->file_size, &start, &len);
    pthread_mutex_lock(&s->mu);
    s->bytes_shipped += r == LH_HTTP_RANGE_UNSATISFIABLE ? 0 : len;
    s->bytes_snapshots += model_file ? 0 : len;
    pthread_mutex_unlock(&s->mu);
  }
  free(path);
}

static json_t *status_json(server *s) {
  lh_ledger_stats_result st;
  if (lh_ledger_stats(s->ledger, &st)) return NULL;
  pthread_mutex_lock(&s->mu);
  double el = lh_time_now() - s->t_start;
  json_t *reasons = json_array();
  for (int i = 0; i < st.n_reasons; i++)
    json_array_append_new(reasons, json_pack("{s:s,s:I}", "reason", st.rejected[i].reason, "count",
                                             (json_int_t)st.rejected[i].count));
  json_t *hist = json_array();
  for (int i = 0; i <= 64; i++)
    json_array_append_new(hist, json_integer(s->stale_hist[i]));
  json_t *o = json_pack(
      "{s:I,s:I,s:I,s:f,s:{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:o},s:I,s:{s:I,s:I},s:f,s:f,s:o,s:f}",
      "version", (json_int_t)s->version, "steps", (json_int_t)s->rl.steps, "versions_published",
      (json_int_t)s->versions_published, "elapsed_s", el, "groups", "queued", s->q_len, "leased",
      (json_int_t)st.groups[LH_GROUP_LEASED], "accepted", (json_int_t)st.groups[LH_GROUP_ACCEPTED],
      "rejected", (json_int_t)st.groups[LH_GROUP_REJECTED], "trained",
      (json_int_t)st.groups[LH_GROUP_TRAINED], "dropped", (json_int_t)st.groups[LH_GROUP_DROPPED],
      "expired", (json_int_t)st.groups[LH_GROUP_EXPIRED], "rejected_by_reason", reasons, "workers",
      (json_int_t)st.workers, "bytes", "shipped", (json_int_t)s->bytes_shipped, "blobs",
      (json_int_t)st.blob_bytes, "groups_per_s", el > 0 ? (double)s->trained / el : 0.0, "busy",
      el > 0 ? s->busy_s / el : 0.0, "staleness_histogram", hist, "staleness_last",
      s->last_staleness);
  if (o) {
    json_object_set_new(o, "max_staleness", json_integer(s->stale_k));
    json_object_set_new(
        o, "lease_window",
        json_integer(lh_serve_lease_window(s->rl.prompts, s->lease_s, s->update_s)));
    json_object_set_new(o, "lease_s", json_real(s->lease_s));
    json_object_set_new(o, "update_s", json_real(s->update_s));
  }
  pthread_mutex_unlock(&s->mu);
  return o;
}

static void h_metrics(server *s, lh_http_response *res) {
  lh_ledger_stats_result st;
  if (lh_ledger_stats(s->ledger, &st)) {
    lh_http_respond_error(res, 500, "ledger", "%s", lh_last_error());
    return;
  }
  static const char *const states[] = {"leased",  "accepted", "rejected",
                                       "trained", "dropped",  "expired"};
  static const lh_group_state ids[] = {LH_GROUP_LEASED,  LH_GROUP_ACCEPTED, LH_GROUP_REJECTED,
                                       LH_GROUP_TRAINED, LH_GROUP_DROPPED,  LH_GROUP_EXPIRED};
  int64_t commits = 0, accepts = 0;
  lh_ledger_accept_stats(s->ledger, &commits, &accepts);
  int64_t verdicts[LH_REPLAY__COUNT], forgot_live = 0;
  lh_trust_replay_stats(s->replay, verdicts, &forgot_live);
  pthread_mutex_lock(&s->mu);
  verdicts[LH_REPLAY_STALE] += s->before_start;
  pthread_mutex_unlock(&s->mu);
  /* the text has a fixed number of lines (3.1 kB): a PUT past the end writes nothing, and
   * the answer is then a 500, not a cut page */
  char *buf = lh_xmalloc(16384);
  size_t at = 0, cap = 16384;
#define PUT(...)                                                                                   \
  at += (size_t)snprintf(buf + (at < cap ? at : cap), at < cap ? cap - at : 0, __VA_ARGS__)
/* a metric's HELP and TYPE lines; ONE: with its one sample, unlabelled */
#define HEAD(name, type, help) PUT("# HELP " name " " help "\n# TYPE " name " " type "\n")
#define ONE(name, type, help, fmt, value)                                                          \
  PUT("# HELP " name " " help "\n# TYPE " name " " type "\n" name " " fmt "\n", value)
  HEAD("longhaul_signed_requests_total", "counter",
       "Signed requests with a valid signature, by what the time and nonce check said.");
  static const char *const nonce_says[LH_REPLAY__COUNT] = {[LH_REPLAY_FRESH] = "fresh",
                                                           [LH_REPLAY_SEEN] = "replayed",
                                                           [LH_REPLAY_STALE] = "stale_time",
                                                           [LH_REPLAY_FORGOTTEN] = "forgotten"};
  for (int i = 0; i < LH_REPLAY__COUNT; i++)
    PUT("longhaul_signed_requests_total{nonce=\"%s\"} %lld\n", nonce_says[i],
        (long long)verdicts[i]);
  ONE("longhaul_replay_forgotten_live_total", "counter",
      "Remembered requests forgotten to make room while their time was within the window.", "%lld",
      (long long)forgot_live);
  ONE("longhaul_ledger_accept_commits_total", "counter", "Group commits of accepted submissions.",
      "%lld", (long long)commits);
  ONE("longhaul_ledger_accepts_total", "counter", "Accepted submissions those commits held.",
      "%lld", (long long)accepts);
  pthread_mutex_lock(&s->mu);
  ONE("longhaul_policy_version", "gauge", "The newest published policy version.", "%lld",
      (long long)s->version);
  HEAD("longhaul_groups", "gauge", "Prompt groups in the ledger, by state.");
  for (int i = 0; i < 6; i++)
    PUT("longhaul_groups{state=\"%s\"} %lld\n", states[i], (long long)st.groups[ids[i]]);
  ONE("longhaul_queue_groups", "gauge", "Groups waiting for the trainer.", "%d", s->q_len);
  ONE("longhaul_workers", "gauge", "Registered workers.", "%lld", (long long)st.workers);
  ONE("longhaul_blob_bytes_shipped_total", "counter", "Blob bytes served.", "%llu",
      (unsigned long long)s->bytes_shipped);
  ONE("longhaul_repeats_total", "counter", "Rollout submissions answered as before.", "%lld",
      (long long)s->repeats);
  ONE("longhaul_groups_refuted_total", "counter", "Stored groups that verification rejected.",
      "%lld", (long long)s->refuted);
  ONE("longhaul_groups_verified_total", "counter", "Groups checked token by token.", "%lld",
      (long long)s->verified);
  ONE("longhaul_verified_tokens_total", "counter", "Completion tokens checked.", "%lld",
      (long long)s->verified_tokens);
  ONE("longhaul_verify_seconds_total", "counter", "Time spent checking tokens (not the forward).",
      "%.6f", s->verify_s);
  ONE("longhaul_recompute_seconds_total", "counter", "Time in the forwards that recompute logits.",
      "%.6f", s->forward_s);
  HEAD("longhaul_requests_refused_total", "counter", "Signed requests refused by admission.");
  static const char *const why[4] = {"banned", "not_allowed", "rate_limited", "abandoning"};
  /* (s->refused's order) */
  for (int i = 0; i < 4; i++)
    PUT("longhaul_requests_refused_total{why=\"%s\"} %lld\n", why[i], (long long)s->refused[i]);
  ONE("longhaul_trainer_busy_seconds_total", "counter",
      "Time the training thread spent on updates (verification, the update, publishing).", "%.3f",
      s->busy_s);
#undef ONE
#undef HEAD
  pthread_mutex_unlock(&s->mu);
#undef PUT
  if (at >= cap)
    lh_http_respond_error(res, 500, "metrics",
                          "the metrics text needs %zu bytes, %zu were set aside", at + 1, cap);
  else
    lh_http_respond_bytes(res, 200, "text/plain; version=0.0.4; charset=utf-8", buf, at);
  free(buf);
}

static void handler(void *ud, const lh_http_request *req, lh_http_response *res) {
  server *s = ud;
  const char *p = req->path;
  bool get = !strcmp(req->method, "GET") || !strcmp(req->method, "HEAD");
  bool post = !strcmp(req->method, "POST");
  if (post && !strcmp(p, "/v1/workers")) {
    h_register(s, req, res);
  } else if (post && !strcmp(p, "/v1/leases")) {
    h_lease(s, req, res);
  } else if (post && !strcmp(p, "/v1/rollouts")) {
    h_rollout(s, req, res);
  } else if (get && !strcmp(p, "/v1/policy")) {
    h_policy(s, req, res);
  } else if (get && !strncmp(p, "/v1/manifests/", 14)) {
    h_manifest(s, p + 14, res);
  } else if (get && !strncmp(p, "/v1/blobs/", 10)) {
    h_blob(s, req, p + 10, res);
  } else if (get && !strcmp(p, "/v1/status")) {
    json_t *o = status_json(s);
    if (o)
      lh_http_respond_json(res, 200, o);
    else
      lh_http_respond_error(res, 500, "ledger", "%s", lh_last_error());
    json_decref(o);
  } else if (get && !strcmp(p, "/metrics")) {
    h_metrics(s, res);
  } else if (!strcmp(p, "/v1/workers") || !strcmp(p, "/v1/leases") || !strcmp(p, "/v1/rollouts") ||
             !strcmp(p, "/v1/policy") || !strcmp(p, "/v1/status") || !strcmp(p, "/metrics") ||
             !strncmp(p, "/v1/manifests/", 14) || !strncmp(p, "/v1/blobs/", 10)) {
    lh_http_respond_error(res, 405, "method_not_allowed", "%s is not allowed on %s", req->method,
                          p);
  } else {
    lh_http_respond_error(res, 404, "not_found", "no endpoint %s (see docs/PROTOCOL.md)", p);
  }
}

static size_t max_body(void *ud, const char *method, const char *path) {
  (void)ud;
  if (strcmp(method, "POST")) return 0;
  return !strcmp(path, "/v1/rollouts") ? ROLLOUT_BODY_MAX : SMALL_BODY_MAX;
}

static void on_stop(void *ud) {
  server *s = ud;
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_broadcast(&s->published_cv);
  pthread_cond_broadcast(&s->queue_cv);
  pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- the training thread */

/* A number, or null when it is not finite (JSON has no NaN). */
static void put_num(json_t *o, const char *key, double v) {
  json_object_set_new(o, key, isfinite(v) ? json_real(v) : json_null());
}

/* The order groups are trained in: oldest version first (the closest to the staleness bound,
 * so none waits until it is dropped while newer ones go ahead), then in order of arrival. */
static int by_age(const void *a, const void *b) {
  const queued *x = a, *y = b;
  if (x->version != y->version) return x->version < y->version ? -1 : 1;
  return x->arrived < y->arrived ? -1 : x->arrived > y->arrived;
}

static bool should_stop(server *s) {
  const lh_serve_config *c = s->c;
  if (c->rl.stop && *c->rl.stop) return true;
  if (c->max_wall_s > 0 && lh_time_now() - s->t_start >= c->max_wall_s) return true;
  return false;
}

/* Leases that expired: their tasks are leased again. */
static lh_err expire_leases(server *s) {
  int64_t *ids = NULL;
  int n = 0;
  lh_err e = lh_ledger_expire(s->ledger, now_ms(), &ids, &n);
  for (int i = 0; !e && i < n; i++) {
    lh_ledger_group g;
    if ((e = lh_ledger_group_get(s->ledger, ids[i], &g))) break;
    pthread_mutex_lock(&s->mu);
    reissue_push(s, g.task_index);
    if (s->outstanding > 0) s->outstanding--;
    pthread_mutex_unlock(&s->mu);
    lh_ledger_group_clear(&g);
  }
  free(ids);
  return e;
}

#define VERIFY_LOGITS_MAX ((size_t)64 << 20) /* logits one verification forward holds at most */

/* Verifies the queued groups take[idx[0..m)], all of one version (trust.h), on one forward that
 * recomputes their logits under that version's kept weights, the forward that also gives their
 * behaviour log-probs (kept for the loss when it wants them). A group that fails is marked in
 * bad[], recorded in the ledger as rejected with the reason, the failing member and position,
 * and its task is leased again. Training thread only. */
static lh_err verify_parts(server *s, queued *take, const int *idx, int m, bool *bad) {
  int64_t version = take[idx[0]].version;
  pthread_mutex_lock(&s->mu);
  const uint16_t *slab = kept_slab(s, version);
  pthread_mutex_unlock(&s->mu);
  if (!slab)
    return lh_errorf(LH_ERR_NOTFOUND, "serve: the weights of version %lld are not kept",
                     (long long)version);
  const lh_rollout_batch **parts = lh_xmalloc((size_t)m * sizeof *parts);
  for (int k = 0; k < m; k++)
    parts[k] = &take[idx[k]].b;
  lh_rollout_batch all;
  double t0 = lh_time_now();
  lh_err e = lh_rollout_concat(parts, m, &all);
  if (!e) e = lh_trainer_recompute(s->tr, slab, s->n_params, &all);
  double t1 = lh_time_now();
  const float *logits = e ? NULL : lh_trainer_recompute_logits(s->tr);
  size_t off = 0; /* the rows of the group being checked start here */
  bool old = lh_loss_wants_old(s->rl.loss.kind);
  for (int k = 0; !e && k < m; k++) {
    queued *q = &take[idx[k]];
    int n = q->b.seq_start[q->b.group_size];
    lh_trust_verdict v;
    if ((e = lh_trust_verify_group(&q->b, 0, logits + off * (size_t)s->vocab, s->vocab, &s->trust,
                                   s->scratch, &v)))
      break;
    if (old) {
      free(q->b.old);
      q->b.old = lh_xmalloc((size_t)n * sizeof *q->b.old);
      memcpy(q->b.old, all.old + off, (size_t)n * sizeof *q->b.old);
    }
    off += (size_t)n;
    q->verified = true;
    if (v.failed != LH_TRUST_OK) {
      bad[idx[k]] = true;
      char why[LH_TRUST_REASON_MAX + 48];
      snprintf(why, sizeof why, "%s (after %lld of %lld tokens)", v.reason,
               (long long)v.tokens_checked, (long long)v.tokens);
      lh_log(LH_LOG_WARN, "serve: group %lld (version %lld) refused: %s", (long long)q->group,
             (long long)q->version, why);
      e = lh_ledger_group_refute(s->ledger, q->group, why, now_ms());
    }
    pthread_mutex_lock(&s->mu);
    s->verified++;
    s->verified_tokens += v.tokens_checked;
    s->step_tokens += v.tokens_checked;
    s->step_borderline += v.borderline;
    s->step_border_expected += v.borderline_expected;
    if (v.max_logprob_err > s->step_lp_err) s->step_lp_err = v.max_logprob_err;
    if (v.borderline_member_max > s->step_border_member)
      s->step_border_member = v.borderline_member_max;
    if (bad[idx[k]]) {
      s->refuted++;
      s->rejected++;
      reissue_push(s, q->b.task_index[0]);
    }
    pthread_mutex_unlock(&s->mu);
  }
  double t2 = lh_time_now();
  pthread_mutex_lock(&s->mu);
  s->forward_s += t1 - t0;
  s->verify_s += t2 - t1;
  s->step_forward_s += t1 - t0;
  s->step_verify_s += t2 - t1;
  pthread_mutex_unlock(&s->mu);
  lh_rollout_batch_free(&all);
  free(parts);
  return e;
}

/* Verifies the groups of take[0..n) not checked yet, those of one version together (up to
 * VERIFY_LOGITS_MAX logits per forward), then keeps in take[0..*n_ok) the groups that passed and
 * frees the others. On an error nothing is moved or freed (the caller frees take[0..n)). */
static lh_err verify_take(server *s, queued *take, int n, int *n_ok) {
  bool *bad = lh_xcalloc((size_t)n, sizeof *bad);
  int *idx = lh_xmalloc((size_t)n * sizeof *idx);
  lh_err e = LH_ERR_OK;
  for (int i = 0; !e && i < n; i++) {
    if (take[i].verified) continue;
    int m = 0;
    size_t rows = 0;
    for (int k = i; k < n; k++) {
      size_t r = (size_t)take[k].b.seq_start[take[k].b.group_size];
      if (take[k].verified || take[k].version != take[i].version ||
          (m > 0 && (rows + r) * (size_t)s->vocab > VERIFY_LOGITS_MAX))
        continue;
      idx[m++] = k;
      rows += r;
    }
    e = verify_parts(s, take, idx, m, bad);
  }
  if (!e) {
    int k = 0;
    for (int i = 0; i < n; i++) {
      if (bad[i])
        lh_rollout_batch_free(&take[i].b);
      else
        take[k++] = take[i];
    }
    *n_ok = k;
  }
  free(bad);
  free(idx);
  return e;
}

/* One update: waits a moment for enough groups, trains, publishes (or records only drops). */
/* --eval-every: the held-out pass@1 of the policy that made version v, as a metrics line. On
 * the training thread, which owns the policy: an update waits for it, nothing else does. */
static lh_err heldout_at(server *s, int64_t v) {
  if (s->rl.eval_every <= 0 || v % s->rl.eval_every != 0) return LH_ERR_OK;
  lh_err e = lh_eval_heldout_run(s->eval_env, lh_trainer_policy(s->tr), s->tok, s->rl.eval_n,
                                 s->rl.max_new, &s->heldout);
  if (e) {
    char *why = lh_xstrdup(lh_last_error()); /* lh_errorf formats into what this returns */
    e = lh_errorf(e, "serve: held-out evaluation of version %lld: %s", (long long)v, why);
    free(why);
    return e;
  }
  s->heldout_step = v;
  json_t *line = lh_rl_eval_line(v, &s->heldout);
  e = line ? lh_rundir_metrics_append(s->rd, line)
           : lh_errorf(LH_ERR_NOMEM, "version %lld: cannot encode its eval line", (long long)v);
  json_decref(line);
  return e;
}

static lh_err train_once(server *s) {
  int P = s->rl.prompts, K = s->stale_k;
  queued *take = lh_xcalloc((size_t)P, sizeof *take);
  int64_t *dropped = NULL;
  int n_dropped = 0;
  pthread_mutex_lock(&s->mu);
  int64_t v = s->version;
  /* drop what is beyond the bound, whatever else happens */
  for (int i = 0; i < s->q_len;) {
    if (v - s->q[i].version > K) {
      dropped = lh_xrealloc(dropped, (size_t)(n_dropped + 1) * sizeof *dropped);
      dropped[n_dropped++] = s->q[i].group;
      lh_rollout_batch_free(&s->q[i].b);
      s->q[i] = s->q[--s->q_len];
    } else {
      i++;
    }
  }
  if (s->q_len < P && n_dropped == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->queue_cv, &s->mu, &ts);
    pthread_mutex_unlock(&s->mu);
    free(take);
    return LH_ERR_OK;
  }
  int n_take = 0;
  if (s->q_len >= P) {
    qsort(s->q, (size_t)s->q_len, sizeof *s->q, by_age);
    memcpy(take, s->q, (size_t)P * sizeof *take);
    memmove(s->q, s->q + P, (size_t)(s->q_len - P) * sizeof *s->q);
    s->q_len -= P;
    n_take = P;
  }
  pthread_mutex_unlock(&s->mu);
  lh_err e = LH_ERR_OK;
  double t_take = lh_time_now();
  /* verification: groups not checked yet are checked now; refused ones leave, and when fewer
   * than P remain the rest go back to the queue (checked) to wait for more */
  if (n_take > 0 && !s->c->no_verify) {
    int n_ok = 0;
    if ((e = verify_take(s, take, n_take, &n_ok))) {
      for (int i = 0; i < n_take; i++)
        lh_rollout_batch_free(&take[i].b);
      free(dropped);
      free(take);
      return e;
    }
    n_take = n_ok;
    if (n_take < P) {
      pthread_mutex_lock(&s->mu);
      for (int i = 0; i < n_take; i++)
        queue_push(s, &take[i]);
      pthread_mutex_unlock(&s->mu);
      n_take = 0;
    }
  }
  if (n_take == 0) { /* only drops (or nothing): record them now */
    if (n_dropped > 0) e = lh_ledger_train(s->ledger, v, NULL, 0, dropped, n_dropped);
    if (!e) {
      pthread_mutex_lock(&s->mu);
      s->dropped += n_dropped;
      pthread_mutex_unlock(&s->mu);
    }
    free(dropped);
    free(take);
    return e;
  }
  double t0 = lh_time_now();
  /* behaviour log-probs under each group's own version, for the losses that use them */
  const lh_rollout_batch **parts = lh_xmalloc((size_t)n_take * sizeof *parts);
  int64_t *trained = lh_xmalloc((size_t)n_take * sizeof *trained);
  double stale = 0;
  for (int i = 0; !e && i < n_take; i++) {
    pthread_mutex_lock(&s->mu);
    const uint16_t *slab = kept_slab(s, take[i].version);
    pthread_mutex_unlock(&s->mu);
    if (!slab)
      e = lh_errorf(LH_ERR_NOTFOUND, "serve: the weights of version %lld are not kept",
                    (long long)take[i].version);
    else if (!take[i].verified && lh_loss_wants_old(s->rl.loss.kind))
      e = lh_trainer_recompute(s->tr, slab, s->n_params, &take[i].b);
    parts[i] = &take[i].b;
    trained[i] = take[i].group;
    stale += (double)(v - take[i].version);
  }
  lh_rollout_batch all;
  memset(&all, 0, sizeof all);
  lh_trainer_step_stats st;
  if (!e) e = lh_rollout_concat(parts, n_take, &all);
  lh_rollout_summary sum = {0};
  if (!e) {
    sum = lh_rollout_summarise(&all);
    e = lh_trainer_submit(s->tr, &all);
  }
  if (!e) e = lh_trainer_step(s->tr, &st);
  uint16_t *prev = NULL;
  if (!e) {
    pthread_mutex_lock(&s->mu);
    const uint16_t *p = kept_slab(s, v);
    if (p) {
      prev = lh_xmalloc(s->n_params * sizeof *prev);
      memcpy(prev, p, s->n_params * sizeof *prev);
    }
    pthread_mutex_unlock(&s->mu);
  }
  int64_t nv = lh_trainer_version(s->tr);
  lh_sync_blob_ref blobs[2];
  int n_blobs = 0;
  size_t np = 0;
  const uint16_t *slab = e ? NULL : lh_infer_bf16(lh_trainer_policy(s->tr), &np);
  if (!e) e = make_blobs(s, nv, prev, slab, blobs, &n_blobs);
  if (!e) e = publish(s, nv, slab, blobs, n_blobs, trained, n_take, dropped, n_dropped);
  double dt = lh_time_now() - t0;
  if (!e) {
    pthread_mutex_lock(&s->mu);
    s->trained += n_take;
    s->dropped += n_dropped;
    double busy = lh_time_now() - t_take; /* with the verification before t0 */
    s->busy_s += busy;
    ewma(&s->update_s, busy, 0.2);
    s->last_staleness = stale / n_take;
    for (int i = 0; i < n_take; i++) {
      int64_t k = v - take[i].version;
      s->stale_hist[k > 64 ? 64 : k]++;
    }
    pthread_mutex_unlock(&s->mu);
    json_t *line = json_object();
    json_object_set_new(line, "step", json_integer(nv));
    json_object_set_new(line, "elapsed_s", json_real(lh_time_now() - s->t_start));
    put_num(line, "reward", sum.reward_mean);
    put_num(line, "accuracy", sum.accuracy);
    put_num(line, "loss", st.update.loss.loss);
    put_num(line, "staleness", stale / n_take);
    json_object_set_new(line, "groups", json_integer(n_take));
    json_object_set_new(line, "groups_skipped", json_integer(st.groups_skipped));
    json_object_set_new(line, "dropped", json_integer(n_dropped));
    put_num(line, "train_s", dt);
    pthread_mutex_lock(&s->mu);
    json_object_set_new(line, "lease_window",
                        json_integer(lh_serve_lease_window(P, s->lease_s, s->update_s)));
    put_num(line, "lease_s", s->lease_s);
    put_num(line, "recompute_s", s->step_forward_s);
    put_num(line, "verify_s", s->step_verify_s);
    json_object_set_new(line, "refuted", json_integer(s->refuted));
    json_object_set_new(line, "verified_tokens", json_integer(s->step_tokens));
    json_object_set_new(line, "borderline", json_integer(s->step_borderline));
    json_object_set_new(line, "borderline_member_max", json_integer(s->step_border_member));
    put_num(line, "borderline_expected", s->step_border_expected);
    put_num(line, "logprob_err_max", s->step_lp_err);
    s->step_forward_s = s->step_verify_s = s->step_lp_err = s->step_border_expected = 0;
    s->step_tokens = s->step_borderline = 0;
    s->step_border_member = 0;
    pthread_mutex_unlock(&s->mu);
    if (line) e = lh_rundir_metrics_append(s->rd, line);
    json_decref(line);
    if (!e) e = heldout_at(s, nv);
    if (!e && s->c->progress) {
      lh_serve_progress pr = {0};
      pthread_mutex_lock(&s->mu);
      pr.version = nv;
      pr.steps = s->rl.steps;
      pr.elapsed_s = lh_time_now() - s->t_start;
      pr.reward = sum.reward_mean;
      pr.accuracy = sum.accuracy;
      pr.groups_accepted = s->accepted;
      pr.groups_rejected = s->rejected;
      pr.groups_trained = s->trained;
      pr.groups_dropped = s->dropped;
      pr.groups_per_s = pr.elapsed_s > 0 ? (double)s->trained / pr.elapsed_s : 0;
      pr.staleness_mean = stale / n_take;
      pr.bytes_shipped = s->bytes_shipped;
      pr.busy = pr.elapsed_s > 0 ? s->busy_s / pr.elapsed_s : 0;
      pr.heldout_step = s->heldout_step;
      pr.heldout = s->heldout.pass1.mean;
      pthread_mutex_unlock(&s->mu);
      s->c->progress(&pr, s->c->progress_ud);
    }
  }
  for (int i = 0; i < n_take; i++)
    lh_rollout_batch_free(&take[i].b);
  lh_rollout_batch_free(&all);
  free(prev);
  free(parts);
  free(trained);
  free(dropped);
  free(take);
  return e;
}

/* ---------------------------------------------------------------- setup */

lh_serve_config lh_serve_defaults(void) {
  lh_serve_config c;
  memset(&c, 0, sizeof c);
  c.rl = lh_rl_run_defaults();
  c.rl.staleness = 16;
  c.rl.keep = 3;
  c.kept_max_mb = 4096;
  c.listen = "127.0.0.1:0";
  c.keyframe_every = 20;
  c.lease_ms = 120000;
  c.trust = lh_trust_defaults();
  c.ban_after = 8;
  c.ban_window = 256;
  c.abandon_after = 24;
  c.abandon_window = 64;
  return c;
}

/* Puts a model file into the blob store (it is served by its hash). */
static lh_err put_file(server *s, const char *data, size_t len, uint8_t h[LH_HASH_BYTES],
                       bool *has) {
  *has = data != NULL;
  if (!data) return LH_ERR_OK;
  return lh_sync_blob_put(s->blob_dir, data, len, h);
}

static lh_err parse_listen(const char *listen, char *host, size_t cap, int *port) {
  const char *colon = strrchr(listen, ':');
  char *end = NULL;
  long p = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || colon == listen || (size_t)(colon - listen) >= cap || !end || *end || p < 0 ||
      p > 65535)
    return lh_errorf(LH_ERR_USAGE, "--listen %s: expected HOST:PORT (port 0: a free one)", listen);
  memcpy(host, listen, (size_t)(colon - listen));
  host[colon - listen] = '\0';
  *port = (int)p;
  return LH_ERR_OK;
}

lh_err lh_serve_run(const lh_serve_config *c) {
#ifdef M_ARENA_MAX
  /* One HTTP thread per connection, all allocating and freeing small blocks for as long as the
   * run lasts: glibc's arena per thread (up to 8 per core) fragments, and serve's RSS grew by
   * about 160 bytes per accepted group over 120 s under load; with two arenas it grew a third
   * as much at the same CPU per group (docs/PERFORMANCE.md, "Over a long run"). */
  mallopt(M_ARENA_MAX, 2);
#endif
  server *s = lh_xcalloc(1, sizeof *s);
  s->c = c;
  s->rl = c->rl;
  s->start_ms = now_ms();
  s->t_start = lh_time_now();
  s->version = -1;
  s->heldout_step = -1;
  s->last_keyframe = s->served_keyframe = LH_SYNC_NONE;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->env_mu, NULL);
  pthread_cond_init(&s->published_cv, NULL);
  pthread_cond_init(&s->queue_cv, NULL);
  s->replay = lh_trust_replay_create(LH_NODE_TIME_WINDOW_MS, REPLAY_SLOTS);
  s->repute = lh_xcalloc(REPUTE_SLOTS, sizeof *s->repute);
  lh_env_config ecfg;
  lh_model *m = NULL;
  json_t *was = NULL;
  char *src = NULL, *ledger_path = NULL, *tokpath = NULL;
  int64_t step0 = 0;
  char host[256];
  int port = 0;
  lh_err e;
  if (c->rl.group < 2 || c->rl.prompts < 1 || c->rl.max_new < 1 || c->rl.staleness < 0 ||
      c->rl.staleness > 64 || c->lease_ms < 1000 || c->keyframe_every < 0 || c->ban_after < 0 ||
      c->ban_window < 1 || c->abandon_after < 0 || c->abandon_window < 1 || !(c->kept_max_mb > 0)) {
    e = lh_errorf(LH_ERR_USAGE, "group >= 2, prompts, max_new >= 1, staleness 0 .. 64, lease "
                                "of at least 1000 ms, keyframe_every >= 0, ban_after and "
                                "abandon_after >= 0, ban_window and abandon_window >= 1, "
                                "kept_max_mb > 0 required");
    goto out;
  }
  if ((e = parse_listen(c->listen, host, sizeof host, &port))) goto out;
  if ((e = lh_sync_secret_key_load(c->key_path, &s->sk))) goto out;
  lh_sync_key_public(&s->sk, &s->pk);
  /* the run directory: a new run, or the one there resumed with its own settings */
  {
    char *runjson = lh_path_join(c->rl.out_dir, "run.json");
    struct stat st;
    bool resume = stat(runjson, &st) == 0;
    free(runjson);
    if ((e = lh_rundir_open(c->rl.out_dir, resume ? LH_RUNDIR_RESUME : LH_RUNDIR_CREATE, &s->rd)))
      goto out;
    if (resume) {
      if ((e = lh_rundir_read_settings(s->rd, &was)) ||
          (e = lh_rl_settings_read(was, c->rl.out_dir, &s->rl)))
        goto out;
      s->rl.steps = c->rl.steps; /* may grow on resume */
      e = lh_rundir_latest(c->rl.out_dir, &step0, &src);
      if (e == LH_ERR_NOTFOUND) { /* stopped before its first checkpoint: start it again */
        step0 = -1;
        src = lh_xstrdup(s->rl.model_dir);
        e = LH_ERR_OK;
      }
      if (e) goto out;
    } else {
      if (!c->rl.model_dir || !c->rl.env_spec) {
        e = lh_errorf(LH_ERR_USAGE, "a new run needs --model and --env");
        goto out;
      }
      json_t *now = lh_rl_settings_json(&s->rl);
      e = now ? lh_rundir_write_settings(s->rd, now, c->rl.argc, c->rl.argv)
              : lh_errorf(LH_ERR_NOMEM, "cannot encode the run settings");
      json_decref(now);
      if (e) goto out;
      src = lh_xstrdup(c->rl.model_dir);
    }
  }
  if ((e = lh_env_config_parse(s->rl.env_spec, &ecfg)) || (e = lh_env_create(&ecfg, &s->env)))
    goto out;
  if (s->rl.eval_every > 0 && (e = lh_env_create(&ecfg, &s->eval_env))) goto out;
  tokpath = lh_path_join(src, "tokenizer.json");
  if ((e = lh_model_load(src, &m)) || (e = lh_tokenizer_load(tokpath, &s->tok)) ||
      (e = lh_model_files_read(src, &s->files)))
    goto out;
  if ((long)s->rl.max_prompt + s->rl.max_new > m->cfg.max_positions) {
    e = lh_errorf(LH_ERR_LIMIT, "--max-prompt %d and --max-new %d exceed the context of %d",
                  s->rl.max_prompt, s->rl.max_new, m->cfg.max_positions);
    goto out;
  }
  s->vocab = m->cfg.vocab_size;
  s->n_params = m->n_params;
  /* the staleness bound: as asked, or as many versions as --max-kept-mb holds */
  s->stale_k = lh_serve_staleness_bound(s->rl.staleness, s->n_params, c->kept_max_mb);
  {
    double per = version_mb(s->n_params);
    if (s->stale_k < 0) {
      e = lh_errorf(LH_ERR_LIMIT,
                    "serve: --max-kept-mb %g holds not even the newest version's weights "
                    "(%.1f MB in bf16); raise it to at least %.0f (%.0f for --max-staleness %d)",
                    c->kept_max_mb, per, ceil(per), ceil(per * (s->rl.staleness + 1)),
                    s->rl.staleness);
      goto out;
    }
    if (s->stale_k < s->rl.staleness)
      lh_log(LH_LOG_WARN,
             "serve: the staleness bound is %d versions, not --max-staleness %d: the bf16 weights "
             "of %d versions (%.1f MB each) fit in --max-kept-mb %g (%.0f would hold %d)",
             s->stale_k, s->rl.staleness, s->stale_k + 1, per, c->kept_max_mb,
             ceil(per * (s->rl.staleness + 1)), s->rl.staleness + 1);
  }
  /* verification: the tolerances given, the model's stop ids (what a worker's generator uses) */
  s->trust = c->trust;
  s->trust.n_stop = 0;
  if (m->cfg.n_eos > 0) {
    for (int i = 0; i < m->cfg.n_eos && i < 8; i++)
      s->trust.stop_ids[s->trust.n_stop++] = m->cfg.eos_ids[i];
  } else if (m->cfg.eos_token_id >= 0) {
    s->trust.stop_ids[s->trust.n_stop++] = m->cfg.eos_token_id;
  }
  if ((e = lh_trust_config_validate(&s->trust))) goto out;
  s->scratch = lh_sample_scratch_create(s->vocab);
  if (c->rate_limit > 0) {
    double burst = 4 * c->rate_limit > 8 ? 4 * c->rate_limit : 8;
    s->limiter = lh_trust_limiter_create(c->rate_limit, burst, 4096);
  }
  if (c->allow_keys) {
    char *text = NULL;
    size_t len = 0;
    if ((e = lh_file_read(c->allow_keys, (size_t)16 << 20, &text, &len))) goto out;
    e = lh_node_allowlist_parse(text, len, c->allow_keys, &s->allow, &s->n_allow);
    free(text);
    if (e) goto out;
    if (s->n_allow == 0) {
      e = lh_errorf(LH_ERR_USAGE, "%s: no keys: the server would refuse every worker",
                    c->allow_keys);
      goto out;
    }
    qsort(s->allow, (size_t)s->n_allow, sizeof *s->allow, cmp_key); /* for admit's bsearch */
  }
  s->n_sections = lh_patch_sections(&m->cfg, NULL, 0);
  s->sections = lh_xmalloc((size_t)s->n_sections * sizeof *s->sections);
  lh_patch_sections(&m->cfg, s->sections, s->n_sections);
  {
    lh_trainer_config tc = lh_trainer_defaults();
    tc.loss = s->rl.loss;
    tc.adv = s->rl.adv;
    tc.opt = s->rl.opt;
    tc.minibatches = s->rl.minibatches;
    tc.max_staleness = s->stale_k;
    tc.max_seq = s->rl.max_prompt + s->rl.max_new;
    tc.ref_dir = s->rl.loss.kl_beta > 0.0f ? s->rl.model_dir : NULL;
    e = lh_trainer_create(m, &tc, &s->tr);
    m = NULL;
    if (e) goto out;
  }
  if (step0 > 0) {
    char *state = lh_path_join(src, "trainer_state.safetensors");
    e = lh_trainer_load(s->tr, state, step0);
    free(state);
    if (e) goto out;
  }
  if ((e = lh_rundir_metrics_open(s->rd, step0 > 0 ? step0 : 0))) goto out;
  s->blob_dir = lh_rundir_file(s->rd, "blobs");
  {
    char *cfgpath = lh_path_join(src, "config.json");
    char *cfg = NULL;
    size_t cfg_len = 0;
    e = lh_file_read(cfgpath, (size_t)16 << 20, &cfg, &cfg_len);
    free(cfgpath);
    bool has = false;
    if (!e) e = put_file(s, cfg, cfg_len, s->h_config, &has);
    free(cfg);
    if (e ||
        (e = put_file(s, s->files.tokenizer_json, s->files.tokenizer_len, s->h_tok, &s->has_tok)) ||
        (e = put_file(s, s->files.generation_config, s->files.generation_len, s->h_gen,
                      &s->has_gen)))
      goto out;
  }
  /* the ledger, back to the checkpoint */
  ledger_path = lh_rundir_file(s->rd, "ledger.sqlite");
  if ((e = lh_ledger_open(ledger_path, &s->ledger))) goto out;
  int64_t back = 0;
  if ((e = lh_ledger_rewind(s->ledger, step0, &back))) goto out;
  if (back > 0)
    lh_log(LH_LOG_INFO,
           "serve: %lld groups trained after the checkpoint of step %lld go back "
           "to the queue",
           (long long)back, (long long)step0);
  s->n_kept = s->stale_k + 1;
  s->kept = lh_xcalloc((size_t)s->n_kept, sizeof *s->kept);
  for (int i = 0; i < s->n_kept; i++)
    s->kept[i].version = -1;
  {
    int64_t latest = -1;
    e = lh_ledger_latest_version(s->ledger, &latest);
    if (e == LH_ERR_NOTFOUND) { /* a new run: version 0 is the starting policy */
      size_t np = 0;
      const uint16_t *slab = lh_infer_bf16(lh_trainer_policy(s->tr), &np);
      lh_sync_blob_ref blobs[2];
      int n_blobs = 0;
      if ((e = make_blobs(s, 0, NULL, slab, blobs, &n_blobs)) ||
          (e = publish(s, 0, slab, blobs, n_blobs, NULL, 0, NULL, 0)))
        goto out;
    } else if (e) {
      goto out;
    } else {
      /* the versions of the staleness window, and the newest's manifest */
      if ((e = keep_from_blobs(s, latest - s->stale_k > 0 ? latest - s->stale_k : 0, latest)))
        goto out;
      size_t np = 0;
      const uint16_t *cur = lh_infer_bf16(lh_trainer_policy(s->tr), &np);
      if (memcmp(cur, kept_slab(s, latest), np * sizeof *cur)) {
        e = lh_errorf(LH_ERR_MISMATCH,
                      "serve: the checkpoint of step %lld does not give the published version "
                      "%lld's weights",
                      (long long)step0, (long long)latest);
        goto out;
      }
      if ((e = lh_ledger_version_get(s->ledger, latest, &s->manifest, &s->manifest_len))) goto out;
      s->version = latest;
      lh_ledger_blob *lb = NULL;
      int nb = 0;
      /* the keyframe state: the newest snapshot at or before latest */
      for (int64_t v = latest; v >= 0 && s->last_keyframe == LH_SYNC_NONE; v--) {
        if ((e = lh_ledger_version_blobs(s->ledger, v, &lb, &nb))) goto out;
        for (int i = 0; i < nb; i++)
          if (lb[i].kind == 0) {
            s->last_keyframe = v;
            s->snapshot_bytes = lb[i].size;
          }
        if (s->last_keyframe == LH_SYNC_NONE)
          for (int i = 0; i < nb; i++)
            s->chain_bytes += lb[i].size;
        free(lb);
        lb = NULL;
      }
    }
  }
  s->served_keyframe = s->last_keyframe;
  /* the queue: every accepted group not yet trained */
  {
    int64_t *ids = NULL;
    int n = 0;
    if ((e = lh_ledger_accepted(s->ledger, &ids, &n))) goto out;
    lh_rollout_limits lim = lh_rollout_default_limits();
    lim.vocab = s->vocab;
    for (int i = 0; !e && i < n; i++) {
      void *body = NULL;
      size_t len = 0;
      queued q = {ids[i], 0, 0, {0}, false};
      if (!(e = lh_ledger_group_body(s->ledger, ids[i], &body, &len)) &&
          !(e = lh_rollout_decode(body, len, &lim, "ledger body", &q.b))) {
        q.version = q.b.version;
        queue_push(s, &q);
      }
      free(body);
    }
    free(ids);
    if (e) goto out;
    lh_ledger_stats_result st;
    if ((e = lh_ledger_stats(s->ledger, &st))) goto out;
    s->outstanding = st.groups[LH_GROUP_LEASED];
    if ((e = lh_ledger_next_task(s->ledger, &s->next_task))) goto out;
  }
  {
    lh_http_server_config hc = {0};
    hc.host = host;
    hc.port = port;
    hc.max_body = max_body;
    hc.max_connections = 1024; /* a worker holds up to 28 (worker.c) */
    hc.max_per_ip = 0;
    hc.timeout_s = 30;
    hc.handler = handler;
    hc.ud = s;
    hc.on_stop = on_stop;
    if ((e = lh_http_server_start(&hc, &s->http))) goto out;
  }
  lh_log(LH_LOG_INFO, "serve: listening on http://%s:%d, version %lld, %d groups queued", host,
         lh_http_server_port(s->http), (long long)s->version, s->q_len);
  if (c->port_file) {
    char text[16];
    int n = snprintf(text, sizeof text, "%d\n", lh_http_server_port(s->http));
    if ((e = lh_file_write_atomic(c->port_file, text, (size_t)n))) goto out;
  }
  /* the starting policy's held-out pass@1 (a resumed run has it unless it restarts at 0) */
  if (lh_trainer_version(s->tr) == 0 && (e = heldout_at(s, 0))) goto out;
  double expired_at = -1; /* leases are expired at most every EXPIRE_EVERY_S */
  while (lh_trainer_version(s->tr) < s->rl.steps && !should_stop(s)) {
    double t = lh_time_now();
    if (t - expired_at >= EXPIRE_EVERY_S || expired_at < 0) {
      if ((e = expire_leases(s))) break;
      expired_at = t;
    }
    if ((e = train_once(s))) break;
  }
  /* a server that stops listening says why: a client sees only a refused connection */
  if (!e && c->max_wall_s > 0 && lh_time_now() - s->t_start >= c->max_wall_s)
    lh_log(LH_LOG_INFO, "serve: --max-wall %g s reached at version %lld: stopping", c->max_wall_s,
           (long long)s->version);
  /* the last version stays available to workers that are still syncing */
  if (!e && c->linger_s > 0 && !should_stop(s)) {
    lh_log(LH_LOG_INFO, "serve: version %lld is the last; serving it for %g s more",
           (long long)s->version, c->linger_s);
    double until = lh_time_now() + c->linger_s;
    while (lh_time_now() < until && !(c->rl.stop && *c->rl.stop)) {
      struct timespec ts = {0, 100 * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
out:
  lh_http_server_stop(s->http);
  lh_ledger_close(s->ledger);
  lh_trainer_free(s->tr);
  lh_model_free(m);
  lh_tokenizer_free(s->tok);
  lh_env_free(s->env);
  lh_env_free(s->eval_env);
  lh_model_files_free(&s->files);
  lh_rundir_close(s->rd, false);
  json_decref(was);
  for (int i = 0; i < s->q_len; i++)
    lh_rollout_batch_free(&s->q[i].b);
  free(s->q);
  for (int i = 0; i < s->n_kept; i++)
    free(s->kept[i].slab);
  free(s->kept);
  free(s->reissue);
  lh_trust_replay_free(s->replay);
  free(s->repute);
  free(s->allow);
  lh_trust_limiter_free(s->limiter);
  lh_sample_scratch_free(s->scratch);
  free(s->sections);
  free(s->manifest);
  free(s->blob_dir);
  free(src);
  free(tokpath);
  free(ledger_path);
  lh_sync_secret_key_wipe(&s->sk);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->env_mu);
  pthread_cond_destroy(&s->published_cv);
  pthread_cond_destroy(&s->queue_cv);
  free(s);
  return e;
}
