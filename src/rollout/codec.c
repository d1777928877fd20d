/* longhaul rollout: the byte format of a rollout batch (rollout.h, "the byte format"). Fixed
 * little-endian layout, whatever the host: a 96-byte header, then the arrays. The decoder checks
 * every count against the caller's limits and the exact length before it allocates, and the
 * arrays' consistency after; it never aborts on bad bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/rollout.h"

#define MAGIC       "LHRB"
#define HEADER      96
#define FLAG_OLD    1u /* the batch carries old log-probs */
#define FLAGS_KNOWN FLAG_OLD

/* Header fields, by byte offset. */
enum {
  H_MAGIC = 0,        /* 4 bytes "LHRB" */
  H_FORMAT = 4,       /* u16 LH_ROLLOUT_FORMAT */
  H_FLAGS = 6,        /* u16 */
  H_GROUPS = 8,       /* u32 n_groups */
  H_GROUP_SIZE = 12,  /* u32 group_size */
  H_TOKENS = 16,      /* u64 tokens of the batch */
  H_VERSION = 24,     /* i64 policy version */
  H_SEED = 32,        /* u64 sampler seed */
  H_STREAM = 40,      /* u64 stream base */
  H_TEMPERATURE = 48, /* f32 */
  H_TOP_K = 52,       /* i32 */
  H_TOP_P = 56,       /* f32 */
  H_MIN_P = 60,       /* f32 */
  H_MAX_NEW = 64,     /* i32 */
  H_SPLIT = 68,       /* u8 */
  H_RESERVED = 69,    /* zero up to HEADER */
};
_Static_assert(H_RESERVED < HEADER, "the rollout header's fields fit in it");

lh_rollout_limits lh_rollout_default_limits(void) {
  return (lh_rollout_limits){65536, 4096, (int64_t)1 << 28, LH_MAX_VOCAB};
}

static void put_f32(uint8_t *p, float f) {
  uint32_t v;
  memcpy(&v, &f, 4);
  lh_put_le32(p, v);
}
static float get_f32(const uint8_t *p) {
  uint32_t v = lh_get_le32(p);
  float f;
  memcpy(&f, &v, 4);
  return f;
}

/* Bytes of the arrays after the header: per group u64 task index and u8 ok; per sequence u32
 * length, u32 prompt length, f32 reward and u8 correct, well_formed, finish; per token i32 id,
 * f32 mu and, with old, f32 old. In uint64 so that no count a header can hold overflows. */
static uint64_t body_size(uint64_t groups, uint64_t seqs, uint64_t tokens, int has_old) {
  return groups * 9 + seqs * 15 + tokens * (has_old ? 12 : 8);
}

size_t lh_rollout_encoded_size(const lh_rollout_batch *b) {
  uint64_t n = (uint64_t)b->n_groups * (uint64_t)b->group_size;
  return HEADER + (size_t)body_size((uint64_t)b->n_groups, n, (uint64_t)b->seq_start[n], !!b->old);
}

/* ---------------------------------------------------------------- validation */

lh_err lh_rollout_validate(const lh_rollout_batch *b, const lh_rollout_limits *lim,
                           const char *what) {
  if (b->n_groups < 1 || b->n_groups > lim->max_groups)
    return lh_errorf(LH_ERR_LIMIT, "%s: %d groups, expected 1..%d", what, b->n_groups,
                     lim->max_groups);
  if (b->group_size < 1 || b->group_size > lim->max_group_size)
    return lh_errorf(LH_ERR_LIMIT, "%s: groups of %d, expected 1..%d", what, b->group_size,
                     lim->max_group_size);
  if ((int64_t)b->n_groups * b->group_size > INT32_MAX - 1)
    return lh_errorf(LH_ERR_LIMIT, "%s: %d groups of %d: too many sequences", what, b->n_groups,
                     b->group_size);
  const lh_sample_params *sp = &b->sample;
  if (!(sp->temperature >= 0.0f && isfinite(sp->temperature)) || sp->top_k < 0 ||
      !(sp->top_p > 0.0f && sp->top_p <= 1.0f) || !(sp->min_p >= 0.0f && sp->min_p < 1.0f))
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: sampling parameters temperature %g, top-k %d, top-p %g, min-p %g are "
                     "out of range",
                     what, (double)sp->temperature, sp->top_k, (double)sp->top_p,
                     (double)sp->min_p);
  if (b->max_new < 1)
    return lh_errorf(LH_ERR_FORMAT, "%s: max_new %d, expected >= 1", what, b->max_new);
  if (b->split != LH_SPLIT_TRAIN && b->split != LH_SPLIT_TEST)
    return lh_errorf(LH_ERR_FORMAT, "%s: split %d, expected 0 (train) or 1 (test)", what,
                     (int)b->split);
  int G = b->group_size, n = b->n_groups * G;
  if (b->seq_start[0] != 0)
    return lh_errorf(LH_ERR_FORMAT, "%s: sequence 0 starts at %d, expected 0", what,
                     b->seq_start[0]);
  for (int s = 0; s < n; s++) {
    int64_t len = (int64_t)b->seq_start[s + 1] - b->seq_start[s];
    int ok = b->group_ok[s / G];
    if (len < 0 || b->seq_start[s + 1] > lim->max_tokens)
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: sequence %d: end %d before its start %d or past %lld "
                       "tokens",
                       what, s, b->seq_start[s + 1], b->seq_start[s], (long long)lim->max_tokens);
    if (!ok && (len != 0 || b->prompt_len[s] != 0 || b->reward[s] != 0.0f || b->correct[s] ||
                b->well_formed[s]))
      return lh_errorf(LH_ERR_FORMAT, "%s: sequence %d: its group %d failed, but it is not empty",
                       what, s, s / G);
    if (ok &&
        (b->prompt_len[s] < 1 || b->prompt_len[s] >= len || len - b->prompt_len[s] > b->max_new))
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: sequence %d: %lld tokens with a prompt of %d; expected a prompt of at "
                       "least 1 and 1..%d completion tokens",
                       what, s, (long long)len, b->prompt_len[s], b->max_new);
    if (!(b->reward[s] >= 0.0f && b->reward[s] <= 1.0f))
      return lh_errorf(LH_ERR_FORMAT, "%s: sequence %d: reward %g, expected [0, 1]", what, s,
                       (double)b->reward[s]);
    if (b->correct[s] > 1 || b->well_formed[s] > 1 || b->finish[s] > LH_FINISH_CONTEXT)
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: sequence %d: correct %u, well_formed %u, finish %u; expected 0/1, 0/1 "
                       "and 0..%d",
                       what, s, b->correct[s], b->well_formed[s], b->finish[s], LH_FINISH_CONTEXT);
    for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i++) {
      int prompt = i - b->seq_start[s] < b->prompt_len[s];
      if (b->tokens[i] < 0 || b->tokens[i] >= lim->vocab)
        return lh_errorf(LH_ERR_FORMAT, "%s: sequence %d: token %d is %d, outside [0, %d)", what, s,
                         i - b->seq_start[s], b->tokens[i], lim->vocab);
      if (!isfinite(b->mu[i]) || (prompt && b->mu[i] != 0.0f) || (b->old && !isfinite(b->old[i])))
        return lh_errorf(LH_ERR_FORMAT,
                         "%s: sequence %d: token %d: behaviour log-prob %g%s; expected a finite "
                         "number (0 on the prompt)",
                         what, s, i - b->seq_start[s], (double)b->mu[i],
                         b->old && !isfinite(b->old[i]) ? ", old log-prob not finite" : "");
    }
  }
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- encode */

lh_err lh_rollout_encode(const lh_rollout_batch *b, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  lh_rollout_limits lim = lh_rollout_default_limits();
  lim.max_groups = lim.max_group_size = INT32_MAX;
  lim.max_tokens = INT32_MAX;
  lim.vocab = INT32_MAX;
  lh_err e = lh_rollout_validate(b, &lim, "rollout batch");
  if (e) return lh_errorf(LH_ERR_INVAL, "cannot encode: %s", lh_last_error());
  int G = b->group_size, n = b->n_groups * G, N = b->seq_start[n];
  size_t size = lh_rollout_encoded_size(b);
  uint8_t *p = malloc(size);
  if (!p) return lh_errorf(LH_ERR_NOMEM, "rollout batch: cannot allocate %zu bytes", size);
  memset(p, 0, HEADER);
  memcpy(p + H_MAGIC, MAGIC, 4);
  lh_put_le16(p + H_FORMAT, LH_ROLLOUT_FORMAT);
  lh_put_le16(p + H_FLAGS, b->old ? FLAG_OLD : 0);
  lh_put_le32(p + H_GROUPS, (uint32_t)b->n_groups);
  lh_put_le32(p + H_GROUP_SIZE, (uint32_t)G);
  lh_put_le64(p + H_TOKENS, (uint64_t)N);
  lh_put_le64(p + H_VERSION, (uint64_t)b->version);
  lh_put_le64(p + H_SEED, b->seed);
  lh_put_le64(p + H_STREAM, b->stream_base);
  put_f32(p + H_TEMPERATURE, b->sample.temperature);
  lh_put_le32(p + H_TOP_K, (uint32_t)b->sample.top_k);
  put_f32(p + H_TOP_P, b->sample.top_p);
  put_f32(p + H_MIN_P, b->sample.min_p);
  lh_put_le32(p + H_MAX_NEW, (uint32_t)b->max_new);
  p[H_SPLIT] = (uint8_t)b->split;
  uint8_t *q = p + HEADER;
  for (int t = 0; t < b->n_groups; t++, q += 8)
    lh_put_le64(q, b->task_index[t]);
  memcpy(q, b->group_ok, (size_t)b->n_groups), q += b->n_groups;
  for (int s = 0; s < n; s++, q += 4)
    lh_put_le32(q, (uint32_t)(b->seq_start[s + 1] - b->seq_start[s]));
  for (int s = 0; s < n; s++, q += 4)
    lh_put_le32(q, (uint32_t)b->prompt_len[s]);
  for (int s = 0; s < n; s++, q += 4)
    put_f32(q, b->reward[s]);
  memcpy(q, b->correct, (size_t)n), q += n;
  memcpy(q, b->well_formed, (size_t)n), q += n;
  memcpy(q, b->finish, (size_t)n), q += n;
  for (int i = 0; i < N; i++, q += 4)
    lh_put_le32(q, (uint32_t)b->tokens[i]);
  for (int i = 0; i < N; i++, q += 4)
    put_f32(q, b->mu[i]);
  for (int i = 0; b->old && i < N; i++, q += 4)
    put_f32(q, b->old[i]);
  LH_CHECK((size_t)(q - p) == size, "rollout encoding wrote %zu bytes of %zu", (size_t)(q - p),
           size);
  *out = p;
  *len = size;
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- decode */

lh_err lh_rollout_decode(const uint8_t *buf, size_t len, const lh_rollout_limits *lim,
                         const char *what, lh_rollout_batch *out) {
  memset(out, 0, sizeof *out);
  if (len < HEADER)
    return lh_errorf(LH_ERR_FORMAT, "%s: %zu bytes, shorter than the %d-byte header", what, len,
                     HEADER);
  if (memcmp(buf + H_MAGIC, MAGIC, 4) != 0)
    return lh_errorf(LH_ERR_FORMAT, "%s: not a rollout batch (magic bytes are not \"LHRB\")", what);
  unsigned format = lh_get_le16(buf + H_FORMAT), flags = lh_get_le16(buf + H_FLAGS);
  if (format != LH_ROLLOUT_FORMAT)
    return lh_errorf(LH_ERR_UNSUPPORTED, "%s: rollout format %u, this longhaul reads %d", what,
                     format, LH_ROLLOUT_FORMAT);
  if (flags & ~FLAGS_KNOWN)
    return lh_errorf(LH_ERR_UNSUPPORTED, "%s: unknown flags 0x%x in the header", what, flags);
  for (int i = H_RESERVED; i < HEADER; i++)
    if (buf[i])
      return lh_errorf(LH_ERR_FORMAT, "%s: reserved header byte %d is %u, expected 0", what, i,
                       buf[i]);
  uint64_t groups = lh_get_le32(buf + H_GROUPS), gsize = lh_get_le32(buf + H_GROUP_SIZE),
           tokens = lh_get_le64(buf + H_TOKENS);
  if (groups < 1 || groups > (uint64_t)lim->max_groups)
    return lh_errorf(LH_ERR_LIMIT, "%s: %llu groups, expected 1..%d", what,
                     (unsigned long long)groups, lim->max_groups);
  if (gsize < 1 || gsize > (uint64_t)lim->max_group_size)
    return lh_errorf(LH_ERR_LIMIT, "%s: groups of %llu, expected 1..%d", what,
                     (unsigned long long)gsize, lim->max_group_size);
  if (tokens > (uint64_t)lim->max_tokens || tokens > INT32_MAX)
    return lh_errorf(LH_ERR_LIMIT, "%s: %llu tokens, more than the limit of %lld", what,
                     (unsigned long long)tokens, (long long)lim->max_tokens);
  uint64_t n = groups * gsize;
  if (n > INT32_MAX - 1)
    return lh_errorf(LH_ERR_LIMIT, "%s: %llu sequences, too many", what, (unsigned long long)n);
  int has_old = flags & FLAG_OLD;
  uint64_t want = HEADER + body_size(groups, n, tokens, has_old);
  if ((uint64_t)len != want)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: %zu bytes, but %llu groups of %llu with %llu tokens take %llu", what, len,
                     (unsigned long long)groups, (unsigned long long)gsize,
                     (unsigned long long)tokens, (unsigned long long)want);
  lh_rollout_batch *b = out;
  b->n_groups = (int)groups;
  b->group_size = (int)gsize;
  b->version = (int64_t)lh_get_le64(buf + H_VERSION);
  b->seed = lh_get_le64(buf + H_SEED);
  b->stream_base = lh_get_le64(buf + H_STREAM);
  b->sample.temperature = get_f32(buf + H_TEMPERATURE);
  b->sample.top_k = (int32_t)lh_get_le32(buf + H_TOP_K);
  b->sample.top_p = get_f32(buf + H_TOP_P);
  b->sample.min_p = get_f32(buf + H_MIN_P);
  b->max_new = (int32_t)lh_get_le32(buf + H_MAX_NEW);
  b->split = (lh_split)buf[H_SPLIT];
  size_t G = (size_t)groups, S = (size_t)n, N = (size_t)tokens, N1 = N ? N : 1;
  lh_err e = LH_ERR_FORMAT;
  /* sizes come from outside: running out of memory is an error, not an abort */
#define ALLOC(field, bytes)                                                                        \
  if (!(b->field = malloc(bytes))) {                                                               \
    e = lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %zu bytes for %s", what, (size_t)(bytes),     \
                  #field);                                                                         \
    goto bad;                                                                                      \
  }
  ALLOC(task_index, G * sizeof *b->task_index);
  ALLOC(group_ok, G);
  ALLOC(seq_start, (S + 1) * sizeof *b->seq_start);
  ALLOC(prompt_len, S * sizeof *b->prompt_len);
  ALLOC(reward, S * sizeof *b->reward);
  ALLOC(correct, S);
  ALLOC(well_formed, S);
  ALLOC(finish, S);
  ALLOC(tokens, N1 * sizeof *b->tokens);
  ALLOC(mu, N1 * sizeof *b->mu);
  if (has_old) ALLOC(old, N1 * sizeof *b->old);
#undef ALLOC
  const uint8_t *q = buf + HEADER;
  for (size_t t = 0; t < G; t++, q += 8)
    b->task_index[t] = lh_get_le64(q);
  memcpy(b->group_ok, q, G), q += G;
  for (size_t t = 0; t < G; t++)
    if (b->group_ok[t] > 1) {
      lh_errorf(LH_ERR_FORMAT, "%s: group %zu: ok flag %u, expected 0 or 1", what, t,
                b->group_ok[t]);
      goto bad;
    }
  uint64_t at = 0;
  b->seq_start[0] = 0;
  for (size_t s = 0; s < S; s++, q += 4) {
    at += lh_get_le32(q);
    if (at > N) {
      lh_errorf(LH_ERR_FORMAT, "%s: sequence %zu ends past the %zu tokens of the batch", what, s,
                N);
      goto bad;
    }
    b->seq_start[s + 1] = (int)at;
  }
  if (at != N) {
    lh_errorf(LH_ERR_FORMAT, "%s: the sequences hold %llu tokens, the header says %zu", what,
              (unsigned long long)at, N);
    goto bad;
  }
  for (size_t s = 0; s < S; s++, q += 4) {
    uint32_t p = lh_get_le32(q);
    if (p > (uint32_t)(b->seq_start[s + 1] - b->seq_start[s])) {
      lh_errorf(LH_ERR_FORMAT, "%s: sequence %zu: a prompt of %u tokens is longer than it", what, s,
                p);
      goto bad;
    }
    b->prompt_len[s] = (int)p;
  }
  for (size_t s = 0; s < S; s++, q += 4)
    b->reward[s] = get_f32(q);
  memcpy(b->correct, q, S), q += S;
  memcpy(b->well_formed, q, S), q += S;
  memcpy(b->finish, q, S), q += S;
  for (size_t i = 0; i < N; i++, q += 4)
    b->tokens[i] = (int32_t)lh_get_le32(q);
  for (size_t i = 0; i < N; i++, q += 4)
    b->mu[i] = get_f32(q);
  for (size_t i = 0; has_old && i < N; i++, q += 4)
    b->old[i] = get_f32(q);
  if ((e = lh_rollout_validate(b, lim, what))) goto bad;
  return LH_ERR_OK;
bad:
  lh_rollout_batch_free(b);
  return e;
}
