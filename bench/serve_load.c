/* serve_load: the load generator of `make bench-serve-load` and tests/integration/serve_load.sh
 * (issue 19, "Hostile bytes and load"). N clients, each with its own Ed25519 key and keep-alive
 * connection, register, lease groups and submit them signed, as fast as the server answers, for
 * a bounded time or number of groups; bodies are valid groups for their leases (the leased
 * prompt, completions of its tokens, finite behaviour log-probs) but not what the sampler would
 * pick, so serve runs with --no-verify and the HTTP, signature and ledger path is measured. It
 * uses the project's own client (http.h), signing (lh_node_request) and codecs (rollout.h,
 * node.h). Reports accepted groups/s, the latency of POST /v1/rollouts (until the 202, sent once
 * the group is durable), answers by status, serve's RSS sampled over the run, and with
 * --interval S the same per S seconds (to show they stay flat over a long run). --probe first
 * checks the replay defence over HTTP: a request sent twice is 409 the second time, one signed a
 * window too early or too late is 401 stale_time.
 * Two modes. Closed loop (the default): each client submits its next group as soon as the last
 * is answered, which finds the saturation throughput; its latency is then set by the number of
 * clients (Little's law), not by the server. Open loop (--rate R): R groups/s offered in all,
 * each client's submissions on a timetable of its own (R / clients per second, evenly spaced and
 * staggered, or --poisson), and each latency measured from the submission's scheduled time, so
 * that a server that stalls is not hidden by clients that stop sending meanwhile ("coordinated
 * omission"): a client still busy when its next submission falls due sends it late, and the
 * lateness counts. Submissions scheduled in the window but not sent when it ends count with the
 * wait they had so far (a lower bound). --trace FILE writes every answered submission.
 * Usage: serve_load --server http://127.0.0.1:PORT [--clients 64] [--seconds 10] [--groups N]
 *        [--lease 32] [--dup-every K] [--pid PID] [--json FILE] [--ids FILE] [--interval S]
 *        [--rate R [--poisson]] [--trace FILE] [--probe] */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "longhaul/http.h"
#include "longhaul/model.h"
#include "longhaul/node.h"
#include "longhaul/rollout.h"

#define REPLY_MAX  ((size_t)8 << 20)
#define TIMEOUT_MS 30000
#define LAT_MAX    (1 << 16) /* latencies kept per client at most */
#define RSS_MAX    4096      /* RSS samples at most */
#define IV_MAX     1024      /* intervals reported at most */

typedef struct opts {
  const char *server, *json_path, *ids_path, *trace_path;
  int clients, lease, dup_every;
  bool probe, poisson;
  double seconds, interval;
  double rate;    /* groups/s offered in all (open loop); 0: closed loop */
  int64_t groups; /* submissions in all at most (0: by time only) */
  long pid;
} opts;

typedef struct leased {
  int64_t lease;
  lh_node_group g;
} leased;

typedef struct shared shared;

typedef struct client {
  shared *sh;
  int id;
  lh_sync_secret_key sk;
  lh_http_client *http, *dup_http;
  leased *pool;
  int n_pool, next;
  double *lat;    /* seconds of each POST /v1/rollouts answered (open loop: from its schedule) */
  double *svc;    /* and from its sending to its answer (the service time) */
  double *lat_at; /* and when each was answered (seconds since the window began) */
  long *lat_st;   /* and its status */
  int n_lat;
  double due;      /* open loop: when the next submission is due (seconds since the window began) */
  uint64_t rng;    /* open loop, --poisson: the gaps */
  int64_t offered; /* open loop: submissions due in the window */
  int64_t unsent;  /* of them, not sent when the window ended (counted in lat, a lower bound) */
  int64_t sub_status[600], lease_status[600]; /* answers by status; [0]: transport failures */
  int64_t *ids;                               /* groups answered 202 */
  int n_ids, ids_cap;
  int64_t submitted;
  char error[256];
} client;

struct shared {
  opts o;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int ready;      /* clients registered */
  bool go, stop;  /* the measured window started; ended */
  int64_t budget; /* submissions left (when --groups) */
  int64_t version;
  double t0, t1;
  atomic_llong accepted, refused; /* groups answered 202 (distinct); submissions answered 4xx/5xx */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static bool stopped(shared *sh) {
  pthread_mutex_lock(&sh->mu);
  bool s = sh->stop;
  pthread_mutex_unlock(&sh->mu);
  return s;
}

static void count(int64_t *by_status, long status) {
  by_status[status >= 0 && status < 600 ? status : 0]++;
}

/* A signed request; its status (0: a transport failure), the reply in *r when not 0. */
static long request(client *c, lh_http_client *http, const char *method, const char *path,
                    const void *body, size_t len, lh_http_reply *r) {
  if (lh_node_request(http, &c->sk, method, path, body, len, wall_ms(), REPLY_MAX, TIMEOUT_MS, r)) {
    snprintf(c->error, sizeof c->error, "%s", lh_last_error());
    return 0;
  }
  return r->status;
}

/* Leases up to o.lease groups into the pool; false when the server refused (counted). */
static bool lease(client *c) {
  char body[64];
  int n = snprintf(body, sizeof body, "{\"groups\":%d,\"version\":-1}", c->sh->o.lease);
  lh_http_reply r;
  long st = request(c, c->http, "POST", "/v1/leases", body, (size_t)n, &r);
  count(c->lease_status, st);
  if (st == 0) return false;
  lh_node_lease l;
  bool ok = st == 200 && !lh_node_lease_parse(r.body, r.len, LH_MAX_VOCAB, &l);
  if (st == 200 && !ok) snprintf(c->error, sizeof c->error, "lease reply: %s", lh_last_error());
  lh_http_reply_free(&r);
  if (!ok) return false;
  for (int i = 0; i < c->n_pool; i++)
    lh_node_group_clear(&c->pool[i].g);
  c->pool = lh_xrealloc(c->pool, (size_t)l.n_groups * sizeof *c->pool);
  for (int i = 0; i < l.n_groups; i++) {
    c->pool[i].lease = l.lease;
    c->pool[i].g = l.groups[i];
    memset(&l.groups[i], 0, sizeof l.groups[i]);
  }
  c->n_pool = l.n_groups;
  c->next = 0;
  lh_node_lease_clear(&l);
  return true;
}

/* The body of a group for its lease: the leased prompt, completions of max_new tokens taken
 * from the prompt (valid ids), behaviour log-probs -1, at `version`. */
static lh_err group_body(const lh_node_group *g, int64_t version, uint8_t **out, size_t *len) {
  int G = g->group_size, P = g->prompt_len, T = P + g->max_new;
  lh_rollout_batch b;
  memset(&b, 0, sizeof b);
  b.n_groups = 1;
  b.group_size = G;
  b.version = version;
  b.split = LH_SPLIT_TRAIN;
  b.seed = g->seed;
  b.stream_base = g->stream_base;
  b.sample = g->sample;
  b.max_new = g->max_new;
  uint64_t task = g->task;
  uint8_t ok = 1;
  b.task_index = &task;
  b.group_ok = &ok;
  b.seq_start = lh_xcalloc((size_t)G + 1, sizeof *b.seq_start);
  b.prompt_len = lh_xcalloc((size_t)G, sizeof *b.prompt_len);
  b.tokens = lh_xcalloc((size_t)G * T, sizeof *b.tokens);
  b.mu = lh_xcalloc((size_t)G * T, sizeof *b.mu);
  b.reward = lh_xcalloc((size_t)G, sizeof *b.reward);
  b.correct = lh_xcalloc((size_t)G, 1);
  b.well_formed = lh_xcalloc((size_t)G, 1);
  b.finish = lh_xcalloc((size_t)G, 1); /* LH_FINISH_LENGTH */
  for (int j = 0; j < G; j++) {
    b.seq_start[j + 1] = (j + 1) * T;
    b.prompt_len[j] = P;
    int32_t *t = b.tokens + (size_t)j * T;
    memcpy(t, g->prompt, (size_t)P * sizeof *t);
    for (int k = P; k < T; k++) {
      t[k] = g->prompt[(k + j) % P];
      b.mu[(size_t)j * T + k] = -1.0f;
    }
  }
  lh_err e = lh_rollout_encode(&b, out, len);
  b.task_index = NULL;
  b.group_ok = NULL;
  lh_rollout_batch_free(&b);
  return e;
}

typedef struct submission {
  client *c;
  lh_http_client *http;
  const char *path;
  const uint8_t *body;
  size_t len;
  long status;
  double due; /* open loop: when it was due (now_s); closed loop: 0 */
  double sent, done;
} submission;

static void *submit_one(void *ud) {
  submission *s = ud;
  lh_http_reply r;
  s->sent = now_s();
  s->status = request(s->c, s->http, "POST", s->path, s->body, s->len, &r);
  s->done = now_s();
  if (s->status) lh_http_reply_free(&r);
  return NULL;
}

/* One latency: lat from when it was due (open loop) or sent, svc from when it was sent. */
static void keep_latency(client *c, double at, double lat, double svc, long status) {
  if (c->n_lat >= LAT_MAX) return;
  c->lat_at[c->n_lat] = at;
  c->lat[c->n_lat] = lat;
  c->svc[c->n_lat] = svc;
  c->lat_st[c->n_lat++] = status;
}

static void record(client *c, const submission *s) {
  count(c->sub_status, s->status);
  if (s->status >= 400) atomic_fetch_add(&c->sh->refused, 1);
  if (s->status)
    keep_latency(c, s->done - c->sh->t0, s->done - (s->due > 0 ? s->due : s->sent),
                 s->done - s->sent, s->status);
}

static void accepted_push(client *c, int64_t group) {
  if (c->n_ids == c->ids_cap) {
    c->ids_cap = c->ids_cap ? 2 * c->ids_cap : 1024;
    c->ids = lh_xrealloc(c->ids, (size_t)c->ids_cap * sizeof *c->ids);
  }
  c->ids[c->n_ids++] = group;
}

/* Submits the next group of the pool (due at `due`, 0 in the closed loop); the first and then
 * every dup_every-th is sent twice at once (two connections), as a worker retrying while its
 * first try is still in flight. */
static void submit_next(client *c, double due) {
  shared *sh = c->sh;
  leased *l = &c->pool[c->next++];
  pthread_mutex_lock(&sh->mu);
  int64_t v = sh->version;
  pthread_mutex_unlock(&sh->mu);
  if (v < l->g.min_version) v = l->g.min_version;
  uint8_t *body = NULL;
  size_t len = 0;
  if (group_body(&l->g, v, &body, &len)) {
    snprintf(c->error, sizeof c->error, "encoding: %s", lh_last_error());
    return;
  }
  char path[128];
  snprintf(path, sizeof path, "/v1/rollouts?lease=%lld&group=%lld&gen_ms=0", (long long)l->lease,
           (long long)l->g.group);
  submission a = {c, c->http, path, body, len, 0, due, 0, 0}, b = a;
  b.http = c->dup_http;
  c->submitted++;
  bool dup = sh->o.dup_every > 0 && (c->submitted - 1) % sh->o.dup_every == 0; /* 1st, ... */
  pthread_t th;
  if (dup && pthread_create(&th, NULL, submit_one, &b)) dup = false;
  submit_one(&a);
  record(c, &a);
  if (dup) {
    pthread_join(th, NULL);
    record(c, &b);
  }
  if (a.status == 202 || (dup && b.status == 202)) {
    accepted_push(c, l->g.group);
    atomic_fetch_add(&sh->accepted, 1);
  }
  free(body);
}

static bool take_budget(shared *sh) {
  pthread_mutex_lock(&sh->mu);
  bool ok = !sh->stop && (sh->o.groups <= 0 || sh->budget > 0);
  if (ok && sh->o.groups > 0) sh->budget--;
  if (sh->o.groups > 0 && sh->budget <= 0) sh->stop = true;
  pthread_mutex_unlock(&sh->mu);
  return ok;
}

/* Open loop: the gap to a client's next submission (seconds), clients / rate on average. */
static double gap_s(client *c) {
  double mean = c->sh->o.clients / c->sh->o.rate;
  if (!c->sh->o.poisson) return mean;
  c->rng += 0x9e3779b97f4a7c15ull; /* splitmix64 */
  uint64_t z = c->rng;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  double u = ((double)(z >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
  return -mean * log(u);
}

/* Open loop: sleeps until t (now_s); false when the window ended first. */
static bool wait_until(shared *sh, double t) {
  for (;;) {
    if (stopped(sh)) return false;
    double d = t - now_s();
    if (d <= 0) return true;
    if (d > 0.05) d = 0.05; /* to see the end of the window */
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
  }
}

static void *client_main(void *ud) {
  client *c = ud;
  shared *sh = c->sh;
  bool open = sh->o.rate > 0;
  char name[64];
  int n = snprintf(name, sizeof name, "{\"name\":\"load-%d\"}", c->id);
  lh_http_reply r;
  long st = request(c, c->http, "POST", "/v1/workers", name, (size_t)n, &r);
  if (st) lh_http_reply_free(&r);
  bool ok = st == 200 || st == 201;
  if (!ok && !c->error[0]) snprintf(c->error, sizeof c->error, "register: HTTP %ld", st);
  /* open loop: the first lease before the window (not a late start), asked again while the
   * server refuses it (queue_full) for up to the window's length; else it is leased in it */
  for (double t = now_s(); ok && open && now_s() - t < sh->o.seconds && !lease(c);)
    sleep_ms(5);
  /* open loop: evenly spaced, client i at i / rate first; or Poisson from the start */
  c->rng = 0x853c49e6748fea9bull * (uint64_t)(c->id + 1);
  c->due = sh->o.poisson ? gap_s(c) : c->id / (open ? sh->o.rate : 1);
  pthread_mutex_lock(&sh->mu);
  sh->ready++;
  pthread_cond_broadcast(&sh->cv);
  while (!sh->go && !sh->stop)
    pthread_cond_wait(&sh->cv, &sh->mu);
  pthread_mutex_unlock(&sh->mu);
  while (ok && (!open || c->due < sh->o.seconds) && take_budget(sh)) {
    while (c->next == c->n_pool && !stopped(sh))
      if (!lease(c)) sleep_ms(5); /* queue_full / too_many_leases: the server's backpressure */
    if (c->next == c->n_pool) break;
    double due = open ? sh->t0 + c->due : 0;
    if (open && !wait_until(sh, due)) break;
    if (open) {
      c->offered++;
      c->due += gap_s(c);
    }
    submit_next(c, due);
  }
  /* open loop: what fell due in the window and was not sent counts with its wait so far */
  double end = now_s() - sh->t0;
  for (; open && ok && c->due < sh->o.seconds && c->due < end; c->due += gap_s(c)) {
    c->offered++;
    c->unsent++;
    keep_latency(c, end, end - c->due, 0, -1);
  }
  return NULL;
}

/* The newest published version, kept in sh->version by a long poll (bodies claim it). */
typedef struct poller {
  shared *sh;
  lh_http_client *http;
} poller;

static void *poll_main(void *ud) {
  poller *p = ud;
  shared *sh = p->sh;
  while (!stopped(sh)) {
    pthread_mutex_lock(&sh->mu);
    int64_t v = sh->version;
    pthread_mutex_unlock(&sh->mu);
    char path[96];
    snprintf(path, sizeof path, "/v1/policy?after=%lld&wait=0.5", (long long)v);
    lh_http_reply r;
    if (lh_http_client_request(p->http, "GET", path, NULL, 0, NULL, 0, REPLY_MAX, TIMEOUT_MS, &r)) {
      sleep_ms(50);
      continue;
    }
    json_t *o = r.status == 200 ? json_loadb((const char *)r.body, r.len, 0, NULL) : NULL;
    const json_t *jv = o ? json_object_get(o, "version") : NULL;
    if (json_is_integer(jv)) {
      pthread_mutex_lock(&sh->mu);
      if (json_integer_value(jv) > sh->version) sh->version = json_integer_value(jv);
      pthread_mutex_unlock(&sh->mu);
    }
    json_decref(o);
    lh_http_reply_free(&r);
  }
  return NULL;
}

/* serve's resident set (kB), or -1. */
static long rss_kb(long pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%ld/status", pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  fclose(f);
  return kb;
}

/* CPU seconds (user + system) a process has used so far, or -1. */
static double cpu_s(long pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  unsigned long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Bytes a process has caused to be written to storage so far (/proc/PID/io), or -1. */
static double io_written(long pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%ld/io", pid);
  FILE *f = fopen(path, "r");
  long long b = -1;
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "write_bytes: %lld", &b) == 1) break;
  fclose(f);
  return (double)b;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(const double *v, int n, double q) {
  if (n == 0) return 0;
  int i = (int)(q * (n - 1) + 0.5);
  return v[i];
}

/* One request to POST /v1/workers signed at time_ms with auth a (or a fresh signature when a is
 * NULL); its status, the error code in code. */
static long probe_send(lh_http_client *http, const lh_sync_secret_key *sk, const char *body,
                       int64_t time_ms, lh_node_auth_text *a, char *code, size_t cap) {
  lh_node_auth_text fresh;
  if (!a) {
    lh_node_sign(sk, "POST", "/v1/workers", body, strlen(body), time_ms, &fresh);
    a = &fresh;
  }
  lh_http_header h[4] = {{LH_NODE_HDR_KEY, a->key},
                         {LH_NODE_HDR_TIME, a->time},
                         {LH_NODE_HDR_NONCE, a->nonce},
                         {LH_NODE_HDR_SIGNATURE, a->signature}};
  lh_http_reply r;
  code[0] = 0;
  if (lh_http_client_request(http, "POST", "/v1/workers", h, 4, body, strlen(body), REPLY_MAX,
                             TIMEOUT_MS, &r))
    return 0;
  int64_t t;
  if (r.status >= 400) lh_node_error_parse(r.body, r.len, code, cap, &t);
  long st = r.status;
  lh_http_reply_free(&r);
  return st;
}

/* The replay defence over HTTP: the same signed request twice (the second is 409
 * replayed_nonce), and requests signed a window too early or too late (401 stale_time). */
static bool probe(const char *server) {
  lh_sync_secret_key sk;
  lh_http_client *http = NULL;
  if (lh_sync_keygen(&sk) || lh_http_client_create(server, &http)) {
    fprintf(stderr, "serve_load: probe: %s\n", lh_last_error());
    return false;
  }
  const char *body = "{\"name\":\"probe\"}";
  char code[64];
  lh_node_auth_text a;
  int64_t now = wall_ms();
  lh_node_sign(&sk, "POST", "/v1/workers", body, strlen(body), now, &a);
  long first = probe_send(http, &sk, body, now, &a, code, sizeof code);
  long again = probe_send(http, &sk, body, now, &a, code, sizeof code);
  bool ok = (first == 200 || first == 201) && again == 409 && !strcmp(code, "replayed_nonce");
  printf("probe: a request %ld, the same request again %ld %s\n", first, again, code);
  struct {
    const char *what;
    int64_t t;
  } stale[] = {{"signed a window and 5 s ago", now - LH_NODE_TIME_WINDOW_MS - 5000},
               {"signed a window and 5 s ahead", now + LH_NODE_TIME_WINDOW_MS + 5000}};
  for (int i = 0; i < 2; i++) {
    long st = probe_send(http, &sk, body, stale[i].t, NULL, code, sizeof code);
    ok = ok && st == 401 && !strcmp(code, "stale_time");
    printf("probe: a request %s: %ld %s\n", stale[i].what, st, code);
  }
  long st = probe_send(http, &sk, body, wall_ms(), NULL, code, sizeof code);
  ok = ok && st == 200;
  printf("probe: a new request signed now: %ld\n", st);
  lh_http_client_free(http);
  lh_sync_secret_key_wipe(&sk);
  return ok;
}

/* One interval's figures, sampled at its end. */
typedef struct interval {
  double t;                  /* its end, seconds since the window began */
  int64_t accepted, refused; /* totals at its end */
  double serve_cpu;          /* serve's CPU seconds at its end */
  long rss_kb;
} interval;

/* Prints each interval's figures and appends them to arr. */
static void print_intervals(const interval *iv, int n_iv, client *cs, int clients, json_t *arr) {
  printf("per interval:   from    to  accepted/s  refused  p50 ms  p99 ms  serve CPU us/group  "
         "serve RSS MB\n");
  for (int k = 1; k < n_iv; k++) {
    const interval *a = &iv[k - 1], *b = &iv[k];
    int64_t n = 0;
    for (int i = 0; i < clients; i++)
      for (int m = 0; m < cs[i].n_lat; m++)
        n += cs[i].lat_at[m] > a->t && cs[i].lat_at[m] <= b->t;
    double *l = lh_xmalloc((size_t)(n ? n : 1) * sizeof *l);
    int64_t at = 0;
    for (int i = 0; i < clients; i++)
      for (int m = 0; m < cs[i].n_lat; m++)
        if (cs[i].lat_at[m] > a->t && cs[i].lat_at[m] <= b->t) l[at++] = cs[i].lat[m];
    qsort(l, (size_t)n, sizeof *l, cmp_double);
    double dt = b->t - a->t, acc = (double)(b->accepted - a->accepted);
    double p50 = quantile(l, (int)n, 0.5) * 1e3, p99 = quantile(l, (int)n, 0.99) * 1e3;
    double cpu = acc > 0 && b->serve_cpu >= 0 ? (b->serve_cpu - a->serve_cpu) * 1e6 / acc : 0;
    printf("              %6.1f %6.1f %10.1f %8lld %7.2f %7.2f %19.0f %13.1f\n", a->t, b->t,
           acc / dt, (long long)(b->refused - a->refused), p50, p99, cpu, b->rss_kb / 1024.0);
    json_array_append_new(arr, json_pack("{s:f,s:f,s:f,s:I,s:f,s:f,s:f,s:I}", "from", a->t, "to",
                                         b->t, "accepted_per_s", acc / dt, "refused",
                                         (json_int_t)(b->refused - a->refused), "p50_ms", p50,
                                         "p99_ms", p99, "serve_cpu_us_per_group", cpu,
                                         "serve_rss_kb", (json_int_t)b->rss_kb));
    free(l);
  }
}

static int usage(void) {
  fprintf(stderr, "usage: serve_load --server http://HOST:PORT [--clients N] [--seconds S] "
                  "[--groups N] [--lease L] [--dup-every K] [--pid PID] [--json FILE] "
                  "[--ids FILE] [--interval S] [--rate R [--poisson]] [--trace FILE] [--probe]\n");
  return 2;
}

int main(int argc, char **argv) {
  shared sh;
  memset(&sh, 0, sizeof sh);
  opts *o = &sh.o;
  o->clients = 64;
  o->seconds = 10;
  o->lease = 32;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--probe") || !strcmp(a, "--poisson")) {
      if (!strcmp(a, "--probe"))
        o->probe = true;
      else
        o->poisson = true;
      continue;
    }
    if (!v) return usage();
    if (!strcmp(a, "--server"))
      o->server = v;
    else if (!strcmp(a, "--clients"))
      o->clients = atoi(v);
    else if (!strcmp(a, "--seconds"))
      o->seconds = atof(v);
    else if (!strcmp(a, "--groups"))
      o->groups = atoll(v);
    else if (!strcmp(a, "--lease"))
      o->lease = atoi(v);
    else if (!strcmp(a, "--dup-every"))
      o->dup_every = atoi(v);
    else if (!strcmp(a, "--pid"))
      o->pid = atol(v);
    else if (!strcmp(a, "--json"))
      o->json_path = v;
    else if (!strcmp(a, "--ids"))
      o->ids_path = v;
    else if (!strcmp(a, "--interval"))
      o->interval = atof(v);
    else if (!strcmp(a, "--rate"))
      o->rate = atof(v);
    else if (!strcmp(a, "--trace"))
      o->trace_path = v;
    else
      return usage();
    i++;
  }
  if (!o->server || o->clients < 1 || o->clients > 4096 || o->lease < 1 ||
      o->lease > LH_NODE_MAX_LEASE_GROUPS || !(o->seconds > 0) || o->groups < 0 ||
      o->dup_every < 0 || o->interval < 0 || !(o->rate >= 0 && o->rate <= 1e6) ||
      (o->poisson && o->rate == 0) || (o->interval > 0 && o->seconds / o->interval > IV_MAX - 2))
    return usage();
  if (o->probe && !probe(o->server)) {
    fprintf(stderr, "serve_load: the replay probe did not get the answers expected\n");
    return 1;
  }
  sh.budget = o->groups;
  pthread_mutex_init(&sh.mu, NULL);
  pthread_cond_init(&sh.cv, NULL);
  client *cs = lh_xcalloc((size_t)o->clients, sizeof *cs);
  pthread_t *th = lh_xcalloc((size_t)o->clients, sizeof *th);
  for (int i = 0; i < o->clients; i++) {
    client *c = &cs[i];
    c->sh = &sh;
    c->id = i;
    c->lat = lh_xmalloc((size_t)LAT_MAX * sizeof *c->lat);
    c->svc = lh_xmalloc((size_t)LAT_MAX * sizeof *c->svc);
    c->lat_at = lh_xmalloc((size_t)LAT_MAX * sizeof *c->lat_at);
    c->lat_st = lh_xmalloc((size_t)LAT_MAX * sizeof *c->lat_st);
    if (lh_sync_keygen(&c->sk) || lh_http_client_create(o->server, &c->http) ||
        lh_http_client_create(o->server, &c->dup_http)) {
      fprintf(stderr, "serve_load: %s\n", lh_last_error());
      return 1;
    }
  }
  poller pl = {&sh, NULL};
  if (lh_http_client_create(o->server, &pl.http)) {
    fprintf(stderr, "serve_load: %s\n", lh_last_error());
    return 1;
  }
  pthread_t poll_th;
  pthread_create(&poll_th, NULL, poll_main, &pl);
  for (int i = 0; i < o->clients; i++)
    pthread_create(&th[i], NULL, client_main, &cs[i]);
  /* the window starts once every client has registered (or failed to) */
  pthread_mutex_lock(&sh.mu);
  while (sh.ready < o->clients)
    pthread_cond_wait(&sh.cv, &sh.mu);
  sh.go = true;
  sh.t0 = now_s();
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  double t0_wall = (double)rt.tv_sec + rt.tv_nsec * 1e-9;
  double serve_cpu0 = o->pid > 0 ? cpu_s(o->pid) : -1, own_cpu0 = cpu_s((long)getpid());
  double io0 = o->pid > 0 ? io_written(o->pid) : -1;
  pthread_cond_broadcast(&sh.cv);
  pthread_mutex_unlock(&sh.mu);
  static long rss[RSS_MAX];
  static interval iv[IV_MAX];
  int n_rss = 0, n_iv = 0;
  iv[n_iv++] = (interval){0, 0, 0, serve_cpu0, o->pid > 0 ? rss_kb(o->pid) : -1};
  while (!stopped(&sh) && now_s() - sh.t0 < o->seconds) {
    if (o->pid > 0 && n_rss < RSS_MAX) rss[n_rss++] = rss_kb(o->pid);
    double t = now_s() - sh.t0;
    if (o->interval > 0 && t >= n_iv * o->interval && n_iv < IV_MAX)
      iv[n_iv++] = (interval){t, atomic_load(&sh.accepted), atomic_load(&sh.refused),
                              o->pid > 0 ? cpu_s(o->pid) : -1, n_rss ? rss[n_rss - 1] : -1};
    sleep_ms(100);
  }
  pthread_mutex_lock(&sh.mu);
  sh.stop = true;
  pthread_mutex_unlock(&sh.mu);
  for (int i = 0; i < o->clients; i++)
    pthread_join(th[i], NULL);
  sh.t1 = now_s();
  double serve_cpu = o->pid > 0 ? cpu_s(o->pid) - serve_cpu0 : -1,
         own_cpu = cpu_s((long)getpid()) - own_cpu0;
  double io = o->pid > 0 && io0 >= 0 ? io_written(o->pid) - io0 : -1;
  pthread_join(poll_th, NULL);
  if (o->pid > 0 && n_rss < RSS_MAX) rss[n_rss++] = rss_kb(o->pid);
  if (o->interval > 0 && n_iv < IV_MAX && sh.t1 - sh.t0 > iv[n_iv - 1].t + 0.5 * o->interval)
    iv[n_iv++] = (interval){sh.t1 - sh.t0, atomic_load(&sh.accepted), atomic_load(&sh.refused),
                            o->pid > 0 ? serve_cpu + serve_cpu0 : -1, n_rss ? rss[n_rss - 1] : -1};

  /* the figures */
  int64_t sub[600] = {0}, lea[600] = {0}, n_lat = 0, accepted = 0, attempts = 0;
  int64_t offered = 0, unsent = 0;
  for (int i = 0; i < o->clients; i++) {
    for (int k = 0; k < 600; k++)
      sub[k] += cs[i].sub_status[k], lea[k] += cs[i].lease_status[k];
    n_lat += cs[i].n_lat;
    accepted += cs[i].n_ids;
    offered += cs[i].offered;
    unsent += cs[i].unsent;
    if (cs[i].error[0]) fprintf(stderr, "serve_load: client %d: %s\n", i, cs[i].error);
  }
  double *lat = lh_xmalloc((size_t)(n_lat ? n_lat : 1) * sizeof *lat);
  double *svc = lh_xmalloc((size_t)(n_lat ? n_lat : 1) * sizeof *svc);
  int64_t at = 0, n_svc = 0;
  for (int i = 0; i < o->clients; i++) {
    memcpy(lat + at, cs[i].lat, (size_t)cs[i].n_lat * sizeof *lat);
    at += cs[i].n_lat;
    for (int k = 0; k < cs[i].n_lat; k++)
      if (cs[i].lat_st[k] >= 0) svc[n_svc++] = cs[i].svc[k]; /* sent ones */
  }
  qsort(lat, (size_t)n_lat, sizeof *lat, cmp_double);
  qsort(svc, (size_t)n_svc, sizeof *svc, cmp_double);
  for (int k = 0; k < 600; k++)
    attempts += sub[k];
  double wall = sh.t1 - sh.t0;
  double p50 = quantile(lat, (int)n_lat, 0.50) * 1e3, p99 = quantile(lat, (int)n_lat, 0.99) * 1e3,
         mx = n_lat ? lat[n_lat - 1] * 1e3 : 0;
  long rss_first = -1, rss_peak = -1, rss_last = -1;
  for (int i = 0; i < n_rss; i++) {
    if (rss[i] < 0) continue;
    if (rss_first < 0 && (double)i * 0.1 >= 1.0) rss_first = rss[i]; /* after a 1 s warm-up */
    if (rss[i] > rss_peak) rss_peak = rss[i];
    rss_last = rss[i];
  }
  printf("clients %d, %.2f s, %lld submissions (%lld answered 202; %lld distinct groups "
         "accepted)\n",
         o->clients, wall, (long long)attempts, (long long)sub[202], (long long)accepted);
  double s50 = quantile(svc, (int)n_svc, 0.50) * 1e3, s99 = quantile(svc, (int)n_svc, 0.99) * 1e3;
  if (o->rate > 0)
    printf("open loop: %.0f groups/s offered (%s timetable per client), %lld due in %.0f s: "
           "%.1f/s; %lld not sent when the window ended (counted with their wait so far)\n",
           o->rate, o->poisson ? "Poisson" : "evenly spaced", (long long)offered, o->seconds,
           (double)offered / o->seconds, (long long)unsent);
  printf("%-28s %10.1f\n", "accepted groups/s", (double)accepted / wall);
  printf("%-28s %10.2f %10.2f %10.2f%s\n", "POST /v1/rollouts ms p50 p99 max", p50, p99, mx,
         o->rate > 0 ? "  (from the time each was due)" : "");
  if (o->rate > 0)
    printf("%-28s %10.2f %10.2f             (from its sending: the service time)\n", "", s50, s99);
  printf("answers to POST /v1/rollouts:");
  for (int k = 0; k < 600; k++)
    if (sub[k]) printf(" %s%d: %lld", k ? "" : "transport ", k, (long long)sub[k]);
  printf("\nanswers to POST /v1/leases:");
  for (int k = 0; k < 600; k++)
    if (lea[k]) printf(" %s%d: %lld", k ? "" : "transport ", k, (long long)lea[k]);
  printf("\n");
  double per = accepted > 0 ? 1e6 / (double)accepted : 0;
  if (o->pid > 0)
    printf("CPU us per accepted group: serve %.0f, this generator %.0f (%.2f and %.2f cores)\n",
           serve_cpu * per, own_cpu * per, serve_cpu / wall, own_cpu / wall);
  else
    printf("CPU us per accepted group: this generator %.0f (%.2f cores)\n", own_cpu * per,
           own_cpu / wall);
  if (o->pid > 0)
    printf("serve RSS MB: after 1 s %.1f, peak %.1f, at the end %.1f (%d samples)\n",
           rss_first / 1024.0, rss_peak / 1024.0, rss_last / 1024.0, n_rss);
  if (io >= 0 && accepted > 0)
    printf("serve wrote %.1f kB to storage per accepted group (the ledger's WAL and checkpoints, "
           "the run's checkpoints)\n",
           io / 1024.0 / (double)accepted);
  json_t *ivs = json_array();
  if (o->interval > 0) print_intervals(iv, n_iv, cs, o->clients, ivs);
  if (o->json_path) {
    json_t *subj = json_object(), *leaj = json_object();
    for (int k = 0; k < 600; k++) {
      char key[8];
      snprintf(key, sizeof key, "%d", k);
      if (sub[k]) json_object_set_new(subj, key, json_integer(sub[k]));
      if (lea[k]) json_object_set_new(leaj, key, json_integer(lea[k]));
    }
    json_t *j = json_pack("{s:i,s:f,s:I,s:I,s:f,s:f,s:f,s:f,s:o,s:o,s:I,s:I,s:I}", "clients",
                          o->clients, "wall_s", wall, "submissions", (json_int_t)attempts,
                          "accepted", (json_int_t)accepted, "accepted_per_s",
                          (double)accepted / wall, "p50_ms", p50, "p99_ms", p99, "max_ms", mx,
                          "rollouts", subj, "leases", leaj, "rss_first_kb", (json_int_t)rss_first,
                          "rss_peak_kb", (json_int_t)rss_peak, "rss_last_kb", (json_int_t)rss_last);
    if (j) json_object_set(j, "intervals", ivs);
    json_t *open = o->rate > 0
                       ? json_pack("{s:f,s:s,s:I,s:f,s:I,s:f,s:f}", "rate", o->rate, "timetable",
                                   o->poisson ? "poisson" : "even", "offered", (json_int_t)offered,
                                   "offered_per_s", (double)offered / o->seconds, "unsent",
                                   (json_int_t)unsent, "service_p50_ms", s50, "service_p99_ms", s99)
                       : NULL;
    if (j && open) json_object_update(j, open);
    json_decref(open);
    if (!j || json_dump_file(j, o->json_path, JSON_COMPACT)) {
      fprintf(stderr, "serve_load: cannot write %s\n", o->json_path);
      return 1;
    }
    json_decref(j);
  }
  if (o->trace_path) {
    FILE *f = fopen(o->trace_path, "w");
    if (!f) {
      fprintf(stderr, "serve_load: cannot write %s\n", o->trace_path);
      return 1;
    }
    fprintf(f,
            "# window began at %.6f (CLOCK_REALTIME, s); per submission: answered at (s "
            "into the window), latency ms, service ms, status (-1: not sent)\n",
            t0_wall);
    for (int i = 0; i < o->clients; i++)
      for (int k = 0; k < cs[i].n_lat; k++)
        fprintf(f, "%.6f %.3f %.3f %ld\n", cs[i].lat_at[k], cs[i].lat[k] * 1e3, cs[i].svc[k] * 1e3,
                cs[i].lat_st[k]);
    fclose(f);
  }
  if (o->ids_path) {
    FILE *f = fopen(o->ids_path, "w");
    if (!f) {
      fprintf(stderr, "serve_load: cannot write %s\n", o->ids_path);
      return 1;
    }
    for (int i = 0; i < o->clients; i++)
      for (int k = 0; k < cs[i].n_ids; k++)
        fprintf(f, "%lld\n", (long long)cs[i].ids[k]);
    fclose(f);
  }
  for (int i = 0; i < o->clients; i++) {
    client *c = &cs[i];
    for (int k = 0; k < c->n_pool; k++)
      lh_node_group_clear(&c->pool[k].g);
    free(c->pool);
    free(c->lat);
    free(c->svc);
    free(c->lat_at);
    free(c->lat_st);
    free(c->ids);
    lh_http_client_free(c->http);
    lh_http_client_free(c->dup_http);
    lh_sync_secret_key_wipe(&c->sk);
  }
  lh_http_client_free(pl.http);
  json_decref(ivs);
  free(lat);
  free(svc);
  free(cs);
  free(th);
  return 0;
}
