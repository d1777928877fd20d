/* `longhaul worker` (node.h): syncs the policy from the server's signed manifests and blobs,
 * leases prompt groups ahead, generates them with the rollout engine and submits them. Threads,
 * each with its own connection so no round trip waits on another: the poll thread (keeps a long
 * poll for new manifests in flight), the fetch-ahead thread (downloads each new version's patch
 * as soon as its manifest is known), the policy thread (plans the fastest route to the newest
 * manifest known, downloads, applies and checks it, and stages the version), the lease thread,
 * SUBMITTERS submitting threads (all with backoff through server restarts and dropped
 * connections), and the calling thread, which generates. A generated group
 * is written to DIR/pending before it is submitted and removed only once the server has given
 * its final answer, so a group is never lost (a restarted worker submits it again) and never
 * trained twice (the server answers a repeat as before). The worker only dials out. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "longhaul/gen.h"
#include "longhaul/http.h"
#include "longhaul/infer.h"
#include "longhaul/node.h"
#include "longhaul/patch.h"
#include "longhaul/rollout.h"
#include "node_impl.h"

#define REPLY_MAX        ((size_t)16 << 20)
#define BLOB_MAX         ((uint64_t)16 << 30)
#define TIMEOUT_MS       60000
#define BACKOFF_MIN_S    0.2
#define BACKOFF_MAX_S    10.0
#define MAX_BATCH_GROUPS 64 /* groups generated together at most */
#define SUBMITTERS       16 /* submissions in flight at once */
#define PREFETCH         8  /* blobs (or pieces of one) of a route downloaded at once */
#define PIECE_MIN        ((uint64_t)256 << 10) /* a larger blob may come in pieces */
#define CHAIN_MAX        64 /* manifests of one chain answer at most (as the server) */
#define AHEAD_MAX        8  /* patches queued for the fetch-ahead thread at most */

typedef struct done_group {
  int64_t lease, group;
  uint8_t *body;
  size_t len;
  double gen_ms;
} done_group;

typedef struct ready_group {
  int64_t lease;
  lh_node_group g;
} ready_group;

typedef struct worker {
  const lh_worker_config *c;
  lh_worker_result *res;
  lh_sync_secret_key sk;
  lh_sync_public_key trust;
  lh_http_client *http;            /* the policy thread's: blobs, and a chain when it must */
  lh_http_client *poll_http;       /* the poll thread's: the long poll for new manifests */
  lh_http_client *fetch[PREFETCH]; /* the policy thread's, for blobs fetched at once (kept open) */
  lh_http_client *lease_http;      /* the lease thread's */
  char *blob_dir, *pending_dir, *policy_dir;
  int64_t clock_offset_ms; /* server - local, learned from stale_time answers */

  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stop;
  lh_err net_error; /* a failure the network thread cannot retry past */
  /* the policy: the network thread stages a new version, the generator swaps it in */
  int64_t version; /* the generator's current version, -1 before the first */
  uint16_t *staged;
  int64_t staged_version;
  size_t n;
  lh_config cfg;
  bool have_cfg;
  /* leased groups waiting to be generated, and generated ones waiting to be sent */
  ready_group *ready;
  int n_ready, ready_cap;
  done_group *done;
  int n_done, done_cap;
  int64_t submitted, in_flight;
  int sending;       /* groups a submitting thread holds */
  int64_t generated; /* groups generated since the start */
  bool lease_wait;   /* the last lease had nothing: wait for a new version before the next */
  /* the manifests the poll thread has seen that are newer than the policy thread's version,
   * consecutive, the newest last (at most CHAIN_MAX) */
  lh_sync_manifest *known;
  int n_known;
  /* the fetch-ahead thread's queue: the patch of each new version from its parent, fetched as
   * soon as its manifest is known, while the policy thread still applies the one before */
  lh_sync_blob_ref ahead[AHEAD_MAX];
  int n_ahead;
  bool ahead_busy; /* ahead_hash is being downloaded (the policy thread waits for it) */
  uint8_t ahead_hash[LH_HASH_BYTES];
  lh_http_client *ahead_http;        /* the fetch-ahead thread's */
  uint8_t (*claimed)[LH_HASH_BYTES]; /* the blobs of the policy thread's sync: never ahead */
  int n_claimed;
  double rtt_s;    /* a request's round trip, measured (leases), smoothed; 0: not yet */
  double rate_bps; /* the download rate of a sync's blobs together, smoothed; 0: not yet */
  uint8_t *replay; /* --adversary replay: the first body, sent again for every group */
  size_t replay_len;
  done_group held; /* --adversary selective: the best of the groups generated since the last */
  double held_entropy;
  int held_n; /* groups generated since the last one kept */
} worker;

static void wait_cv(worker *w, long ms);

static int64_t now_ms(const worker *w) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + w->clock_offset_ms;
}

/* Whether to stop. The caller's stop flag (set by a signal handler on the main thread) is read
 * only by the main thread, which passes it on in w->stop. */
static bool stopping(worker *w) {
  pthread_mutex_lock(&w->mu);
  bool s = w->stop;
  pthread_mutex_unlock(&w->mu);
  return s;
}

/* Sleeps for the backoff of attempt k (exponential with full jitter), waking when stopping. */
static void backoff(worker *w, int k) {
  double cap = BACKOFF_MIN_S * (double)(1u << (k < 6 ? k : 6));
  if (cap > BACKOFF_MAX_S) cap = BACKOFF_MAX_S;
  double d = cap * (0.5 + 0.5 * (double)randombytes_uniform(1000) / 1000.0);
  for (double t = 0; t < d && !stopping(w); t += 0.05) {
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* ---------------------------------------------------------------- signed requests */

/* A signed request; a stale_time answer corrects the clock and retries once. */
static lh_err call(worker *w, lh_http_client *c, const char *method, const char *path,
                   const void *body, size_t len, lh_http_reply *out) {
  for (int attempt = 0;; attempt++) {
    lh_err e =
        lh_node_request(c, &w->sk, method, path, body, len, now_ms(w), REPLY_MAX, TIMEOUT_MS, out);
    if (e) return e;
    if (out->status == 401 && attempt == 0 && out->body) {
      char code[64];
      int64_t t = -1;
      lh_node_error_parse(out->body, out->len, code, sizeof code, &t);
      if (t >= 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t local = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        w->clock_offset_ms = t - local + 1;
        lh_http_reply_free(out);
        continue;
      }
    }
    return LH_ERR_OK;
  }
}

/* The error code of a JSON error answer ("" when none). */
static void error_code(const lh_http_reply *r, char *code, size_t cap) {
  int64_t t;
  lh_node_error_parse(r->body, r->len, code, cap, &t);
}

/* A refusal that signing again resolves: 401 stale_time (call() corrected the clock already, so
 * the time was older than the requests the server still remembers) or 409 replayed_nonce. It
 * is transient (LH_ERR_IO): the next try signs anew, and it never counts toward giving up. */
static bool sign_again(const lh_http_reply *r, const char *code) {
  return (r->status == 401 && !strcmp(code, "stale_time")) || r->status == 409;
}

/* A 403 banned or not_allowed: the server will not serve this key, and waiting changes nothing:
 * the worker stops with *e saying so. */
static void refused_for_good(worker *w, const lh_http_reply *r, const char *code, const char *what,
                             lh_err *e) {
  if (r->status != 403 || (strcmp(code, "banned") && strcmp(code, "not_allowed"))) return;
  *e = lh_errorf(LH_ERR_INVAL, "%s: HTTP 403 %s: %.*s", what, code,
                 (int)(r->len < 300 ? r->len : 300), r->body ? (char *)r->body : "");
  pthread_mutex_lock(&w->mu);
  w->net_error = *e;
  w->stop = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static lh_err register_worker(worker *w) {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  json_t *o =
      json_pack("{s:s,s:{s:s,s:i,s:i}}", "name", w->c->name ? w->c->name : host, "hardware", "host",
                host, "cpus", (int)sysconf(_SC_NPROCESSORS_ONLN), "threads", w->c->threads);
  char *body = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  lh_http_reply r;
  lh_err e = call(w, w->lease_http, "POST", "/v1/workers", body, strlen(body), &r);
  free(body);
  if (e) return e;
  if (r.status != 200 && r.status != 201) {
    char code[64];
    error_code(&r, code, sizeof code);
    e = lh_errorf(r.status >= 500 || sign_again(&r, code) ? LH_ERR_IO : LH_ERR_INVAL,
                  "register: HTTP %ld %s", r.status, code);
    refused_for_good(w, &r, code, "register", &e);
  }
  lh_http_reply_free(&r);
  return e;
}

/* ---------------------------------------------------------------- policy sync */

/* Fetches a blob into the worker's store (resuming a partial download) and reads it back
 * verified. */
/* Bytes of DEST.part so far (0 when none). */
static uint64_t part_size(const char *dest) {
  char part[4096];
  struct stat st;
  snprintf(part, sizeof part, "%s.part", dest);
  return stat(part, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Fetches a blob into the worker's store and reads it back verified. A download cut off (a
 * reset link) is resumed with Range at once, as long as each try brings more bytes; the caller's
 * backoff is for a server that is away. */
/* A blob into the store on connection c, unless it is there: resumed (Range) while each try
 * brings more bytes, counted in bytes_downloaded. */
static lh_err download_blob(worker *w, lh_http_client *c, const uint8_t hash[LH_HASH_BYTES],
                            uint64_t size) {
  if (lh_sync_blob_has(w->blob_dir, hash)) return LH_ERR_OK;
  char hx[2 * LH_HASH_BYTES + 1], path[128];
  lh_hash_hex(hash, hx);
  snprintf(path, sizeof path, "/v1/blobs/%s", hx);
  char *dest = lh_sync_blob_path(w->blob_dir, hash);
  lh_err e;
  for (int tries = 0;; tries++) {
    uint64_t before = part_size(dest);
    e = lh_http_client_download(c, path, dest, size ? size : BLOB_MAX, TIMEOUT_MS, NULL);
    if (e != LH_ERR_IO || tries == 64 || part_size(dest) <= before) break;
  }
  free(dest);
  if (e) return e;
  pthread_mutex_lock(&w->mu);
  w->res->bytes_downloaded += size;
  pthread_mutex_unlock(&w->mu);
  return LH_ERR_OK;
}

static lh_err fetch_blob(worker *w, const uint8_t hash[LH_HASH_BYTES], uint64_t size,
                         uint8_t **data, size_t *len) {
  lh_err e = download_blob(w, w->http, hash, size);
  if (e) return e;
  e = lh_sync_blob_get(w->blob_dir, hash, size ? (size_t)size : (size_t)BLOB_MAX, data, len);
  if (e == LH_ERR_MISMATCH) { /* a corrupted file: fetch it again next time */
    char *p = lh_sync_blob_path(w->blob_dir, hash);
    unlink(p);
    free(p);
  }
  return e;
}

/* One download of a prefetching thread, on one of the kept connections: a whole blob into the
 * store, or (buf) the bytes [off, off + len) of a large one into buf + off, with a Range. */
typedef struct prefetch {
  worker *w;
  lh_http_client **c; /* the connection, made on its first use */
  const lh_sync_blob_ref *b;
  uint8_t *buf;
  uint64_t off, len;
  lh_err e;
} prefetch;

/* The piece [p->off, p->off + p->len) of p->b into p->buf: a 206 of exactly those bytes. */
static lh_err fetch_piece(prefetch *p, const char *path) {
  char range[64];
  snprintf(range, sizeof range, "bytes=%llu-%llu", (unsigned long long)p->off,
           (unsigned long long)(p->off + p->len - 1));
  lh_http_header h = {"Range", range};
  lh_http_reply r;
  lh_err e =
      lh_http_client_request(*p->c, "GET", path, &h, 1, NULL, 0, (size_t)p->len, TIMEOUT_MS, &r);
  if (e) return e;
  const char *cr = lh_http_reply_header(&r, "Content-Range");
  uint64_t start = 0, end = 0, total = 0;
  if (r.status != 206 || !cr || lh_http_parse_content_range(cr, &start, &end, &total) ||
      start != p->off || end != p->off + p->len - 1 || total != p->b->size || r.len != p->len)
    e = lh_errorf(LH_ERR_IO, "GET %s (%s): HTTP %ld, %zu bytes, expected 206 of %llu bytes", path,
                  range, r.status, r.len, (unsigned long long)p->len);
  else
    memcpy(p->buf + p->off, r.body, r.len);
  lh_http_reply_free(&r);
  return e;
}

static void *prefetch_one(void *ud) {
  prefetch *p = ud;
  char hx[2 * LH_HASH_BYTES + 1], path[128];
  lh_hash_hex(p->b->hash, hx);
  snprintf(path, sizeof path, "/v1/blobs/%s", hx);
  p->e = *p->c ? LH_ERR_OK : lh_http_client_create(p->w->c->server, p->c);
  if (!p->e && p->buf) {
    p->e = fetch_piece(p, path);
  } else if (!p->e) {
    char *dest = lh_sync_blob_path(p->w->blob_dir, p->b->hash);
    p->e = lh_http_client_download(*p->c, path, dest, p->b->size, TIMEOUT_MS, NULL);
    free(dest);
  }
  if (!p->e) {
    pthread_mutex_lock(&p->w->mu);
    p->w->res->bytes_downloaded += p->len;
    pthread_mutex_unlock(&p->w->mu);
  }
  return NULL;
}

/* The blobs of a route that are not in the store yet, downloaded PREFETCH at a time on
 * connections kept open between syncs, so that a chain of patches costs one round trip, not one
 * per patch, and no connection is opened anew. A blob larger than PIECE_MIN is fetched in
 * pieces (Range) on several connections at once: a link's window (TCP's, or netem's) bounds
 * each connection's rate, so a lone snapshot would otherwise take several round trips on one.
 * Pieces are put together, hashed and stored only when the whole blob hashes right. Failures
 * are left to the sequential fetch that follows (which retries and reports them). */
static void prefetch_route(worker *w, const lh_sync_manifest *ms, const lh_sync_route *route) {
  prefetch *jobs = NULL;
  uint8_t **bufs = lh_xcalloc((size_t)route->n, sizeof *bufs);
  int n_jobs = 0, cap = 0, n_new = 0;
  for (int i = 0; i < route->n; i++)
    n_new += !lh_sync_blob_has(w->blob_dir,
                               ms[route->steps[i].manifest].blobs[route->steps[i].blob].hash);
  for (int i = 0; i < route->n; i++) {
    const lh_sync_blob_ref *b = &ms[route->steps[i].manifest].blobs[route->steps[i].blob];
    if (lh_sync_blob_has(w->blob_dir, b->hash)) continue;
    /* a large blob goes in pieces over the connections the other blobs leave */
    uint64_t pieces = 1;
    if (b->size > PIECE_MIN && n_new < PREFETCH) {
      pieces = (uint64_t)(PREFETCH - n_new + 1);
      if (pieces > b->size / (PIECE_MIN / 2)) pieces = b->size / (PIECE_MIN / 2);
      bufs[i] = lh_xmalloc((size_t)b->size);
    }
    for (uint64_t k = 0; k < pieces; k++) {
      if (n_jobs == cap)
        jobs = lh_xrealloc(jobs, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *jobs);
      uint64_t off = b->size * k / pieces, end = b->size * (k + 1) / pieces;
      jobs[n_jobs++] = (prefetch){w, NULL, b, bufs[i], off, end - off, LH_ERR_IO}; /* not run */
    }
  }
  pthread_t th[PREFETCH];
  bool ok = true;
  for (int i = 0; ok && i < n_jobs;) {
    int k = 0;
    for (; i < n_jobs && k < PREFETCH; i++, k++) {
      jobs[i].c = &w->fetch[k];
      if (pthread_create(&th[k], NULL, prefetch_one, &jobs[i])) {
        ok = false; /* no thread: the sequential fetch does the rest */
        jobs[i].e = LH_ERR_NOMEM;
        break;
      }
    }
    for (int j = 0; j < k; j++)
      pthread_join(th[j], NULL);
  }
  for (int i = 0, j = 0; i < route->n; i++) { /* the pieces of each large blob, in order */
    if (!bufs[i]) continue;
    const lh_sync_blob_ref *b = &ms[route->steps[i].manifest].blobs[route->steps[i].blob];
    while (j < n_jobs && jobs[j].b != b)
      j++;
    bool whole = true;
    for (; j < n_jobs && jobs[j].b == b; j++)
      whole = whole && !jobs[j].e;
    uint8_t h[LH_HASH_BYTES];
    if (whole) lh_hash256(bufs[i], (size_t)b->size, h);
    if (whole && !memcmp(h, b->hash, LH_HASH_BYTES) &&
        lh_sync_blob_put(w->blob_dir, bufs[i], (size_t)b->size, h))
      lh_log(LH_LOG_DEBUG, "worker: %s", lh_last_error());
    free(bufs[i]);
  }
  free(bufs);
  free(jobs);
}

/* The model files of the first manifest: config.json (and generation_config.json's eos ids) into
 * w->cfg; all three written to the policy directory. */
static lh_err fetch_model_files(worker *w, const lh_sync_manifest *m) {
  uint8_t *cfg = NULL, *tok = NULL, *gen = NULL;
  size_t cfg_len = 0, tok_len = 0, gen_len = 0;
  lh_err e = fetch_blob(w, m->config, 0, &cfg, &cfg_len);
  if (!e && m->has_tokenizer) e = fetch_blob(w, m->tokenizer, 0, &tok, &tok_len);
  if (!e && m->has_generation) e = fetch_blob(w, m->generation, 0, &gen, &gen_len);
  lh_config c;
  if (!e) e = lh_config_parse((const char *)cfg, cfg_len, "config.json blob", &c);
  if (!e && gen)
    e = lh_config_parse_generation((const char *)gen, gen_len, "generation_config.json blob", &c);
  if (!e && lh_config_n_params(&c) != m->elements)
    e = lh_errorf(LH_ERR_MISMATCH, "the config has %zu parameters, the manifest %llu",
                  lh_config_n_params(&c), (unsigned long long)m->elements);
  if (!e) {
    pthread_mutex_lock(&w->mu);
    w->cfg = c;
    w->have_cfg = true;
    pthread_mutex_unlock(&w->mu);
  }
  free(cfg);
  free(tok);
  free(gen);
  return e;
}

/* Takes the route's blobs from the fetch-ahead queue (this thread fetches them now), and waits
 * while the fetch-ahead thread downloads one of them: a blob is downloaded by one thread at a
 * time, so no two write its part file. */
static void claim_route(worker *w, const lh_sync_manifest *ms, const lh_sync_route *route) {
  pthread_mutex_lock(&w->mu);
  w->claimed = lh_xrealloc(w->claimed, (size_t)(route->n + 1) * sizeof *w->claimed);
  w->n_claimed = route->n;
  for (int i = 0; i < route->n; i++) { /* all of them first, then wait */
    const lh_sync_blob_ref *b = &ms[route->steps[i].manifest].blobs[route->steps[i].blob];
    memcpy(w->claimed[i], b->hash, LH_HASH_BYTES);
    for (int k = 0; k < w->n_ahead;) {
      if (!memcmp(w->ahead[k].hash, b->hash, LH_HASH_BYTES)) {
        memmove(w->ahead + k, w->ahead + k + 1, (size_t)(w->n_ahead - k - 1) * sizeof *w->ahead);
        w->n_ahead--;
      } else {
        k++;
      }
    }
  }
  for (int i = 0; i < route->n; i++)
    while (w->ahead_busy && !w->stop && !memcmp(w->ahead_hash, w->claimed[i], LH_HASH_BYTES))
      wait_cv(w, 100);
  pthread_mutex_unlock(&w->mu);
}

/* Queues the patch of each of the new manifests ms[0..n) from its parent for the fetch-ahead
 * thread (the blob the policy thread will need next, in the common case of one new version at
 * a time); when the queue is full the oldest give way. Caller holds mu. */
static void ahead_add(worker *w, const lh_sync_manifest *ms, int n) {
  for (int i = 0; i < n; i++) {
    if (ms[i].version <= w->staged_version) continue;
    for (int k = 0; k < ms[i].n_blobs; k++) {
      const lh_sync_blob_ref *b = &ms[i].blobs[k];
      if (b->kind != LH_SYNC_PATCH || b->from != ms[i].version - 1) continue;
      if (w->n_ahead == AHEAD_MAX) {
        memmove(w->ahead, w->ahead + 1, (size_t)(AHEAD_MAX - 1) * sizeof *w->ahead);
        w->n_ahead--;
      }
      w->ahead[w->n_ahead++] = *b;
    }
  }
  pthread_cond_broadcast(&w->cv);
}

/* The fetch-ahead thread: downloads the queued patches into the store, oldest first, on its own
 * connection. A failure is left to the policy thread, which fetches what is missing. */
static void *ahead_thread(void *ud) {
  worker *w = ud;
  pthread_mutex_lock(&w->mu);
  while (!w->stop) {
    if (w->n_ahead == 0) {
      wait_cv(w, 100);
      continue;
    }
    lh_sync_blob_ref b = w->ahead[0];
    memmove(w->ahead, w->ahead + 1, (size_t)(w->n_ahead - 1) * sizeof *w->ahead);
    w->n_ahead--;
    bool claimed = false;
    for (int k = 0; k < w->n_claimed && !claimed; k++)
      claimed = !memcmp(w->claimed[k], b.hash, LH_HASH_BYTES);
    if (claimed) continue;
    w->ahead_busy = true;
    memcpy(w->ahead_hash, b.hash, LH_HASH_BYTES);
    pthread_mutex_unlock(&w->mu);
    download_blob(w, w->ahead_http, b.hash, b.size); /* (a failure: the sync fetches it) */
    pthread_mutex_lock(&w->mu);
    w->ahead_busy = false;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* The manifests after `have` in one round trip on connection c (GET /v1/policy?chain=1: all of
 * them up to 64, or from the newest keyframe on, one per line, the newest last), each verified.
 * LH_ERR_NOTFOUND: nothing newer within wait_s. */
static lh_err get_chain(worker *w, lh_http_client *c, int64_t have, double wait_s,
                        lh_sync_manifest **out, int *n) {
  *out = NULL;
  *n = 0;
  char path[96];
  snprintf(path, sizeof path, "/v1/policy?after=%lld&wait=%.1f&chain=1", (long long)have, wait_s);
  lh_http_reply r;
  lh_err e = lh_http_client_request(c, "GET", path, NULL, 0, NULL, 0,
                                    (size_t)CHAIN_MAX * LH_SYNC_MANIFEST_MAX_BYTES, TIMEOUT_MS, &r);
  if (e) return e;
  if (r.status == 204) {
    e = LH_ERR_NOTFOUND;
  } else if (r.status != 200) {
    e = lh_errorf(LH_ERR_IO, "GET %s: HTTP %ld", path, r.status);
  } else {
    e = lh_sync_chain_parse(r.body, r.len, &w->trust, CHAIN_MAX, have, path, out, n);
  }
  lh_http_reply_free(&r);
  return e;
}

/* What one sync did (the worker's debug log and its totals). */
typedef struct sync_stats {
  int steps, fetched, snapshots; /* blobs of the route, those downloaded, snapshots among them */
  uint64_t bytes;                /* downloaded */
  double plan_s;                 /* the planner's estimate */
  double blobs_s;                /* downloading */
} sync_stats;

/* Folds a sync's download into the measured rate: only a download that took more than twice
 * its round trips says something about the rate (a patch that fits the link's window takes one
 * round trip whatever its size). */
static void measure_rate(worker *w, const sync_stats *st) {
  pthread_mutex_lock(&w->mu);
  double rounds = (double)((st->fetched + PREFETCH - 1) / PREFETCH), rtt = w->rtt_s;
  if (st->fetched > 0 && st->blobs_s > 2.0 * rounds * rtt && st->bytes >= 65536) {
    double r = (double)st->bytes / (st->blobs_s - rounds * rtt);
    w->rate_bps = w->rate_bps > 0 ? 0.7 * w->rate_bps + 0.3 * r : r;
  }
  pthread_mutex_unlock(&w->mu);
}

/* Brings *slab (version *have, -1: none; hash: its BLAKE2b-256 as verified when it was made) to
 * the newest of the manifests ms[0..n) (consecutive versions after *have, or from a keyframe
 * on): the fastest route through them by the measured round trip and rate (the fewest bytes
 * until a rate is measured), every blob checked, and the result checked against the manifest's
 * slab hash. A slab's hash is computed once per version at most: a patch is given its parent's
 * verified hash, and its child hash, which apply verified, is the next. LH_ERR_NOTFOUND: no
 * route through these manifests (the caller asks for the chain since *have). */
static lh_err sync_policy(worker *w, const lh_sync_manifest *ms, int n, uint16_t **slab,
                          int64_t *have, uint8_t hash[LH_HASH_BYTES], sync_stats *st) {
  memset(st, 0, sizeof *st);
  lh_err e;
  const lh_sync_manifest *newest = &ms[n - 1];
  if (!w->have_cfg && (e = fetch_model_files(w, newest))) return e;
  lh_sync_route route = {0};
  pthread_mutex_lock(&w->mu);
  lh_sync_cost cost = {w->rtt_s, w->rate_bps, PREFETCH};
  pthread_mutex_unlock(&w->mu);
  int64_t from = *have >= 0 ? *have : LH_SYNC_NONE;
  if (cost.bytes_per_s > 0)
    e = lh_sync_plan_time(ms, n, from, newest->version, &cost, &route);
  else
    e = lh_sync_plan(ms, n, from, newest->version, &route);
  if (e) return e;
  st->steps = route.n;
  st->plan_s = route.seconds;
  claim_route(w, ms, &route); /* (it may wait for a blob the fetch-ahead thread is fetching) */
  double t0 = lh_time_now();
  for (int i = 0; i < route.n; i++) {
    const lh_sync_blob_ref *b = &ms[route.steps[i].manifest].blobs[route.steps[i].blob];
    if (lh_sync_blob_has(w->blob_dir, b->hash)) continue;
    st->fetched++;
    st->bytes += b->size;
    st->snapshots += b->kind == LH_SYNC_SNAPSHOT;
  }
  if (st->fetched > 1 || st->bytes > PIECE_MIN) prefetch_route(w, ms, &route);
  uint16_t *cur = *slab;
  uint8_t known[LH_HASH_BYTES]; /* the hash of cur, when known_ok */
  bool known_ok = cur && *have >= 0;
  if (known_ok) memcpy(known, hash, LH_HASH_BYTES);
  int64_t reached = *have; /* the version cur holds */
  for (int i = 0; !e && i < route.n; i++) {
    const lh_sync_manifest *m = &ms[route.steps[i].manifest];
    const lh_sync_blob_ref *b = &m->blobs[route.steps[i].blob];
    uint8_t *data = NULL;
    size_t len = 0;
    if ((e = fetch_blob(w, b->hash, b->size, &data, &len))) break;
    if (i == route.n - 1) st->blobs_s = lh_time_now() - t0;
    e = lh_sync_apply_blob(b, m->version, data, len, newest->elements, &cur, known, &known_ok);
    free(data);
    if (!e) {
      reached = m->version;
      pthread_mutex_lock(&w->mu);
      w->res->versions_applied++;
      pthread_mutex_unlock(&w->mu);
    }
  }
  pthread_mutex_lock(&w->mu);
  w->n_claimed = 0;
  pthread_mutex_unlock(&w->mu);
  lh_sync_route_free(&route);
  if (!e) {
    measure_rate(w, st);
    if (!known_ok) lh_sync_slab_hash(cur, (size_t)newest->elements, known);
    if (memcmp(known, newest->slab, LH_HASH_BYTES)) {
      e = lh_errorf(LH_ERR_MISMATCH, "version %lld: the weights do not hash to the manifest's",
                    (long long)newest->version);
      free(cur); /* weights of no published version: the next sync starts from a snapshot */
      cur = NULL;
      reached = *have = -1;
    }
  }
  *slab = cur;
  if (!e) {
    *have = newest->version;
    memcpy(hash, newest->slab, LH_HASH_BYTES);
  } else if (reached != *have) { /* part of the route applied: the next sync goes on from there */
    if (!known_ok) lh_sync_slab_hash(cur, (size_t)newest->elements, known);
    *have = reached;
    memcpy(hash, known, LH_HASH_BYTES);
  }
  if (e == LH_ERR_NOTFOUND) { /* a blob the server does not have (404): not the planner's */
    char why[512];
    snprintf(why, sizeof why, "%s", lh_last_error());
    e = lh_errorf(LH_ERR_IO, "%s", why);
  }
  return e;
}

/* ---------------------------------------------------------------- pending groups on disk */

static char *pending_path(const worker *w, int64_t lease, int64_t group) {
  char name[64];
  snprintf(name, sizeof name, "%lld-%lld.lhrb", (long long)lease, (long long)group);
  return lh_path_join(w->pending_dir, name);
}

static void done_push(worker *w, done_group *d) {
  if (w->n_done == w->done_cap) {
    w->done_cap = w->done_cap ? 2 * w->done_cap : 16;
    w->done = lh_xrealloc(w->done, (size_t)w->done_cap * sizeof *w->done);
  }
  w->done[w->n_done++] = *d;
}

/* Groups generated before a restart and not yet answered. */
static lh_err load_pending(worker *w) {
  DIR *d = opendir(w->pending_dir);
  if (!d) return lh_errorf(LH_ERR_IO, "%s: %s", w->pending_dir, strerror(errno));
  struct dirent *ent;
  lh_err e = LH_ERR_OK;
  while (!e && (ent = readdir(d))) {
    long long lease, group;
    int used = 0;
    if (sscanf(ent->d_name, "%lld-%lld.lhrb%n", &lease, &group, &used) != 2 || ent->d_name[used])
      continue;
    char *path = lh_path_join(w->pending_dir, ent->d_name);
    char *data = NULL;
    size_t len = 0;
    e = lh_file_read(path, (size_t)64 << 20, &data, &len);
    free(path);
    if (e) break;
    done_group g = {lease, group, (uint8_t *)data, len, 0};
    done_push(w, &g);
  }
  closedir(d);
  return e;
}

/* ---------------------------------------------------------------- the network thread */

static int rtt_bucket(double ms) {
  int k = ms > 0 ? (int)(4.0 * log2(ms + 1.0)) : 0;
  return k < LH_WORKER_RTT_BUCKETS ? k : LH_WORKER_RTT_BUCKETS - 1;
}

double lh_worker_rtt_quantile(const lh_worker_result *r, double q) {
  int64_t n = 0, seen = 0;
  for (int k = 0; k < LH_WORKER_RTT_BUCKETS; k++)
    n += r->submit_rtt[k];
  if (n == 0) return -1;
  for (int k = 0; k < LH_WORKER_RTT_BUCKETS; k++) {
    seen += r->submit_rtt[k];
    if ((double)seen >= q * (double)n && r->submit_rtt[k] > 0) return exp2((k + 1) / 4.0) - 1.0;
  }
  return exp2(LH_WORKER_RTT_BUCKETS / 4.0) - 1.0;
}

static lh_err submit(worker *w, lh_http_client *c, done_group *d, bool *final) {
  *final = false;
  char path[128];
  snprintf(path, sizeof path, "/v1/rollouts?lease=%lld&group=%lld&gen_ms=%lld", (long long)d->lease,
           (long long)d->group, (long long)d->gen_ms);
  lh_http_reply r;
  double t0 = lh_time_now();
  lh_err e = call(w, c, "POST", path, d->body, d->len, &r);
  double rtt_ms = 1000.0 * (lh_time_now() - t0);
  if (e) return e;
  if (r.status == 202) {
    *final = true;
    pthread_mutex_lock(&w->mu);
    w->res->groups_submitted++;
    pthread_mutex_unlock(&w->mu);
  } else if (r.status >= 400 && r.status < 500 && r.status != 429 && r.status != 409 &&
             r.status != 401) {
    char code[64];
    error_code(&r, code, sizeof code);
    lh_log(LH_LOG_WARN, "worker: group %lld refused: HTTP %ld %s: %.*s", (long long)d->group,
           r.status, code, (int)(r.len < 300 ? r.len : 300), r.body ? (char *)r.body : "");
    *final = true;
    pthread_mutex_lock(&w->mu);
    w->res->groups_refused++;
    pthread_mutex_unlock(&w->mu);
  } else {
    e = lh_errorf(LH_ERR_IO, "submit group %lld: HTTP %ld: %.*s", (long long)d->group, r.status,
                  (int)(r.len < 300 ? r.len : 300), r.body ? (char *)r.body : "");
  }
  lh_http_reply_free(&r);
  if (*final) {
    pthread_mutex_lock(&w->mu);
    w->res->submit_rtt[rtt_bucket(rtt_ms)]++;
    pthread_mutex_unlock(&w->mu);
    char *p = pending_path(w, d->lease, d->group);
    unlink(p);
    free(p);
  }
  return e;
}

static lh_err lease(worker *w, int want, int64_t version) {
  lh_http_client *c = w->lease_http;
  char body[64];
  int n = snprintf(body, sizeof body, "{\"groups\":%d,\"version\":%lld}", want, (long long)version);
  lh_http_reply r;
  lh_err e = call(w, c, "POST", "/v1/leases", body, (size_t)n, &r);
  if (e) return e;
  if (r.status == 204) { /* nothing to lease until the next version (the server's --sync) */
    pthread_mutex_lock(&w->mu);
    w->lease_wait = true;
    pthread_mutex_unlock(&w->mu);
  } else if (r.status == 200) {
    lh_node_lease l;
    pthread_mutex_lock(&w->mu);
    int vocab = w->cfg.vocab_size;
    pthread_mutex_unlock(&w->mu);
    if (!(e = lh_node_lease_parse(r.body, r.len, vocab, &l))) {
      pthread_mutex_lock(&w->mu);
      for (int i = 0; i < l.n_groups; i++) {
        if (w->n_ready == w->ready_cap) {
          w->ready_cap = w->ready_cap ? 2 * w->ready_cap : 16;
          w->ready = lh_xrealloc(w->ready, (size_t)w->ready_cap * sizeof *w->ready);
        }
        w->ready[w->n_ready++] = (ready_group){l.lease, l.groups[i]};
        memset(&l.groups[i], 0, sizeof l.groups[i]);
      }
      pthread_cond_broadcast(&w->cv);
      pthread_mutex_unlock(&w->mu);
      lh_node_lease_clear(&l);
    }
  } else if (r.status == 503 || r.status == 429) { /* backpressure: ask again shortly */
    e = lh_errorf(LH_ERR_LIMIT, "lease: HTTP %ld", r.status);
  } else if (r.status >= 500) {
    e = lh_errorf(LH_ERR_IO, "lease: HTTP %ld", r.status);
  } else {
    char code[64];
    error_code(&r, code, sizeof code);
    e = lh_errorf(sign_again(&r, code) ? LH_ERR_IO : LH_ERR_INVAL, "lease: HTTP %ld %s", r.status,
                  code);
    refused_for_good(w, &r, code, "lease", &e);
  }
  lh_http_reply_free(&r);
  return e;
}

/* DIR/version: "VERSION HASH" of the newest version synced (for people and tests); h is the
 * slab's hash as sync_policy verified it. */
static void write_version(const worker *w, int64_t v, const uint8_t h[LH_HASH_BYTES]) {
  char hx[2 * LH_HASH_BYTES + 1], text[128];
  lh_hash_hex(h, hx);
  int n = snprintf(text, sizeof text, "%lld %s\n", (long long)v, hx);
  char *path = lh_path_join(w->c->dir, "version");
  if (lh_file_write_atomic(path, text, (size_t)n))
    lh_log(LH_LOG_WARN, "worker: %s", lh_last_error());
  free(path);
}

/* How many groups to hold leased ahead of the generator: two batches of its slots, and what it
 * generates during two round trips of a lease (rate: groups per second, rtt: seconds, both
 * measured), so that a long link never leaves it waiting for work. At most the server's bound
 * of unanswered groups per worker. */
static int lease_target(const worker *w, int group_size, double rate, double rtt) {
  int per = w->c->slots / (group_size > 0 ? group_size : 1);
  double t = 2.0 * (per < 1 ? 1 : per) + 2.0 * rate * rtt;
  return t > 240 ? 240 : (int)t + 1;
}

/* After a failed call: back off; an error other than the transport's, twenty times in a row,
 * stops the worker (it is not going away by waiting). */
static void failed(worker *w, lh_err e, int *fails) {
  lh_log(e == LH_ERR_IO ? LH_LOG_DEBUG : LH_LOG_WARN, "worker: %s", lh_last_error());
  backoff(w, (*fails)++);
  if (e != LH_ERR_IO && *fails > 20) {
    pthread_mutex_lock(&w->mu);
    w->net_error = e;
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
  }
}

/* Waits on the worker's condition for at most ms milliseconds. Caller holds mu. */
static void wait_cv(worker *w, long ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += ms * 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_cond_timedwait(&w->cv, &w->mu, &ts);
}

/* Drops the known manifests not newer than the policy thread's version, and the oldest beyond
 * CHAIN_MAX. Caller holds mu. */
static void known_trim(worker *w) {
  int drop = 0;
  while (drop < w->n_known && w->known[drop].version <= w->staged_version)
    drop++;
  if (w->n_known - drop > CHAIN_MAX) drop = w->n_known - CHAIN_MAX;
  memmove(w->known, w->known + drop, (size_t)(w->n_known - drop) * sizeof *w->known);
  w->n_known -= drop;
}

/* Adds the manifests ms[0..n) that the poll thread received to w->known: after those known when
 * they follow on, else in their place; those not newer than the policy thread's version are
 * dropped, and the oldest beyond CHAIN_MAX. Caller holds mu. */
static void known_add(worker *w, const lh_sync_manifest *ms, int n) {
  int keep = 0; /* known manifests older than ms[0] that stay */
  if (w->n_known > 0 && w->known[0].version < ms[0].version &&
      ms[0].version <= w->known[w->n_known - 1].version + 1)
    keep = (int)(ms[0].version - w->known[0].version);
  w->known = lh_xrealloc(w->known, (size_t)(keep + n) * sizeof *w->known);
  memcpy(w->known + keep, ms, (size_t)n * sizeof *ms);
  w->n_known = keep + n;
  known_trim(w);
  pthread_cond_broadcast(&w->cv);
}

/* The poll thread: keeps a long poll for newer manifests in flight on its own connection, so
 * that a new version is known half a round trip after it is published, also while the policy
 * thread downloads the last one. */
static void *poll_thread(void *ud) {
  worker *w = ud;
  int fails = 0;
  while (!stopping(w)) {
    pthread_mutex_lock(&w->mu);
    int64_t after = w->n_known > 0 ? w->known[w->n_known - 1].version : w->staged_version;
    pthread_mutex_unlock(&w->mu);
    lh_sync_manifest *ms = NULL;
    int n = 0;
    lh_err e = get_chain(w, w->poll_http, after, 5.0, &ms, &n);
    if (e == LH_ERR_NOTFOUND) continue; /* nothing newer within the poll */
    if (e) {
      failed(w, e, &fails);
      continue;
    }
    fails = 0;
    pthread_mutex_lock(&w->mu);
    known_add(w, ms, n);
    if (w->staged_version >= 0) ahead_add(w, ms, n);
    pthread_mutex_unlock(&w->mu);
    free(ms);
  }
  return NULL;
}

/* The policy thread: brings its copy of the policy to the newest version the poll thread knows
 * of, and stages it for the generator. */
static void *policy_thread(void *ud) {
  worker *w = ud;
  uint16_t *slab = NULL; /* this thread's copy of the newest version */
  int64_t have = -1;
  uint8_t hash[LH_HASH_BYTES] = {0}; /* of slab, once have >= 0 */
  int fails = 0;
  while (!stopping(w)) {
    pthread_mutex_lock(&w->mu);
    while (!w->stop && (w->n_known == 0 || w->known[w->n_known - 1].version <= have))
      wait_cv(w, 100);
    int n = 0;
    lh_sync_manifest *ms = NULL;
    if (!w->stop) {
      int first = 0;
      while (w->known[first].version <= have)
        first++;
      n = w->n_known - first;
      ms = lh_xmalloc((size_t)n * sizeof *ms);
      memcpy(ms, w->known + first, (size_t)n * sizeof *ms);
    }
    pthread_mutex_unlock(&w->mu);
    if (!ms) break;
    int64_t from = have;
    double t0 = lh_time_now();
    sync_stats st;
    lh_err e = sync_policy(w, ms, n, &slab, &have, hash, &st);
    if (e == LH_ERR_NOTFOUND) { /* no route through what is known: the chain since `have` */
      free(ms);
      ms = NULL;
      if (!(e = get_chain(w, w->http, have, 0.0, &ms, &n))) {
        pthread_mutex_lock(&w->mu);
        known_add(w, ms, n);
        pthread_mutex_unlock(&w->mu);
        e = sync_policy(w, ms, n, &slab, &have, hash, &st);
      }
    }
    free(ms);
    if (e == LH_ERR_NOTFOUND) { /* the server has nothing newer after all (it restarted from an
                                 * older checkpoint): forget what the poll thread had seen */
      pthread_mutex_lock(&w->mu);
      w->n_known = 0;
      wait_cv(w, 200);
      pthread_mutex_unlock(&w->mu);
      continue;
    }
    if (e) {
      failed(w, e, &fails);
      continue;
    }
    fails = 0;
    double took = lh_time_now() - t0;
    pthread_mutex_lock(&w->mu);
    w->lease_wait = false;
    w->n = (size_t)lh_config_n_params(&w->cfg);
    w->staged = lh_xrealloc(w->staged, w->n * sizeof *w->staged);
    memcpy(w->staged, slab, w->n * sizeof *w->staged);
    w->staged_version = have;
    known_trim(w);
    int64_t newer = w->n_known > 0 ? w->known[w->n_known - 1].version - have : 0;
    lh_worker_result *r = w->res;
    r->syncs++;
    r->sync_versions += have - (from >= 0 ? from : -1);
    r->sync_s += took;
    r->sync_behind += newer;
    r->snapshots_fetched += st.snapshots;
    double rtt_ms = 1e3 * w->rtt_s, rate_kbps = w->rate_bps / 1e3;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    lh_log(LH_LOG_DEBUG,
           "worker: sync %lld -> %lld: %d blobs (%d fetched, %d snapshots, %.0f kB) in %.3f s "
           "(blobs %.3f s, planned %.3f s at %.0f ms and %.0f kB/s); %lld newer known; at %lld",
           (long long)from, (long long)have, st.steps, st.fetched, st.snapshots,
           (double)st.bytes / 1e3, took, st.blobs_s, st.plan_s, rtt_ms, rate_kbps, (long long)newer,
           (long long)now_ms(w));
    write_version(w, have, hash);
  }
  free(slab);
  return NULL;
}

/* The lease thread: registers, then keeps the generator's queue of leased groups full. */
static void *lease_thread(void *ud) {
  worker *w = ud;
  int fails = 0, group_size = 0;
  double rtt = 0.0, rate = 0.0, t_rate = lh_time_now(); /* measured, smoothed */
  int64_t made_then = 0;
  lh_err e;
  while (!stopping(w) && (e = register_worker(w)))
    failed(w, e, &fails);
  fails = 0;
  while (!stopping(w)) {
    pthread_mutex_lock(&w->mu);
    double now = lh_time_now();
    if (now - t_rate >= 1.0) { /* the generator's rate over the last second or more */
      double r = (double)(w->generated - made_then) / (now - t_rate);
      rate = rate > 0 ? 0.7 * rate + 0.3 * r : r;
      made_then = w->generated;
      t_rate = now;
    }
    int64_t have = w->staged_version;
    int target = lease_target(w, group_size, rate, rtt), held = w->n_ready + (int)w->in_flight;
    bool enough =
        w->c->max_groups > 0 && w->submitted + w->n_done + w->sending + held >= w->c->max_groups;
    if (have < 0 || held >= target || enough || w->lease_wait) {
      wait_cv(w, 100);
      pthread_mutex_unlock(&w->mu);
      continue;
    }
    pthread_mutex_unlock(&w->mu);
    int want = target - held;
    if (want > LH_NODE_MAX_LEASE_GROUPS) want = LH_NODE_MAX_LEASE_GROUPS;
    double t0 = lh_time_now();
    e = lease(w, want, have);
    double dt = lh_time_now() - t0;
    if (e != LH_ERR_IO) {
      rtt = rtt > 0 ? 0.7 * rtt + 0.3 * dt : dt;
      pthread_mutex_lock(&w->mu);
      w->rtt_s = rtt; /* the policy thread plans with it */
      pthread_mutex_unlock(&w->mu);
    }
    if (e == LH_ERR_LIMIT) { /* the trainer has enough for now */
      pthread_mutex_lock(&w->mu);
      wait_cv(w, 200);
      pthread_mutex_unlock(&w->mu);
      continue;
    }
    if (e) {
      failed(w, e, &fails);
      continue;
    }
    fails = 0;
    pthread_mutex_lock(&w->mu);
    if (w->n_ready > 0) group_size = w->ready[0].g.group_size;
    pthread_mutex_unlock(&w->mu);
  }
  return NULL;
}

/* A submitting thread: takes generated groups in order and sends each until the server gives
 * its final answer (several run at once, so a long round trip does not serialise them). */
static void *submit_thread(void *ud) {
  worker *w = ud;
  lh_http_client *c = NULL;
  if (lh_http_client_create(w->c->server, &c)) {
    lh_log(LH_LOG_WARN, "worker: %s", lh_last_error());
    return NULL;
  }
  while (!stopping(w)) {
    pthread_mutex_lock(&w->mu);
    if (w->n_done == 0) {
      wait_cv(w, 100);
      pthread_mutex_unlock(&w->mu);
      continue;
    }
    done_group d = w->done[0];
    memmove(w->done, w->done + 1, (size_t)(w->n_done - 1) * sizeof *w->done);
    w->n_done--;
    w->sending++;
    pthread_mutex_unlock(&w->mu);
    bool final = false;
    for (int k = 0; !final && !stopping(w); k++) {
      lh_err e = submit(w, c, &d, &final);
      if (e && !final) {
        lh_log(LH_LOG_DEBUG, "worker: %s", lh_last_error());
        backoff(w, k);
      }
    }
    free(d.body); /* unsent at a stop: still in DIR/pending for the next start */
    pthread_mutex_lock(&w->mu);
    w->sending--;
    if (final) w->submitted++;
    if (w->c->max_groups > 0 && w->submitted >= w->c->max_groups) w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
  }
  lh_http_client_free(c);
  return NULL;
}

/* ---------------------------------------------------------------- the generator */

/* Writes the first version as a model directory and loads it for inference. */
static lh_err load_policy(worker *w, const uint16_t *slab, size_t n_slab, lh_infer **inf) {
  lh_err e = lh_model_dir_save_bf16(&w->cfg, slab, w->policy_dir, NULL);
  if (!e) e = lh_infer_load(w->policy_dir, inf);
  if (!e) {
    size_t n = 0;
    const uint16_t *got = lh_infer_bf16(*inf, &n);
    if (n != n_slab || memcmp(got, slab, n * sizeof *got))
      e = lh_errorf(LH_ERR_MISMATCH, "%s: the policy did not load bit for bit", w->policy_dir);
  }
  return e;
}

lh_worker_config lh_worker_defaults(void) {
  lh_worker_config c;
  memset(&c, 0, sizeof c);
  c.dir = "longhaul-worker";
  c.threads = 0;
  c.slots = 16;
  return c;
}

/* best-of-n (testing only): 3 more groups per task with other seeds; each group keeps the one of
 * the 4 whose completions are the most likely (a stand-in for the best rewarded: the worker has
 * no environment), under the leased seed's name. */
static lh_err best_of_n(lh_generator *gen, const lh_gen_config *gc, const uint64_t *tasks,
                        const int32_t *const *prompts, const int *plen, const uint64_t *bases,
                        int n, int group_size, lh_rollout_batch *b) {
  lh_gen_config g2 = *gc;
  for (int k = 1; k < 4; k++) {
    lh_rollout_batch alt[MAX_BATCH_GROUPS];
    g2.seed = gc->seed + (uint64_t)k * 0x9e3779b97f4a7c15ull;
    lh_err e = lh_rollout_generate_ids(gen, &g2, LH_SPLIT_TRAIN, tasks, prompts, plen, bases, n,
                                       group_size, alt);
    if (e) return e;
    for (int i = 0; i < n; i++) {
      lh_rollout_summary x = lh_rollout_summarise(&b[i]), y = lh_rollout_summarise(&alt[i]);
      if (y.entropy < x.entropy) { /* more likely */
        lh_rollout_batch t = b[i];
        b[i] = alt[i];
        alt[i] = t;
      }
      lh_rollout_batch_free(&alt[i]);
    }
  }
  return LH_ERR_OK;
}

/* selective (testing only): of every 4 groups generated, keeps the most likely one (a stand-in
 * for the best rewarded: the worker has no environment) and abandons the other 3, never
 * submitted, whose leases expire. Takes d (its body); true when d is now the one to send.
 * The generating thread's. */
static bool selective(worker *w, done_group *d, double entropy) {
  if (w->held_n == 0 || entropy < w->held_entropy) {
    free(w->held.body);
    w->held = *d;
    w->held_entropy = entropy;
  } else {
    free(d->body);
  }
  memset(d, 0, sizeof *d);
  if (++w->held_n < 4) return false;
  *d = w->held;
  memset(&w->held, 0, sizeof w->held);
  w->held_n = 0;
  return true;
}

/* The body-level cheats (testing only): garbage, an oversized body, a replay of the first. */
static void adversary_body(worker *w, uint8_t **body, size_t *len) {
  lh_node_adversary a = w->c->adversary;
  if (a == LH_ADV_GARBAGE) {
    randombytes_buf(*body, *len);
  } else if (a == LH_ADV_OVERSIZED) {
    free(*body);
    *len = ((size_t)32 << 20) + 4096;
    *body = lh_xcalloc(*len, 1);
  } else if (a == LH_ADV_REPLAY) {
    pthread_mutex_lock(&w->mu);
    if (!w->replay) {
      w->replay = lh_xmalloc(*len);
      memcpy(w->replay, *body, *len);
      w->replay_len = *len;
    } else {
      free(*body);
      *body = lh_xmalloc(w->replay_len);
      memcpy(*body, w->replay, w->replay_len);
      *len = w->replay_len;
    }
    pthread_mutex_unlock(&w->mu);
  }
}

lh_err lh_worker_run(const lh_worker_config *c, lh_worker_result *res) {
  lh_worker_result local;
  res = res ? res : &local;
  memset(res, 0, sizeof *res);
  worker *w = lh_xcalloc(1, sizeof *w);
  w->c = c;
  w->res = res;
  w->version = -1;
  w->staged_version = -1;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  lh_infer *inf = NULL;
  lh_generator *gen = NULL;
  lh__slowloris *loris = NULL;
  pthread_t net, poller, aheader, leaser, senders[SUBMITTERS];
  bool net_started = false, poll_started = false, ahead_started = false, leaser_started = false;
  int n_senders = 0;
  lh_err e;
  struct stat st;
  if (stat(c->key_path, &st) != 0 && errno == ENOENT) { /* a new worker makes its key */
    if ((e = lh_sync_keygen(&w->sk)) || (e = lh_sync_keys_write(c->key_path, &w->sk, false)))
      goto out;
    lh_log(LH_LOG_INFO, "worker: made a new key %s", c->key_path);
  } else if ((e = lh_sync_secret_key_load(c->key_path, &w->sk))) {
    goto out;
  }
  if ((e = lh_sync_public_key_load(c->trust_path, &w->trust))) goto out;
  w->blob_dir = lh_path_join(c->dir, "blobs");
  w->pending_dir = lh_path_join(c->dir, "pending");
  w->policy_dir = lh_path_join(c->dir, "policy");
  if ((mkdir(c->dir, 0755) && errno != EEXIST) || (mkdir(w->blob_dir, 0755) && errno != EEXIST) ||
      (mkdir(w->pending_dir, 0755) && errno != EEXIST)) {
    e = lh_errorf(LH_ERR_IO, "%s: cannot create: %s", c->dir, strerror(errno));
    goto out;
  }
  if ((e = load_pending(w))) goto out;
  if (w->n_done > 0)
    lh_log(LH_LOG_INFO, "worker: %d groups generated before a restart will be sent", w->n_done);
  if (c->adversary == LH_ADV_SLOWLORIS) loris = lh__adv_slowloris_start(c->server, 32);
  if ((e = lh_http_client_create(c->server, &w->http))) goto out;
  if ((e = lh_http_client_create(c->server, &w->lease_http))) goto out;
  if ((e = lh_http_client_create(c->server, &w->poll_http))) goto out;
  if (pthread_create(&poller, NULL, poll_thread, w)) {
    e = lh_errorf(LH_ERR_NOMEM, "worker: cannot start the poll thread");
    goto out;
  }
  poll_started = true;
  if ((e = lh_http_client_create(c->server, &w->ahead_http))) goto out;
  if (pthread_create(&aheader, NULL, ahead_thread, w)) {
    e = lh_errorf(LH_ERR_NOMEM, "worker: cannot start the fetch-ahead thread");
    goto out;
  }
  ahead_started = true;
  if (pthread_create(&net, NULL, policy_thread, w)) {
    e = lh_errorf(LH_ERR_NOMEM, "worker: cannot start the network thread");
    goto out;
  }
  net_started = true;
  if (pthread_create(&leaser, NULL, lease_thread, w)) {
    e = lh_errorf(LH_ERR_NOMEM, "worker: cannot start the lease thread");
    goto out;
  }
  leaser_started = true;
  for (; n_senders < SUBMITTERS; n_senders++)
    if (pthread_create(&senders[n_senders], NULL, submit_thread, w)) break;
  int slots = c->slots;
  while (true) {
    pthread_mutex_lock(&w->mu);
    while (!w->stop && !(c->stop && *c->stop) && w->staged_version <= w->version &&
           (w->n_ready == 0 || w->version < 0)) {
      wait_cv(w, 100);
    }
    if (c->stop && *c->stop) w->stop = true;
    if (w->stop) {
      pthread_cond_broadcast(&w->cv);
      pthread_mutex_unlock(&w->mu);
      break;
    }
    /* a newer version: swap it in between groups */
    if (w->staged_version > w->version) {
      int64_t staged = w->staged_version;
      if (!inf) { /* the first version: written and loaded from a copy, without the lock (the
                   * policy thread may stage a newer one meanwhile) */
        size_t n = w->n;
        uint16_t *copy = lh_xmalloc(n * sizeof *copy);
        memcpy(copy, w->staged, n * sizeof *copy);
        pthread_mutex_unlock(&w->mu);
        lh__adv_weights(c->adversary, copy, n); /* testing only: a cheat's weights */
        e = load_policy(w, copy, n, &inf);
        free(copy);
        pthread_mutex_lock(&w->mu);
        if (!e) {
          int max_seq = w->cfg.max_positions < 4096 ? w->cfg.max_positions : 4096;
          e = lh_generator_create(inf, slots, max_seq, 0, &gen);
        }
      } else if (c->adversary == LH_ADV_NONE) {
        e = lh_infer_set_range(inf, 0, w->staged, w->n);
      } else {
        uint16_t *copy = lh_xmalloc(w->n * sizeof *copy);
        memcpy(copy, w->staged, w->n * sizeof *copy);
        lh__adv_weights(c->adversary, copy, w->n);
        e = lh_infer_set_range(inf, 0, copy, w->n);
        free(copy);
      }
      if (e) {
        pthread_mutex_unlock(&w->mu);
        break;
      }
      w->version = staged; /* the version loaded, even if a newer one was staged meanwhile */
      pthread_mutex_unlock(&w->mu);
      continue;
    }
    /* the groups to generate together: those like the first (seed, sampling, length, size)
     * that this version may generate, as many as the slots hold */
    int64_t version = w->version;
    int cap = slots / (w->ready[0].g.group_size > 0 ? w->ready[0].g.group_size : 1);
    if (cap < 1) cap = 1;
    if (cap > MAX_BATCH_GROUPS) cap = MAX_BATCH_GROUPS;
    ready_group take[MAX_BATCH_GROUPS];
    int n_take = 0;
    for (int i = 0; i < w->n_ready && n_take < cap;) {
      const lh_node_group *x = &w->ready[i].g, *f = n_take ? &take[0].g : x;
      bool alike = x->seed == f->seed && x->max_new == f->max_new &&
                   x->group_size == f->group_size &&
                   !memcmp(&x->sample, &f->sample, sizeof x->sample);
      if (alike && x->min_version <= version) {
        take[n_take++] = w->ready[i];
        memmove(w->ready + i, w->ready + i + 1, (size_t)(w->n_ready - i - 1) * sizeof *w->ready);
        w->n_ready--;
      } else {
        i++;
      }
    }
    if (n_take == 0) { /* every group asks for a newer version: wait for it */
      wait_cv(w, 100);
      pthread_mutex_unlock(&w->mu);
      continue;
    }
    w->in_flight += n_take;
    pthread_mutex_unlock(&w->mu);
    lh_gen_config gc = lh_gen_defaults();
    gc.sample = take[0].g.sample;
    gc.seed = take[0].g.seed;
    gc.max_new = take[0].g.max_new;
    uint64_t tasks[MAX_BATCH_GROUPS], bases[MAX_BATCH_GROUPS];
    const int32_t *prompts[MAX_BATCH_GROUPS];
    int plen[MAX_BATCH_GROUPS];
    for (int i = 0; i < n_take; i++) {
      tasks[i] = take[i].g.task;
      bases[i] = take[i].g.stream_base;
      prompts[i] = take[i].g.prompt;
      plen[i] = take[i].g.prompt_len;
    }
    lh_rollout_batch b[MAX_BATCH_GROUPS];
    double t0 = lh_time_now();
    lh__adv_sampling(c->adversary, &gc.sample); /* testing only: a cheat's sampling */
    e = lh_rollout_generate_ids(gen, &gc, LH_SPLIT_TRAIN, tasks, prompts, plen, bases, n_take,
                                take[0].g.group_size, b);
    if (!e && c->adversary == LH_ADV_BEST_OF_N)
      e = best_of_n(gen, &gc, tasks, prompts, plen, bases, n_take, take[0].g.group_size, b);
    double gen_ms = 1000.0 * (lh_time_now() - t0) / n_take;
    for (int i = 0; i < n_take; i++) {
      uint8_t *body = NULL;
      size_t len = 0;
      lh_err ei = e;
      double entropy = ei ? 0 : lh_rollout_summarise(&b[i]).entropy;
      if (!ei) {
        b[i].version = version;
        b[i].seed = take[i].g.seed; /* what was leased, whatever a cheat used */
        b[i].sample = take[i].g.sample;
        lh__adv_batch(c->adversary, &b[i], w->cfg.vocab_size);
        ei = lh_rollout_encode(&b[i], &body, &len);
      }
      if (!ei && c->adversary != LH_ADV_NONE) adversary_body(w, &body, &len);
      lh_rollout_batch_free(&b[i]);
      done_group d = {take[i].lease, take[i].g.group, body, len, gen_ms};
      bool keep = ei || c->adversary != LH_ADV_SELECTIVE || selective(w, &d, entropy);
      char *path = keep ? pending_path(w, d.lease, d.group) : NULL;
      if (keep && !ei) ei = lh_file_write_atomic(path, d.body, d.len);
      free(path);
      lh_node_group_clear(&take[i].g);
      pthread_mutex_lock(&w->mu);
      w->in_flight--;
      w->generated++;
      if (!ei && keep)
        done_push(w, &d);
      else
        free(d.body);
      pthread_cond_broadcast(&w->cv);
      pthread_mutex_unlock(&w->mu);
      if (ei && !e) e = ei;
    }
    if (e == LH_ERR_LIMIT) { /* a prompt that does not fit this worker: skip those groups */
      lh_log(LH_LOG_WARN, "worker: %s", lh_last_error());
      e = LH_ERR_OK;
    }
    if (e) break;
  }
out:
  pthread_mutex_lock(&w->mu);
  w->stop = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (net_started) pthread_join(net, NULL);
  if (poll_started) pthread_join(poller, NULL);
  if (ahead_started) pthread_join(aheader, NULL);
  if (leaser_started) pthread_join(leaser, NULL);
  for (int i = 0; i < n_senders; i++)
    pthread_join(senders[i], NULL);
  if (!e && w->net_error) e = w->net_error;
  lh_generator_free(gen);
  lh_infer_free(inf);
  lh_http_client_free(w->http);
  lh_http_client_free(w->lease_http);
  lh_http_client_free(w->poll_http);
  lh_http_client_free(w->ahead_http);
  for (int i = 0; i < PREFETCH; i++)
    lh_http_client_free(w->fetch[i]);
  free(w->known);
  free(w->claimed);
  for (int i = 0; i < w->n_ready; i++)
    lh_node_group_clear(&w->ready[i].g);
  free(w->ready);
  for (int i = 0; i < w->n_done; i++)
    free(w->done[i].body);
  free(w->done);
  free(w->replay);
  free(w->held.body);
  lh__adv_slowloris_stop(loris);
  free(w->staged);
  free(w->blob_dir);
  free(w->pending_dir);
  free(w->policy_dir);
  lh_sync_secret_key_wipe(&w->sk);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
  return e;
}
