/* The adversary kit of `longhaul worker --adversary MODE` (node.h, docs/SECURITY.md): each mode
 * is one way a worker can cheat, for testing what the server catches. Testing only: an honest
 * worker never calls these. */
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "longhaul/tensor.h"
#include "node_impl.h"

const char *const lh_node_adversary_names[] = {
    "none",    "other-model", "quant4",      "quant8",     "prompt",    "tokens",   "temperature",
    "top-p",   "best-of-n",   "drop-member", "dup-member", "logprobs",  "reward",   "replay",
    "version", "garbage",     "oversized",   "slowloris",  "selective", "truncate", NULL};
_Static_assert(sizeof lh_node_adversary_names / sizeof lh_node_adversary_names[0] ==
                   LH_ADV__COUNT + 1,
               "a name for every adversary mode");

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Rounds blocks of 32 values to `bits` bits each (symmetric, scale = the block's absmax), as
 * the common GGUF formats do. */
static void quantise(uint16_t *slab, size_t n, int bits) {
  float levels = (float)((1 << (bits - 1)) - 1);
  for (size_t b = 0; b < n; b += 32) {
    size_t e = b + 32 < n ? b + 32 : n;
    float amax = 0;
    for (size_t i = b; i < e; i++) {
      float v = lh_f32_from_bf16(slab[i]);
      if (v < 0) v = -v;
      if (v > amax) amax = v;
    }
    if (!(amax > 0)) continue;
    for (size_t i = b; i < e; i++) {
      float q = nearbyintf(lh_f32_from_bf16(slab[i]) / amax * levels);
      slab[i] = lh_bf16_from_f32(q * amax / levels);
    }
  }
}

void lh__adv_weights(lh_node_adversary a, uint16_t *slab, size_t n) {
  if (a == LH_ADV_QUANT4) quantise(slab, n, 4);
  if (a == LH_ADV_QUANT8) quantise(slab, n, 8);
  if (a == LH_ADV_OTHER_MODEL) /* every weight scaled by a fixed factor in [0.8, 1.2] */
    for (size_t i = 0; i < n; i++) {
      double f = 0.8 + 0.4 * (double)(mix(i) >> 11) * 0x1p-53;
      slab[i] = lh_bf16_from_f32((float)(lh_f32_from_bf16(slab[i]) * f));
    }
}

void lh__adv_sampling(lh_node_adversary a, lh_sample_params *p) {
  if (a == LH_ADV_TEMPERATURE) p->temperature = 0.9f;
  if (a == LH_ADV_TOP_P) p->top_p = 0.95f;
}

/* The last member becomes a copy of the first. */
static void duplicate_first(lh_rollout_batch *b) {
  int G = b->group_size, last = G - 1;
  int n0 = b->seq_start[1] - b->seq_start[0], keep = b->seq_start[last];
  int N = keep + n0;
  b->tokens = lh_xrealloc(b->tokens, (size_t)N * sizeof *b->tokens);
  b->mu = lh_xrealloc(b->mu, (size_t)N * sizeof *b->mu);
  memcpy(b->tokens + keep, b->tokens, (size_t)n0 * sizeof *b->tokens);
  memcpy(b->mu + keep, b->mu, (size_t)n0 * sizeof *b->mu);
  b->seq_start[G] = N;
  b->prompt_len[last] = b->prompt_len[0];
  b->finish[last] = b->finish[0];
}

/* Every completion of 2 tokens or more keeps its first half, its stop token (if any) cut off with
 * the rest: a completion that ends before max_new without a stop token. */
static void truncate_members(lh_rollout_batch *b) {
  int G = b->group_size, to = 0;
  for (int j = 0; j < G; j++) {
    int from = b->seq_start[j], n = b->seq_start[j + 1] - from - b->prompt_len[j];
    int keep = b->prompt_len[j] + (n >= 2 ? n / 2 : n);
    memmove(b->tokens + to, b->tokens + from, (size_t)keep * sizeof *b->tokens);
    memmove(b->mu + to, b->mu + from, (size_t)keep * sizeof *b->mu);
    if (b->old) memmove(b->old + to, b->old + from, (size_t)keep * sizeof *b->old);
    b->seq_start[j] = to;
    to += keep;
  }
  b->seq_start[G] = to;
}

void lh__adv_batch(lh_node_adversary a, lh_rollout_batch *b, int vocab) {
  int G = b->group_size;
  switch (a) {
  case LH_ADV_PROMPT: /* the first prompt token of every member */
    for (int j = 0; j < G; j++)
      b->tokens[b->seq_start[j]] = (b->tokens[b->seq_start[j]] + 1) % vocab;
    break;
  case LH_ADV_TOKENS: { /* member 1 (or 0), its third completion token (or its last) */
    int j = G > 1 ? 1 : 0, first = b->seq_start[j] + b->prompt_len[j];
    int i = first + 2 < b->seq_start[j + 1] ? first + 2 : b->seq_start[j + 1] - 1;
    if (i >= first) b->tokens[i] = (b->tokens[i] + 1) % vocab;
    break;
  }
  case LH_ADV_DROP_MEMBER:
    if (G > 1) b->group_size = G - 1;
    break;
  case LH_ADV_DUP_MEMBER:
    if (G > 1) duplicate_first(b);
    break;
  case LH_ADV_LOGPROBS:
    for (int j = 0; j < G; j++)
      for (int i = b->seq_start[j] + b->prompt_len[j]; i < b->seq_start[j + 1]; i++)
        b->mu[i] += 0.1f;
    break;
  case LH_ADV_REWARD:
    for (int j = 0; j < G; j++)
      b->reward[j] = 1.0f, b->correct[j] = 1, b->well_formed[j] = 1;
    break;
  case LH_ADV_VERSION:
    b->version++;
    break;
  case LH_ADV_TRUNCATE:
    truncate_members(b);
    break;
  default:
    break;
  }
}

/* ---------------------------------------------------------------- slowloris */

struct lh__slowloris {
  pthread_t th;
  _Atomic int stop;
  char host[256], port[16];
  int conns;
};

static int dial(const lh__slowloris *s) {
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(s->host, s->port, &hints, &ai) || !ai) return -1;
  int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
  if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
    close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  return fd;
}

static void *slowloris_run(void *ud) {
  lh__slowloris *s = ud;
  static const char req[] = "POST /v1/rollouts?lease=1&group=1 HTTP/1.1\r\nHost: x\r\n"
                            "Content-Length: 1000000\r\n\r\n";
  int *fd = lh_xcalloc((size_t)s->conns, sizeof *fd);
  size_t *at = lh_xcalloc((size_t)s->conns, sizeof *at);
  for (int i = 0; i < s->conns; i++)
    fd[i] = -1;
  while (!s->stop) {
    for (int i = 0; i < s->conns; i++) {
      if (fd[i] < 0) fd[i] = dial(s), at[i] = 0;
      if (fd[i] < 0) continue;
      char c = at[i] < sizeof req - 1 ? req[at[i]] : 'x'; /* then the body, as slowly */
      if (send(fd[i], &c, 1, MSG_NOSIGNAL) != 1) {
        close(fd[i]);
        fd[i] = -1;
      } else {
        at[i]++;
      }
    }
    for (int k = 0; k < 10 && !s->stop; k++) {
      struct timespec ts = {0, 100 * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  for (int i = 0; i < s->conns; i++)
    if (fd[i] >= 0) close(fd[i]);
  free(fd);
  free(at);
  return NULL;
}

lh__slowloris *lh__adv_slowloris_start(const char *url, int conns) {
  lh__slowloris *s = lh_xcalloc(1, sizeof *s);
  s->conns = conns;
  const char *h = strstr(url, "://");
  h = h ? h + 3 : url;
  const char *colon = strrchr(h, ':');
  size_t hl = colon ? (size_t)(colon - h) : strlen(h);
  if (hl >= sizeof s->host) hl = sizeof s->host - 1;
  memcpy(s->host, h, hl);
  snprintf(s->port, sizeof s->port, "%.*s", colon ? (int)strcspn(colon + 1, "/") : 2,
           colon ? colon + 1 : "80");
  if (pthread_create(&s->th, NULL, slowloris_run, s)) {
    free(s);
    return NULL;
  }
  return s;
}

void lh__adv_slowloris_stop(lh__slowloris *s) {
  if (!s) return;
  s->stop = 1;
  pthread_join(s->th, NULL);
  free(s);
}
