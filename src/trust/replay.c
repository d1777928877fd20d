/* Replayed requests (trust.h): a fixed table of the (key, nonce) pairs of signed requests with
 * their signed times, in buckets of REPLAY_WAYS entries, and per bucket a floor: the latest
 * signed time of an entry it forgot. A full bucket forgets its oldest entry and raises its floor
 * to that entry's time, so a request signed at or before the floor is refused (the sender signs
 * it again with the current time) and nothing forgotten can pass again. Memory is fixed at
 * create; striped locks, four cache lines read per call. */
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/trust.h"

#define REPLAY_WAYS    16 /* entries of a bucket (four cache lines) */
#define REPLAY_STRIPES 64 /* locks; bucket b is behind lock b % REPLAY_STRIPES */
#define REPLAY_NONCE   64 /* bytes of a nonce at most */
#define EMPTY          INT64_MIN

typedef struct entry {
  uint64_t tag; /* SipHash of key and nonce (its other half chose the bucket) */
  int64_t t;    /* the signed time, Unix ms; EMPTY when free */
} entry;

struct lh_trust_replay {
  int64_t window_ms;
  uint64_t n_buckets;
  entry *e;       /* (n_buckets, REPLAY_WAYS) */
  int64_t *floor; /* (n_buckets) the latest time forgotten; EMPTY when none */
  uint8_t hash_key[crypto_shorthash_siphashx24_KEYBYTES];
  pthread_mutex_t mu[REPLAY_STRIPES];
  atomic_llong counts[LH_REPLAY__COUNT]; /* verdicts given */
  atomic_llong forgot_live;              /* entries forgotten while within the window */
};

lh_trust_replay *lh_trust_replay_create(int64_t window_ms, int64_t slots) {
  if (window_ms < 1 || slots < REPLAY_WAYS || slots > ((int64_t)1 << 32) ||
      (slots & (slots - 1)) != 0)
    lh__fatal(__FILE__, __LINE__, "lh_trust_replay_create",
              "window %lld ms, %lld slots: need a window >= 1 and a power of two of slots, %d .. "
              "2^32",
              (long long)window_ms, (long long)slots, REPLAY_WAYS);
  lh_trust_replay *r = lh_xcalloc(1, sizeof *r);
  r->window_ms = window_ms;
  r->n_buckets = (uint64_t)slots / REPLAY_WAYS;
  r->e = lh_xmalloc((size_t)slots * sizeof *r->e);
  r->floor = lh_xmalloc((size_t)r->n_buckets * sizeof *r->floor);
  for (int64_t i = 0; i < slots; i++)
    r->e[i] = (entry){0, EMPTY};
  for (uint64_t b = 0; b < r->n_buckets; b++)
    r->floor[b] = EMPTY;
  randombytes_buf(r->hash_key, sizeof r->hash_key); /* so no one can aim at one bucket */
  for (int i = 0; i < REPLAY_STRIPES; i++)
    pthread_mutex_init(&r->mu[i], NULL);
  return r;
}

void lh_trust_replay_free(lh_trust_replay *r) {
  if (!r) return;
  for (int i = 0; i < REPLAY_STRIPES; i++)
    pthread_mutex_destroy(&r->mu[i]);
  free(r->e);
  free(r->floor);
  free(r);
}

static void tally(lh_trust_replay *r, lh_trust_replay_verdict v, bool forgot_live) {
  atomic_fetch_add_explicit(&r->counts[v], 1, memory_order_relaxed);
  if (forgot_live) atomic_fetch_add_explicit(&r->forgot_live, 1, memory_order_relaxed);
}

lh_trust_replay_verdict lh_trust_replay_check(lh_trust_replay *r, const uint8_t key[32],
                                              const uint8_t *nonce, size_t nonce_len,
                                              int64_t time_ms, int64_t now_ms) {
  if (nonce_len > REPLAY_NONCE)
    lh__fatal(__FILE__, __LINE__, "lh_trust_replay_check", "a nonce of %zu bytes, at most %d",
              nonce_len, REPLAY_NONCE);
  if (time_ms < now_ms - r->window_ms || time_ms > now_ms + r->window_ms) {
    tally(r, LH_REPLAY_STALE, false);
    return LH_REPLAY_STALE;
  }
  uint8_t in[32 + REPLAY_NONCE], h[crypto_shorthash_siphashx24_BYTES];
  memcpy(in, key, 32);
  memcpy(in + 32, nonce, nonce_len);
  crypto_shorthash_siphashx24(h, in, 32 + nonce_len, r->hash_key);
  uint64_t tag, pick;
  memcpy(&tag, h, sizeof tag);
  memcpy(&pick, h + sizeof tag, sizeof pick);
  uint64_t b = pick % r->n_buckets;
  entry *e = r->e + b * REPLAY_WAYS;
  lh_trust_replay_verdict v = LH_REPLAY_FRESH;
  bool forgot_live = false;
  pthread_mutex_t *mu = &r->mu[b % REPLAY_STRIPES];
  pthread_mutex_lock(mu);
  int oldest = 0;
  for (int i = 0; i < REPLAY_WAYS && v == LH_REPLAY_FRESH; i++) {
    if (e[i].t != EMPTY && e[i].tag == tag) v = LH_REPLAY_SEEN;
    if (e[i].t < e[oldest].t) oldest = i;
  }
  if (v == LH_REPLAY_FRESH && time_ms <= r->floor[b]) v = LH_REPLAY_FORGOTTEN;
  if (v == LH_REPLAY_FRESH) {
    /* remembered in a free entry, else in place of the oldest, whose time becomes the floor;
     * older than every entry, it is forgotten at once itself (the floor is its time) */
    int64_t gone = e[oldest].t < time_ms ? e[oldest].t : time_ms;
    if (gone > r->floor[b]) r->floor[b] = gone;
    forgot_live = gone != EMPTY && gone >= now_ms - r->window_ms;
    if (e[oldest].t < time_ms) e[oldest] = (entry){tag, time_ms};
  }
  pthread_mutex_unlock(mu);
  tally(r, v, forgot_live);
  return v;
}

void lh_trust_replay_stats(lh_trust_replay *r, int64_t counts[LH_REPLAY__COUNT],
                           int64_t *forgot_live) {
  for (int i = 0; i < LH_REPLAY__COUNT; i++)
    counts[i] = atomic_load_explicit(&r->counts[i], memory_order_relaxed);
  if (forgot_live) *forgot_live = atomic_load_explicit(&r->forgot_live, memory_order_relaxed);
}
