/* longhaul node: the networked system (docs/PROTOCOL.md, "The networked protocol"). `serve` is
 * the trainer and coordinator in one process: an HTTP API (http.h), the ledger (ledger.h), and
 * one training thread that owns the trainer (trainer.h); `worker` syncs the policy (sync.h),
 * leases prompt groups, generates them (rollout.h) and submits them. This header has both
 * drivers and the protocol's codecs, which both sides share: signed requests and the bodies of
 * leases. Every codec that reads outside bytes returns an lh_err naming `what` and the field,
 * checks every length and count before allocating, and never aborts (fuzz targets fuzz_auth,
 * fuzz_lease_request, fuzz_lease_reply).
 *
 * Ownership: structs filled by a parser own their arrays; the matching _clear frees them and
 * accepts a zeroed struct. Thread safety: the codecs keep no state. */
#ifndef LONGHAUL_NODE_H
#define LONGHAUL_NODE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/http.h"
#include "longhaul/rl.h"
#include "longhaul/sample.h"
#include "longhaul/sync.h"
#include "longhaul/trust.h"

/* ---------------------------------------------------------------- signed requests */
#define LH_NODE_SIGNING_CONTEXT "longhaul-request-v1\n"
#define LH_NODE_NONCE_BYTES     16
#define LH_NODE_TIME_WINDOW_MS  60000 /* a request's time may differ from the server's by this */
/* The four headers of a signed request. */
#define LH_NODE_HDR_KEY       "X-Longhaul-Key"
#define LH_NODE_HDR_TIME      "X-Longhaul-Time"
#define LH_NODE_HDR_NONCE     "X-Longhaul-Nonce"
#define LH_NODE_HDR_SIGNATURE "X-Longhaul-Signature"

typedef struct lh_node_auth {
  lh_sync_public_key key;
  int64_t time_ms; /* the signer's clock, Unix milliseconds */
  uint8_t nonce[LH_NODE_NONCE_BYTES];
  uint8_t signature[LH_SYNC_SIGNATURE_BYTES];
} lh_node_auth;

/* The header values of a signed request, each NUL-terminated. */
typedef struct lh_node_auth_text {
  char key[2 * LH_SYNC_PUBLIC_KEY_BYTES + 1];
  char time[24];
  char nonce[2 * LH_NODE_NONCE_BYTES + 1];
  char signature[2 * LH_SYNC_SIGNATURE_BYTES + 1];
} lh_node_auth_text;

/* Signs a request: the bytes signed are LH_NODE_SIGNING_CONTEXT, then METHOD, PATH (with its
 * query), the lowercase hex BLAKE2b-256 of the body, the key in hex, the time in decimal and the
 * nonce in hex, each followed by "\n". A fresh random nonce is drawn. */
void lh_node_sign(const lh_sync_secret_key *sk, const char *method, const char *path,
                  const void *body, size_t len, int64_t time_ms, lh_node_auth_text *out);
/* A signed request: signs METHOD PATH (with its query) and the body with sk at time_ms
 * (lh_node_sign) and sends it on c with the four headers and Content-Type
 * application/octet-stream; otherwise as lh_http_client_request (any HTTP status is LH_ERR_OK). */
lh_err lh_node_request(lh_http_client *c, const lh_sync_secret_key *sk, const char *method,
                       const char *path, const void *body, size_t len, int64_t time_ms,
                       size_t max_reply, long timeout_ms, lh_http_reply *out);
/* Parses the four header values (any may be NULL: missing) into *a: LH_ERR_FORMAT naming the
 * header that is missing or malformed (hex of the wrong length or case, a time that is not a
 * decimal integer in [0, 2^53)). */
lh_err lh_node_auth_parse(const char *key, const char *time, const char *nonce,
                          const char *signature, lh_node_auth *a);
/* Whether a's signature covers this request (LH_ERR_SIGNATURE otherwise). */
lh_err lh_node_auth_verify(const lh_node_auth *a, const char *method, const char *path,
                           const void *body, size_t len);

/* ---------------------------------------------------------------- leases */
#define LH_NODE_MAX_LEASE_GROUPS  64    /* groups one lease request may ask for */
#define LH_NODE_MAX_PROMPT        16384 /* prompt tokens of one group at most */
#define LH_NODE_LEASE_REQUEST_MAX 4096  /* bytes of a lease request body at most */
#define LH_NODE_REGISTER_MAX      65536 /* bytes of a registration body at most */
#define LH_NODE_ERROR_MAX         65536 /* bytes of an error reply the worker reads at most */
#define LH_NODE_LEASE_REPLY_MAX   (8u << 20)

/* What a worker asks for: POST /v1/leases {"groups": N, "version": V}. */
typedef struct lh_node_lease_request {
  int groups;      /* 1 .. LH_NODE_MAX_LEASE_GROUPS */
  int64_t version; /* the version the worker holds, or -1 (none yet) */
} lh_node_lease_request;
lh_err lh_node_lease_request_parse(const void *body, size_t len, lh_node_lease_request *out);

/* One leased group: everything a worker needs to generate it, chosen by the server. */
typedef struct lh_node_group {
  int64_t group;        /* the group's id in the ledger */
  uint64_t task;        /* task index in the train split */
  int32_t *prompt;      /* (prompt_len) token ids */
  int prompt_len;       /* 1 .. LH_NODE_MAX_PROMPT */
  int group_size;       /* completions, 1 .. 4096 */
  uint64_t seed;        /* sampler seed, < 2^53 */
  uint64_t stream_base; /* stream of completion 0, < 2^53 */
  int max_new;          /* completion tokens at most, >= 1 */
  lh_sample_params sample;
  int64_t min_version; /* generate with this version or a newer one */
} lh_node_group;

typedef struct lh_node_lease {
  int64_t lease;
  int64_t expires_ms; /* Unix milliseconds (the server's clock) */
  int n_groups;
  lh_node_group *groups; /* (n_groups) */
} lh_node_lease;

/* A registration body (POST /v1/workers): {"name": STRING, "hardware": OBJECT}, both optional,
 * no other field, at most LH_NODE_REGISTER_MAX bytes. *name is malloc'd ("" when absent; a name
 * holding a NUL is refused), *hardware_json the object re-encoded compactly (malloc'd, NULL when
 * absent). LH_ERR_FORMAT (LH_ERR_LIMIT) saying what is wrong; both NULL then. */
lh_err lh_node_register_parse(const void *body, size_t len, char **name, char **hardware_json);
/* What a worker reads from an error reply of the server: {"error": {"code": STRING, ...},
 * "server_time_ms": INTEGER}. code gets the code (cut to cap - 1 bytes; "" when there is none),
 * *server_time_ms the server's clock (-1 when absent or negative). Never fails: any other bytes,
 * or more than LH_NODE_ERROR_MAX of them, give "" and -1. */
void lh_node_error_parse(const void *body, size_t len, char *code, size_t cap,
                         int64_t *server_time_ms);

/* The JSON of one group (a new object) and of a whole lease reply (malloc'd text). */
struct json_t *lh_node_group_json(const lh_node_group *g);
char *lh_node_lease_json(const lh_node_lease *l, size_t *len);
/* Parses a group object (the ledger keeps each group's JSON) or a lease reply; vocab bounds
 * the token ids. */
lh_err lh_node_group_parse(const void *text, size_t len, int vocab, const char *what,
                           lh_node_group *out);
lh_err lh_node_lease_parse(const void *text, size_t len, int vocab, lh_node_lease *out);
void lh_node_group_clear(lh_node_group *g);
void lh_node_lease_clear(lh_node_lease *l);

/* ---------------------------------------------------------------- serve */
typedef struct lh_serve_progress {
  int64_t version, steps;
  double elapsed_s;
  double reward, accuracy; /* of the groups of the last update */
  int64_t groups_accepted, groups_rejected, groups_trained, groups_dropped;
  double groups_per_s;    /* trained, since the start */
  double staleness_mean;  /* of the last update's groups */
  uint64_t bytes_shipped; /* blob bytes served */
  int workers;
  double busy;          /* fraction of wall time the training thread spent training */
  int64_t heldout_step; /* the version of the latest --eval-every evaluation, -1: none yet */
  double heldout;       /* its greedy pass@1 */
} lh_serve_progress;

typedef struct lh_serve_config {
  lh_rl_run_config rl;    /* model, run directory, environment, training settings; staleness is
                           * the staleness bound (--max-staleness); resume, stop, argv as rl */
  const char *key_path;   /* the trainer's Ed25519 secret key */
  const char *listen;     /* HOST:PORT (loopback by default; port 0: a free one) */
  const char *port_file;  /* when set, the bound port is written there (atomically) */
  int keyframe_every;     /* a snapshot every K versions (and when a chain costs more) */
  int lease_ms;           /* a lease expires after this */
  double max_wall_s;      /* stop after this long (0: at --steps only) */
  double linger_s;        /* after the last update, keep serving this long (workers still
                           * fetching the last version); a stop signal ends it */
  bool sync_mode;         /* --sync: leases only for the current version's update */
  lh_trust_config trust;  /* verification tolerances (its stop ids are the model's eos ids, set
                           * by serve) */
  bool no_verify;         /* testing only (--no-verify): train on groups without checking them */
  int ban_after;          /* a key with this many rejections of its own among its latest
                           * ban_window submitted groups gets 403 banned; 0: never */
  int ban_window;         /* (>= 1) the reputation window, in submitted groups (default 256) */
  int abandon_after;      /* a key with at least this many expired groups among its latest
                           * abandon_window settled ones, and more than half of them, gets no
                           * new leases (403 abandoning); 0: never */
  int abandon_window;     /* (>= 1) in settled groups: submitted or expired (default 64) */
  double rate_limit;      /* signed requests per second per key (bursts of 4 s worth, at least 8);
                           * 0: off */
  const char *allow_keys; /* a file of public-key lines: only these keys are served; NULL: any */
  double kept_max_mb;     /* the bf16 weights of past versions (kept for the staleness window)
                           * take at most this many MB (1e6 bytes); the staleness bound is
                           * lowered to fit (lh_serve_staleness_bound) */
  void (*progress)(const lh_serve_progress *p, void *ud);
  void *progress_ud;
} lh_serve_config;

/* Parses an allowlist of worker keys (serve --allow-keys): one public-key line per line
 * (docs/PROTOCOL.md, "Keys"), blank lines and lines starting with '#' ignored, at most
 * LH_NODE_ALLOW_MAX keys; anything else is LH_ERR_FORMAT (LH_ERR_LIMIT) naming `what` and the
 * line. *keys is malloc'd (NULL when none). */
#define LH_NODE_ALLOW_MAX 65536
lh_err lh_node_allowlist_parse(const void *text, size_t len, const char *what,
                               lh_sync_public_key **keys, int *n);

/* The staleness bound serve applies: the bound asked for (max_staleness, versions), lowered so
 * that the bf16 weights of the max_staleness + 1 newest versions (n_params values of 2 bytes
 * each), which the server keeps to recompute and verify every group under the version that
 * generated it, fit in kept_max_mb MB. -1 when not even the newest version fits. */
int lh_serve_staleness_bound(int max_staleness, size_t n_params, double kept_max_mb);

/* The lease window: how many groups may be queued at the server or leased and unanswered at
 * once (beyond it, a lease request is answered 503 queue_full). What keeps the trainer fed and
 * no more: two updates' worth queued (LH_SERVE_QUEUE_UPDATES), and what the trainer consumes
 * while a lease is out (lease_s: the mean time from a lease to its group's arrival; update_s:
 * the training thread's mean time per update), so prompts x (2 + ceil(lease_s / update_s)),
 * between 2 and LH_SERVE_WINDOW_UPDATES updates' worth; prompts x 4 until both are measured
 * (either <= 0). It does not depend on the staleness bound: a larger bound accepts older groups
 * but leases no more of them. */
#define LH_SERVE_WINDOW_UPDATES 32
/* A lease request is also refused while this many updates' worth of groups wait in the queue. */
#define LH_SERVE_QUEUE_UPDATES 2
int64_t lh_serve_lease_window(int prompts, double lease_s, double update_s);

/* Whether serve refuses a lease (503 queue_full) with q_len groups queued and out leased and
 * unanswered: LH_SERVE_QUEUE_UPDATES updates' worth queued (the next update and the one after
 * it: a lease given now brings its groups a lease's time later, so the queue must not run dry
 * meanwhile), or the queued and the leased reaching the lease window. */
bool lh_serve_lease_full(int64_t q_len, int64_t out, int prompts, double lease_s, double update_s);

lh_serve_config lh_serve_defaults(void);
/* Runs the server until rl.steps updates, max_wall_s, or *rl.stop; errors name the file or
 * setting. */
lh_err lh_serve_run(const lh_serve_config *c);

/* ---------------------------------------------------------------- worker */
/* A worker that cheats, for testing the server's defences (`worker --adversary MODE`,
 * docs/SECURITY.md has what each does and what catches it). */
typedef enum {
  LH_ADV_NONE = 0,
  LH_ADV_OTHER_MODEL, /* generates with other weights of the same shape (every weight moved) */
  LH_ADV_QUANT4,      /* with the weights rounded to 4 bits (blocks of 32, absmax scale) */
  LH_ADV_QUANT8,      /* to 8 bits */
  LH_ADV_PROMPT,      /* changes a prompt token */
  LH_ADV_TOKENS,      /* changes one completion token of one member */
  LH_ADV_TEMPERATURE, /* samples at temperature 0.9 where 1.0 was leased */
  LH_ADV_TOP_P,       /* samples with top-p 0.95 where 1.0 was leased */
  LH_ADV_BEST_OF_N,   /* generates 4 groups with other seeds, submits the most likely one */
  LH_ADV_DROP_MEMBER, /* leaves the last member out */
  LH_ADV_DUP_MEMBER,  /* the last member a copy of the first */
  LH_ADV_LOGPROBS,    /* reports behaviour log-probs 0.1 higher */
  LH_ADV_REWARD,      /* claims reward 1 and correct for every member */
  LH_ADV_REPLAY,      /* submits its first group's body again for every later group */
  LH_ADV_VERSION,     /* claims the version after the one it generated with */
  LH_ADV_GARBAGE,     /* submits random bytes */
  LH_ADV_OVERSIZED,   /* submits a body larger than the server takes */
  LH_ADV_SLOWLORIS,   /* also holds connections open, trickling a request a byte at a time */
  LH_ADV_SELECTIVE,   /* generates honestly, submits only the most likely of every 4 groups and
                       * abandons the others (their leases expire) */
  LH_ADV_TRUNCATE,    /* cuts every completion to half its length, without a stop token */
  LH_ADV__COUNT
} lh_node_adversary;
/* "none", "other-model", "quant4", ... in the order above, NULL-terminated. */
extern const char *const lh_node_adversary_names[];

typedef struct lh_worker_config {
  const char *server;     /* http://HOST:PORT */
  const char *key_path;   /* the worker's Ed25519 secret key (created when missing) */
  const char *trust_path; /* the trainer's public key: every manifest must be signed by it */
  const char *dir;        /* the worker's own directory: blobs, policy, unsent groups */
  const char *name;       /* shown in the server's status */
  int threads, slots;
  int64_t max_groups; /* stop after submitting this many (0: never) */
  volatile sig_atomic_t *stop;
  lh_node_adversary adversary; /* testing only: cheat this way (docs/SECURITY.md) */
} lh_worker_config;

#define LH_WORKER_RTT_BUCKETS 64 /* quarter octaves of milliseconds: up to 2^16 ms */
typedef struct lh_worker_result {
  int64_t groups_submitted, groups_refused;
  int64_t versions_applied;
  uint64_t bytes_downloaded;
  /* policy syncs: how many, the versions they advanced, their seconds (from the manifests known
   * to the version staged), the versions newer than the one staged that were known as each
   * ended (how far behind the worker stayed), and the snapshots they fetched */
  int64_t syncs, sync_versions, sync_behind, snapshots_fetched;
  double sync_s;
  /* round trips of the submissions the server answered for good (202 or a refusal): bucket k
   * counts those of [2^(k/4) - 1, 2^((k+1)/4) - 1) ms, the last one the rest */
  int64_t submit_rtt[LH_WORKER_RTT_BUCKETS];
} lh_worker_result;

/* The q-quantile (0 .. 1) of r's submission round trips in ms, the upper edge of its bucket
 * (within 19%); -1 when there were none. */
double lh_worker_rtt_quantile(const lh_worker_result *r, double q);

lh_worker_config lh_worker_defaults(void);
lh_err lh_worker_run(const lh_worker_config *c, lh_worker_result *res);

#endif
