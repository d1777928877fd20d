/* Per-key rate limits (trust.h): a token bucket per Ed25519 key in a small table, the least
 * recently seen key forgotten when it is full. One mutex; O(cap) per call, cap is small. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/trust.h"

typedef struct bucket {
  uint8_t key[32];
  double tokens, last; /* tokens left at time last */
  bool used;
} bucket;

struct lh_trust_limiter {
  pthread_mutex_t mu;
  double rate, burst;
  int cap;
  bucket *b; /* (cap) */
};

lh_trust_limiter *lh_trust_limiter_create(double rate, double burst, int cap) {
  if (!(rate > 0.0) || !(burst >= 1.0) || cap < 1)
    lh__fatal(__FILE__, __LINE__, "lh_trust_limiter_create",
              "rate %g, burst %g, cap %d: need > 0, >= 1, >= 1", rate, burst, cap);
  lh_trust_limiter *l = lh_xcalloc(1, sizeof *l);
  pthread_mutex_init(&l->mu, NULL);
  l->rate = rate;
  l->burst = burst;
  l->cap = cap;
  l->b = lh_xcalloc((size_t)cap, sizeof *l->b);
  return l;
}

void lh_trust_limiter_free(lh_trust_limiter *l) {
  if (!l) return;
  pthread_mutex_destroy(&l->mu);
  free(l->b);
  free(l);
}

bool lh_trust_limiter_take(lh_trust_limiter *l, const uint8_t key[32], double now_s,
                           double *retry_s) {
  pthread_mutex_lock(&l->mu);
  bucket *k = NULL, *oldest = &l->b[0];
  for (int i = 0; i < l->cap; i++) {
    bucket *x = &l->b[i];
    if (x->used && !memcmp(x->key, key, 32)) {
      k = x;
      break;
    }
    if (!x->used) {
      if (oldest->used) oldest = x;
    } else if (oldest->used && x->last < oldest->last) {
      oldest = x;
    }
  }
  if (!k) {
    k = oldest;
    memcpy(k->key, key, 32);
    k->used = true;
    k->tokens = l->burst;
    k->last = now_s;
  }
  if (now_s > k->last) {
    k->tokens += (now_s - k->last) * l->rate;
    if (k->tokens > l->burst) k->tokens = l->burst;
    k->last = now_s;
  }
  bool ok = k->tokens >= 1.0;
  if (ok)
    k->tokens -= 1.0;
  else if (retry_s)
    *retry_s = (1.0 - k->tokens) / l->rate;
  pthread_mutex_unlock(&l->mu);
  return ok;
}
