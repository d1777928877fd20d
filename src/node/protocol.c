/* The networked protocol's codecs (node.h, docs/PROTOCOL.md "The networked protocol"): signed
 * requests and lease bodies. Everything parsed here comes from the network: lengths and counts
 * are checked before anything is allocated, and every error names the field. */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longhaul/node.h"

#define INT53_MAX ((int64_t)9007199254740991)

/* ---------------------------------------------------------------- signed requests */

static void hex(const uint8_t *b, size_t n, char *out) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = d[b[i] >> 4];
    out[2 * i + 1] = d[b[i] & 15];
  }
  out[2 * n] = '\0';
}

/* The bytes a request's signature covers (malloc'd, *n bytes; node.h, lh_node_sign). */
static char *signed_bytes(const char *method, const char *path, const void *body, size_t len,
                          const char *key_hex, int64_t time_ms, const char *nonce_hex, size_t *n) {
  uint8_t h[LH_HASH_BYTES];
  char hh[2 * LH_HASH_BYTES + 1];
  lh_hash256(body, len, h);
  hex(h, LH_HASH_BYTES, hh);
  size_t cap = strlen(LH_NODE_SIGNING_CONTEXT) + strlen(method) + strlen(path) + 256;
  char *m = lh_xmalloc(cap);
  int w = snprintf(m, cap, "%s%s\n%s\n%s\n%s\n%lld\n%s\n", LH_NODE_SIGNING_CONTEXT, method, path,
                   hh, key_hex, (long long)time_ms, nonce_hex);
  *n = (size_t)w;
  return m;
}

void lh_node_sign(const lh_sync_secret_key *sk, const char *method, const char *path,
                  const void *body, size_t len, int64_t time_ms, lh_node_auth_text *out) {
  lh_sync_public_key pk;
  lh_sync_key_public(sk, &pk);
  uint8_t nonce[LH_NODE_NONCE_BYTES];
  randombytes_buf(nonce, sizeof nonce);
  hex(pk.bytes, sizeof pk.bytes, out->key);
  hex(nonce, sizeof nonce, out->nonce);
  snprintf(out->time, sizeof out->time, "%lld", (long long)time_ms);
  size_t n;
  char *m = signed_bytes(method, path, body, len, out->key, time_ms, out->nonce, &n);
  uint8_t sig[LH_SYNC_SIGNATURE_BYTES];
  crypto_sign_detached(sig, NULL, (const unsigned char *)m, n, sk->sk);
  hex(sig, sizeof sig, out->signature);
  free(m);
}

static lh_err parse_hex(const char *s, const char *header, uint8_t *out, size_t n) {
  if (!s) return lh_errorf(LH_ERR_FORMAT, "header %s is missing", header);
  size_t len = strnlen(s, 2 * n + 1);
  if (len != 2 * n)
    return lh_errorf(LH_ERR_FORMAT, "header %s: expected %zu lowercase hex digits", header, 2 * n);
  for (size_t i = 0; i < 2 * n; i++) {
    char c = s[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0)
      return lh_errorf(LH_ERR_FORMAT, "header %s: character %zu is not a lowercase hex digit",
                       header, i);
    if (i % 2 == 0)
      out[i / 2] = (uint8_t)(v << 4);
    else
      out[i / 2] |= (uint8_t)v;
  }
  return LH_ERR_OK;
}

lh_err lh_node_request(lh_http_client *c, const lh_sync_secret_key *sk, const char *method,
                       const char *path, const void *body, size_t len, int64_t time_ms,
                       size_t max_reply, long timeout_ms, lh_http_reply *out) {
  lh_node_auth_text a;
  lh_node_sign(sk, method, path, body, len, time_ms, &a);
  lh_http_header h[5] = {{LH_NODE_HDR_KEY, a.key},
                         {LH_NODE_HDR_TIME, a.time},
                         {LH_NODE_HDR_NONCE, a.nonce},
                         {LH_NODE_HDR_SIGNATURE, a.signature},
                         {"Content-Type", "application/octet-stream"}};
  return lh_http_client_request(c, method, path, h, 5, body, len, max_reply, timeout_ms, out);
}

lh_err lh_node_auth_parse(const char *key, const char *time, const char *nonce,
                          const char *signature, lh_node_auth *a) {
  memset(a, 0, sizeof *a);
  lh_err e;
  if ((e = parse_hex(key, LH_NODE_HDR_KEY, a->key.bytes, sizeof a->key.bytes)) ||
      (e = parse_hex(nonce, LH_NODE_HDR_NONCE, a->nonce, sizeof a->nonce)) ||
      (e = parse_hex(signature, LH_NODE_HDR_SIGNATURE, a->signature, sizeof a->signature)))
    return e;
  if (!time) return lh_errorf(LH_ERR_FORMAT, "header %s is missing", LH_NODE_HDR_TIME);
  size_t n = strnlen(time, 20);
  if (n == 0 || n > 16 || (n > 1 && time[0] == '0'))
    return lh_errorf(LH_ERR_FORMAT, "header %s: expected a decimal integer of milliseconds",
                     LH_NODE_HDR_TIME);
  int64_t t = 0;
  for (size_t i = 0; i < n; i++) {
    if (time[i] < '0' || time[i] > '9')
      return lh_errorf(LH_ERR_FORMAT, "header %s: expected a decimal integer of milliseconds",
                       LH_NODE_HDR_TIME);
    t = t * 10 + (time[i] - '0');
  }
  if (t > INT53_MAX)
    return lh_errorf(LH_ERR_FORMAT, "header %s: beyond 2^53 - 1", LH_NODE_HDR_TIME);
  a->time_ms = t;
  return LH_ERR_OK;
}

lh_err lh_node_auth_verify(const lh_node_auth *a, const char *method, const char *path,
                           const void *body, size_t len) {
  char key_hex[2 * LH_SYNC_PUBLIC_KEY_BYTES + 1], nonce_hex[2 * LH_NODE_NONCE_BYTES + 1];
  hex(a->key.bytes, sizeof a->key.bytes, key_hex);
  hex(a->nonce, sizeof a->nonce, nonce_hex);
  size_t n;
  char *m = signed_bytes(method, path, body, len, key_hex, a->time_ms, nonce_hex, &n);
  int bad = crypto_sign_verify_detached(a->signature, (const unsigned char *)m, n, a->key.bytes);
  free(m);
  return bad ? lh_errorf(LH_ERR_SIGNATURE, "the request's signature does not verify") : LH_ERR_OK;
}

/* ---------------------------------------------------------------- JSON fields */

typedef struct reader {
  const char *what;
} reader;

static json_t *parse_object(const void *text, size_t len, size_t max, const char *what, lh_err *e) {
  *e = LH_ERR_OK;
  if (len > max) {
    *e = lh_errorf(LH_ERR_LIMIT, "%s: %zu bytes, more than %zu", what, len, max);
    return NULL;
  }
  json_error_t err;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
  if (!root) {
    *e = lh_errorf(LH_ERR_FORMAT, "%s: not JSON: %s (at byte %d)", what, err.text, err.position);
    return NULL;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    *e = lh_errorf(LH_ERR_FORMAT, "%s: not a JSON object", what);
    return NULL;
  }
  return root;
}

/* An integer field in [lo, hi]. */
static lh_err get_int(const reader *r, const json_t *o, const char *key, int64_t lo, int64_t hi,
                      int64_t *out) {
  const json_t *v = json_object_get(o, key);
  if (!v) return lh_errorf(LH_ERR_FORMAT, "%s: missing field \"%s\"", r->what, key);
  if (!json_is_integer(v))
    return lh_errorf(LH_ERR_FORMAT, "%s: field \"%s\" is not an integer", r->what, key);
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return lh_errorf(LH_ERR_FORMAT, "%s: field \"%s\" is %lld, outside %lld .. %lld", r->what, key,
                     (long long)x, (long long)lo, (long long)hi);
  *out = (int64_t)x;
  return LH_ERR_OK;
}

static lh_err get_num(const reader *r, const json_t *o, const char *key, double lo, double hi,
                      float *out) {
  const json_t *v = json_object_get(o, key);
  if (!v) return lh_errorf(LH_ERR_FORMAT, "%s: missing field \"%s\"", r->what, key);
  if (!json_is_number(v))
    return lh_errorf(LH_ERR_FORMAT, "%s: field \"%s\" is not a number", r->what, key);
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi))
    return lh_errorf(LH_ERR_FORMAT, "%s: field \"%s\" is %g, outside %g .. %g", r->what, key, x, lo,
                     hi);
  *out = (float)x;
  return LH_ERR_OK;
}

/* No fields but those named. */
static lh_err only_fields(const reader *r, const json_t *o, const char *const *names, int n) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    int i = 0;
    while (i < n && strcmp(key, names[i]))
      i++;
    if (i == n) {
      char shown[64];
      lh_escape(key, strlen(key), shown, sizeof shown);
      return lh_errorf(LH_ERR_FORMAT, "%s: unknown field \"%s\"", r->what, shown);
    }
  }
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- leases */

lh_err lh_node_lease_request_parse(const void *body, size_t len, lh_node_lease_request *out) {
  memset(out, 0, sizeof *out);
  reader r = {"lease request"};
  lh_err e;
  json_t *o = parse_object(body, len, LH_NODE_LEASE_REQUEST_MAX, r.what, &e);
  if (!o) return e;
  static const char *const names[] = {"groups", "version"};
  int64_t g = 0, v = 0;
  if (!(e = only_fields(&r, o, names, 2)) &&
      !(e = get_int(&r, o, "groups", 1, LH_NODE_MAX_LEASE_GROUPS, &g)) &&
      !(e = get_int(&r, o, "version", -1, INT53_MAX, &v))) {
    out->groups = (int)g;
    out->version = v;
  }
  json_decref(o);
  return e;
}

/* ---------------------------------------------------------------- registration and errors */

lh_err lh_node_register_parse(const void *body, size_t len, char **name, char **hardware_json) {
  *name = NULL;
  *hardware_json = NULL;
  reader r = {"registration"};
  lh_err e;
  json_t *o = parse_object(body, len, LH_NODE_REGISTER_MAX, r.what, &e);
  if (!o) return e;
  static const char *const names[] = {"name", "hardware"};
  const json_t *n = json_object_get(o, "name"), *hw = json_object_get(o, "hardware");
  if ((e = only_fields(&r, o, names, 2))) {
  } else if (n && !json_is_string(n)) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: field \"name\": expected a string", r.what);
  } else if (hw && !json_is_object(hw)) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: field \"hardware\": expected an object", r.what);
  } else if (n && strlen(json_string_value(n)) != json_string_length(n)) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: field \"name\": holds a NUL character", r.what);
  } else {
    *name = lh_xstrdup(n ? json_string_value(n) : "");
    *hardware_json = hw ? json_dumps(hw, JSON_COMPACT) : NULL;
    if (hw && !*hardware_json) {
      free(*name);
      *name = NULL;
      e = lh_errorf(LH_ERR_NOMEM, "%s: cannot encode the hardware object", r.what);
    }
  }
  json_decref(o);
  return e;
}

void lh_node_error_parse(const void *body, size_t len, char *code, size_t cap,
                         int64_t *server_time_ms) {
  if (cap > 0) code[0] = '\0';
  *server_time_ms = -1;
  if (!body || len > LH_NODE_ERROR_MAX) return;
  json_t *o = json_loadb(body, len, 0, NULL);
  const json_t *c = json_object_get(json_object_get(o, "error"), "code");
  const json_t *t = json_object_get(o, "server_time_ms");
  if (cap > 0 && json_is_string(c)) snprintf(code, cap, "%s", json_string_value(c));
  if (json_is_integer(t) && json_integer_value(t) >= 0) *server_time_ms = json_integer_value(t);
  json_decref(o);
}

json_t *lh_node_group_json(const lh_node_group *g) {
  json_t *p = json_array();
  for (int i = 0; i < g->prompt_len; i++)
    json_array_append_new(p, json_integer(g->prompt[i]));
  json_t *s = json_pack("{s:f,s:i,s:f,s:f}", "temperature", (double)g->sample.temperature, "top_k",
                        g->sample.top_k, "top_p", (double)g->sample.top_p, "min_p",
                        (double)g->sample.min_p);
  return json_pack("{s:I,s:I,s:o,s:i,s:I,s:I,s:i,s:o,s:I}", "group", (json_int_t)g->group, "task",
                   (json_int_t)g->task, "prompt", p, "group_size", g->group_size, "seed",
                   (json_int_t)g->seed, "stream_base", (json_int_t)g->stream_base, "max_new",
                   g->max_new, "sample", s, "min_version", (json_int_t)g->min_version);
}

char *lh_node_lease_json(const lh_node_lease *l, size_t *len) {
  json_t *gs = json_array();
  for (int i = 0; i < l->n_groups; i++)
    json_array_append_new(gs, lh_node_group_json(&l->groups[i]));
  json_t *o = json_pack("{s:I,s:I,s:o}", "lease", (json_int_t)l->lease, "expires_ms",
                        (json_int_t)l->expires_ms, "groups", gs);
  char *text = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  *len = text ? strlen(text) : 0;
  return text;
}

static lh_err group_from(const reader *r, const json_t *o, int vocab, lh_node_group *g) {
  memset(g, 0, sizeof *g);
  if (!json_is_object(o)) return lh_errorf(LH_ERR_FORMAT, "%s: not an object", r->what);
  static const char *const names[] = {"group",       "task",    "prompt", "group_size", "seed",
                                      "stream_base", "max_new", "sample", "min_version"};
  int64_t x;
  lh_err e;
  if ((e = only_fields(r, o, names, 9))) return e;
  if ((e = get_int(r, o, "group", 0, INT53_MAX, &g->group))) return e; /* 0 in the ledger */
  if ((e = get_int(r, o, "task", 0, INT53_MAX, &x))) return e;
  g->task = (uint64_t)x;
  if ((e = get_int(r, o, "group_size", 1, 4096, &x))) return e;
  g->group_size = (int)x;
  if ((e = get_int(r, o, "seed", 0, INT53_MAX, &x))) return e;
  g->seed = (uint64_t)x;
  if ((e = get_int(r, o, "stream_base", 0, INT53_MAX, &x))) return e;
  g->stream_base = (uint64_t)x;
  if ((e = get_int(r, o, "max_new", 1, 1 << 20, &x))) return e;
  g->max_new = (int)x;
  if ((e = get_int(r, o, "min_version", 0, INT53_MAX, &g->min_version))) return e;
  const json_t *s = json_object_get(o, "sample");
  if (!json_is_object(s))
    return lh_errorf(LH_ERR_FORMAT, "%s: field \"sample\" is missing or not an object", r->what);
  static const char *const sn[] = {"temperature", "top_k", "top_p", "min_p"};
  if ((e = only_fields(r, s, sn, 4)) ||
      (e = get_num(r, s, "temperature", 0.0, 100.0, &g->sample.temperature)) ||
      (e = get_int(r, s, "top_k", 0, 1 << 24, &x)))
    return e;
  g->sample.top_k = (int)x;
  if ((e = get_num(r, s, "top_p", 0.0, 1.0, &g->sample.top_p)) ||
      (e = get_num(r, s, "min_p", 0.0, 1.0, &g->sample.min_p)))
    return e;
  const json_t *p = json_object_get(o, "prompt");
  if (!json_is_array(p))
    return lh_errorf(LH_ERR_FORMAT, "%s: field \"prompt\" is missing or not an array", r->what);
  size_t n = json_array_size(p);
  if (n < 1 || n > LH_NODE_MAX_PROMPT)
    return lh_errorf(LH_ERR_FORMAT, "%s: a prompt of %zu tokens, 1 .. %d allowed", r->what, n,
                     LH_NODE_MAX_PROMPT);
  g->prompt = lh_xmalloc(n * sizeof *g->prompt);
  g->prompt_len = (int)n;
  for (size_t i = 0; i < n; i++) {
    const json_t *t = json_array_get(p, i);
    if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab) {
      lh_node_group_clear(g);
      return lh_errorf(LH_ERR_FORMAT, "%s: prompt token %zu is not an id in 0 .. %d", r->what, i,
                       vocab - 1);
    }
    g->prompt[i] = (int32_t)json_integer_value(t);
  }
  return LH_ERR_OK;
}

lh_err lh_node_group_parse(const void *text, size_t len, int vocab, const char *what,
                           lh_node_group *out) {
  memset(out, 0, sizeof *out);
  reader r = {what};
  lh_err e;
  json_t *o = parse_object(text, len, LH_NODE_LEASE_REPLY_MAX, what, &e);
  if (!o) return e;
  e = group_from(&r, o, vocab, out);
  json_decref(o);
  return e;
}

lh_err lh_node_lease_parse(const void *text, size_t len, int vocab, lh_node_lease *out) {
  memset(out, 0, sizeof *out);
  reader r = {"lease reply"};
  lh_err e;
  json_t *o = parse_object(text, len, LH_NODE_LEASE_REPLY_MAX, r.what, &e);
  if (!o) return e;
  static const char *const names[] = {"lease", "expires_ms", "groups"};
  const json_t *gs = json_object_get(o, "groups");
  if ((e = only_fields(&r, o, names, 3)) ||
      (e = get_int(&r, o, "lease", 1, INT53_MAX, &out->lease)) ||
      (e = get_int(&r, o, "expires_ms", 0, INT53_MAX, &out->expires_ms)))
    goto out;
  if (!json_is_array(gs) || json_array_size(gs) < 1 ||
      json_array_size(gs) > LH_NODE_MAX_LEASE_GROUPS) {
    e = lh_errorf(LH_ERR_FORMAT, "lease reply: \"groups\" must be an array of 1 .. %d groups",
                  LH_NODE_MAX_LEASE_GROUPS);
    goto out;
  }
  out->groups = lh_xcalloc(json_array_size(gs), sizeof *out->groups);
  for (size_t i = 0; i < json_array_size(gs); i++) {
    char what[48];
    snprintf(what, sizeof what, "lease reply: group %zu", i);
    reader gr = {what};
    if ((e = group_from(&gr, json_array_get(gs, i), vocab, &out->groups[i]))) goto out;
    out->n_groups++;
  }
out:
  json_decref(o);
  if (e) lh_node_lease_clear(out);
  return e;
}

void lh_node_group_clear(lh_node_group *g) {
  if (!g) return;
  free(g->prompt);
  memset(g, 0, sizeof *g);
}

void lh_node_lease_clear(lh_node_lease *l) {
  if (!l) return;
  for (int i = 0; i < l->n_groups; i++)
    lh_node_group_clear(&l->groups[i]);
  free(l->groups);
  memset(l, 0, sizeof *l);
}

/* ---------------------------------------------------------------- allowlist */

lh_err lh_node_allowlist_parse(const void *text, size_t len, const char *what,
                               lh_sync_public_key **keys, int *n) {
  *keys = NULL;
  *n = 0;
  const char *p = text, *end = p + len;
  int cap = 0, line = 0;
  lh_err e = LH_ERR_OK;
  while (p < end && !e) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *eol = nl ? nl : end;
    line++;
    size_t l = (size_t)(eol - p);
    if (l > 0 && p[l - 1] == '\r') l--;
    if (l > 0 && p[0] != '#') {
      if (*n >= LH_NODE_ALLOW_MAX) {
        e = lh_errorf(LH_ERR_LIMIT, "%s: line %d: more than %d keys", what, line,
                      LH_NODE_ALLOW_MAX);
        break;
      }
      char where[160];
      snprintf(where, sizeof where, "%s: line %d", what, line);
      lh_sync_public_key k;
      if ((e = lh_sync_public_key_parse(p, l, where, &k))) break;
      if (*n == cap) {
        cap = cap ? 2 * cap : 16;
        *keys = lh_xrealloc(*keys, (size_t)cap * sizeof **keys);
      }
      (*keys)[(*n)++] = k;
    }
    p = nl ? nl + 1 : end;
  }
  if (e) {
    free(*keys);
    *keys = NULL;
    *n = 0;
  }
  return e;
}
