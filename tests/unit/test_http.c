/* The net module's HTTP layer: the pure parsers (Range, Content-Range, If-None-Match, queries,
 * escapes) on hand-made cases, and a real server on 127.0.0.1 with a kernel-chosen port talking
 * to the real client: round trips with bodies, headers and queries as sent, JSON errors, 413
 * before the body is read and for a chunked body that grows too big, reply limits, files with
 * every kind of Range, 304 and HEAD, a long poll that does not stall other connections, slow and
 * silent clients cut off, connection limits, downloads that resume or restart, transport errors,
 * and a stop while a handler waits. Every server and socket is stopped or closed by its test. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "longhaul/http.h"

static void expect_err(lh_err e, lh_err code, const char *needle) {
  if (e != code || !strstr(lh_last_error(), needle))
    fail_msg("expected %s with \"%s\", got %s: %s", lh_err_name(code), needle, lh_err_name(e),
             lh_last_error());
}

static void expect_ok(lh_err e) {
  if (e) fail_msg("expected success, got %s: %s", lh_err_name(e), lh_last_error());
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ---------------------------------------------------------------- parsers */

static void test_parse_range(void **state) {
  (void)state;
  const struct {
    const char *v;
    uint64_t size;
    lh_http_range r;
    uint64_t start, len;
  } cases[] = {
      {NULL, 100, LH_HTTP_RANGE_WHOLE, 0, 100},
      {"bytes=0-9", 100, LH_HTTP_RANGE_ONE, 0, 10},
      {"bytes=10-19", 100, LH_HTTP_RANGE_ONE, 10, 10},
      {"BYTES=10-19", 100, LH_HTTP_RANGE_ONE, 10, 10},
      {"bytes=90-", 100, LH_HTTP_RANGE_ONE, 90, 10},
      {"bytes=90-1000", 100, LH_HTTP_RANGE_ONE, 90, 10},                   /* clamped */
      {"bytes=99-99999999999999999999999", 100, LH_HTTP_RANGE_ONE, 99, 1}, /* saturates */
      {"bytes=-5", 100, LH_HTTP_RANGE_ONE, 95, 5},
      {"bytes=-500", 100, LH_HTTP_RANGE_ONE, 0, 100},
      {"bytes=5-5", 100, LH_HTTP_RANGE_ONE, 5, 1},
      {"bytes= 5-6 ", 100, LH_HTTP_RANGE_ONE, 5, 2},
      {"bytes=,5-6,", 100, LH_HTTP_RANGE_ONE, 5, 2}, /* empty elements skipped */
      {"bytes=100-", 100, LH_HTTP_RANGE_UNSATISFIABLE, 0, 0},
      {"bytes=100-200", 100, LH_HTTP_RANGE_UNSATISFIABLE, 0, 0},
      {"bytes=-0", 100, LH_HTTP_RANGE_UNSATISFIABLE, 0, 0},
      {"bytes=0-", 0, LH_HTTP_RANGE_UNSATISFIABLE, 0, 0},
      {"bytes=-1", 0, LH_HTTP_RANGE_UNSATISFIABLE, 0, 0},
      {"bytes=99999999999999999999999-", 100, LH_HTTP_RANGE_UNSATISFIABLE, 0, 0},
      {"bytes=200-300,400-", 100, LH_HTTP_RANGE_UNSATISFIABLE, 0, 0},
      {"bytes=0-1,5-6", 100, LH_HTTP_RANGE_WHOLE, 0, 100},
      {"bytes=0-1, 200-", 100, LH_HTTP_RANGE_WHOLE, 0, 100},
      {"bytes=5-2", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes=", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes=,", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes=-", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes=a-b", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes=+1-2", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes=1 -2", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes=1-2-3", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes=--1", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes=0-1,x", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"bytes 0-1", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"items=0-1", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
      {"", 100, LH_HTTP_RANGE_MALFORMED, 0, 100},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    uint64_t s = 7, l = 7;
    lh_http_range r = lh_http_parse_range(cases[i].v, cases[i].size, &s, &l);
    if (r != cases[i].r || s != cases[i].start || l != cases[i].len)
      fail_msg("\"%s\" of %llu: got %d (%llu, %llu), expected %d (%llu, %llu)",
               cases[i].v ? cases[i].v : "(null)", (unsigned long long)cases[i].size, r,
               (unsigned long long)s, (unsigned long long)l, cases[i].r,
               (unsigned long long)cases[i].start, (unsigned long long)cases[i].len);
  }
}

static void test_content_range_and_etag(void **state) {
  (void)state;
  uint64_t s, e, t;
  expect_ok(lh_http_parse_content_range("bytes 10-19/100", &s, &e, &t));
  assert_true(s == 10 && e == 19 && t == 100);
  expect_ok(lh_http_parse_content_range("bytes 0-0/*", &s, &e, &t));
  assert_true(s == 0 && e == 0 && t == UINT64_MAX);
  expect_ok(lh_http_parse_content_range("bytes */42", &s, &e, &t));
  assert_true(s == UINT64_MAX && e == UINT64_MAX && t == 42);
  const char *bad[] = {"bytes 5-4/10",
                       "bytes 0-10/10",
                       "bytes */*",
                       "bytes 1-2",
                       "bytes 1-2/3x",
                       "items 1-2/3",
                       "bytes -1-2/3",
                       "bytes 1-2/18446744073709551615",
                       "",
                       NULL};
  for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
    lh_err r = lh_http_parse_content_range(bad[i], &s, &e, &t);
    if (r != LH_ERR_FORMAT) fail_msg("\"%s\" accepted", bad[i] ? bad[i] : "(null)");
    assert_true(s == UINT64_MAX && e == UINT64_MAX && t == UINT64_MAX);
  }
  expect_err(lh_http_parse_content_range("bytes 5-4/10", &s, &e, &t), LH_ERR_FORMAT,
             "found \"bytes 5-4/10\"");

  assert_true(lh_http_etag_match("\"abc\"", "\"abc\""));
  assert_true(lh_http_etag_match("W/\"abc\"", "\"abc\""));
  assert_true(lh_http_etag_match("\"x\", \"abc\"", "\"abc\""));
  assert_true(lh_http_etag_match(" * ", "\"abc\""));
  assert_false(lh_http_etag_match("\"abd\"", "\"abc\""));
  assert_false(lh_http_etag_match("abc", "\"abc\""));        /* unquoted */
  assert_false(lh_http_etag_match("\"abc\" x", "\"abc\""));  /* junk after */
  assert_false(lh_http_etag_match("\"x\", abc", "\"abc\"")); /* a bad element spoils all */
  assert_false(lh_http_etag_match("\"abc", "\"abc\""));      /* unterminated */
  assert_false(lh_http_etag_match("*, \"abc\"", "\"abc\"")); /* "*" stands alone */
  assert_false(lh_http_etag_match(NULL, "\"abc\""));
}

static void test_query(void **state) {
  (void)state;
  char out[16];
  expect_ok(lh_http_query_get("a=1&b=x%20y+z&c", "b", out, sizeof out));
  assert_string_equal(out, "x y z");
  expect_ok(lh_http_query_get("a=1&b=x%20y+z&c", "c", out, sizeof out));
  assert_string_equal(out, "");
  expect_ok(lh_http_query_get("a=1&&b=2&", "b", out, sizeof out));
  assert_string_equal(out, "2");
  expect_ok(lh_http_query_get("k%65y=%2a%2A=", "key", out, sizeof out));
  assert_string_equal(out,
                      "**="); /* keys decode before they compare; '=' after the first is data */
  expect_ok(lh_http_query_get("v=%C3%A9", "v", out, sizeof out));
  assert_string_equal(out, "\xc3\xa9");
  expect_ok(lh_http_query_get("=x", "", out, sizeof out));
  assert_string_equal(out, "x");
  expect_err(lh_http_query_get("a=1", "b", out, sizeof out), LH_ERR_NOTFOUND, "no key \"b\"");
  expect_err(lh_http_query_get("", "b", out, sizeof out), LH_ERR_NOTFOUND, "no key");
  expect_err(lh_http_query_get("a=1&b=%4", "a", out, sizeof out), LH_ERR_FORMAT, "at byte 6");
  expect_err(lh_http_query_get("a=%zz", "a", out, sizeof out), LH_ERR_FORMAT, "at byte 2");
  expect_err(lh_http_query_get("a%=1", "a", out, sizeof out), LH_ERR_FORMAT, "at byte 1");
  expect_err(lh_http_query_get("a=%", "a", out, sizeof out), LH_ERR_FORMAT, "percent-escape");
  expect_err(lh_http_query_get("a=1&a=2", "a", out, sizeof out), LH_ERR_FORMAT, "twice");
  expect_err(lh_http_query_get("a=1&%61=2", "a", out, sizeof out), LH_ERR_FORMAT, "twice");
  expect_err(lh_http_query_get("a=x%00y", "a", out, sizeof out), LH_ERR_FORMAT, "NUL");
  /* 15 bytes and the NUL fit in 16; 16 do not, and out is left empty */
  expect_ok(lh_http_query_get("a=123456789012345", "a", out, sizeof out));
  assert_int_equal(strlen(out), 15);
  expect_err(lh_http_query_get("a=1234567890123456", "a", out, sizeof out), LH_ERR_LIMIT,
             "longer than 15 bytes");
  assert_string_equal(out, "");
  expect_err(lh_http_query_get("a=", "a", out, 0), LH_ERR_LIMIT, "longer than 0 bytes");

  char enc[64];
  expect_ok(lh_http_escape("a b/\xff~", 6, enc, sizeof enc));
  assert_string_equal(enc, "a%20b%2F%FF~");
  char q[80];
  snprintf(q, sizeof q, "k=%s", enc);
  expect_ok(lh_http_query_get(q, "k", out, sizeof out));
  assert_string_equal(out, "a b/\xff~");
  expect_err(lh_http_escape("a b", 3, enc, 5), LH_ERR_LIMIT, "do not fit");
  assert_string_equal(enc, "");
  expect_ok(lh_http_escape("a b", 3, enc, 6));
}

/* ---------------------------------------------------------------- the test server */

#define FILE_SIZE 300000

typedef struct {
  char dir[256], file[300];
  uint8_t content[FILE_SIZE];
  pthread_mutex_t mu;
  char last_range[64]; /* the Range header of the last /file or /whole request */
  atomic_int entered;  /* /block has started waiting */
  atomic_int saw_stop; /* ... and saw the server stopping */
  atomic_int on_stop_calls;
} fixture;

static fixture F;

static void record_range(const lh_http_request *req) {
  const char *r = lh_http_request_header(req, "range");
  pthread_mutex_lock(&F.mu);
  snprintf(F.last_range, sizeof F.last_range, "%s", r ? r : "");
  pthread_mutex_unlock(&F.mu);
}

static long query_long(const lh_http_request *req, const char *key, long dflt) {
  char v[32];
  return lh_http_query_get(req->query, key, v, sizeof v) == LH_ERR_OK ? atol(v) : dflt;
}

static void handler(void *ud, const lh_http_request *req, lh_http_response *res) {
  (void)ud;
  const char *p = req->path;
  if (!strcmp(p, "/hello")) {
    lh_http_respond_bytes(res, 200, "text/plain", "hello", 5);
  } else if (!strcmp(p, "/echo") || !strcmp(p, "/small")) {
    const char *ct = lh_http_request_header(req, "CONTENT-type");
    lh_http_respond_bytes(res, 200, ct ? ct : "application/octet-stream", req->body, req->body_len);
    const char *t = lh_http_request_header(req, "x-test");
    lh_http_response_header(res, "X-Method", req->method);
    if (*req->query) lh_http_response_header(res, "X-Query", req->query);
    lh_http_response_header(res, "X-Peer", req->peer);
    if (t) lh_http_response_header(res, "X-Test", t);
    lh_http_response_header(res, "X-Nul", req->body[req->body_len] ? "no" : "yes");
  } else if (!strcmp(p, "/big")) {
    long n = query_long(req, "n", 0);
    uint8_t *b = calloc((size_t)n + 1, 1);
    lh_http_respond_bytes(res, 200, NULL, b, (size_t)n);
    free(b);
  } else if (!strcmp(p, "/file")) {
    record_range(req);
    lh_err e = lh_http_respond_file(res, F.file, "abc123", "public, max-age=31536000, immutable");
    if (e) lh_http_respond_error(res, 500, "file", "%s", lh_last_error());
  } else if (!strcmp(p, "/missing")) {
    char path[320];
    snprintf(path, sizeof path, "%s/nothing", F.dir);
    lh_err e = lh_http_respond_file(res, path, NULL, NULL);
    lh_http_respond_error(res, e == LH_ERR_NOTFOUND ? 404 : 500, "not_found", "%s",
                          lh_last_error());
  } else if (!strcmp(p, "/whole")) { /* ignores Range */
    record_range(req);
    lh_http_respond_bytes(res, 200, NULL, F.content, FILE_SIZE);
  } else if (!strcmp(p, "/badrange")) {
    lh_http_respond_bytes(res, 206, NULL, F.content, 10);
    lh_http_response_header(res, "Content-Range", "bytes 0-9/300000");
  } else if (!strcmp(p, "/nostatus")) {
    /* leaves the status at 0 */
  } else if (!strcmp(p, "/wait")) { /* a long poll: answers after ms, or when stopping */
    double end = lh_time_now() + (double)query_long(req, "ms", 1000) / 1000;
    while (lh_time_now() < end && !lh_http_request_stopping(req))
      sleep_ms(10);
    lh_http_respond_bytes(res, 200, "text/plain", "waited", 6);
  } else if (!strcmp(p, "/block")) { /* waits for the stop */
    atomic_store(&F.entered, 1);
    double end = lh_time_now() + 10;
    while (lh_time_now() < end && !lh_http_request_stopping(req))
      sleep_ms(10);
    if (lh_http_request_stopping(req)) atomic_store(&F.saw_stop, 1);
    lh_http_respond_error(res, 503, "stopping", "the server is stopping");
  } else {
    lh_http_respond_error(res, 404, "not_found", "no route %s %s", req->method, p);
  }
}

static size_t max_body(void *ud, const char *method, const char *path) {
  (void)ud;
  (void)method;
  return !strcmp(path, "/small") ? 16 : LH_HTTP_DEFAULT_MAX_BODY;
}

static void on_stop(void *ud) {
  (void)ud;
  atomic_fetch_add(&F.on_stop_calls, 1);
}

static lh_http_server *start_with(int timeout_s, int max_connections, int max_per_ip,
                                  int body_timeout_s) {
  lh_http_server_config c = {.host = "127.0.0.1",
                             .body_timeout_s = body_timeout_s,
                             .max_body = max_body,
                             .max_connections = max_connections,
                             .max_per_ip = max_per_ip,
                             .timeout_s = timeout_s,
                             .handler = handler,
                             .on_stop = on_stop};
  lh_http_server *s = NULL;
  lh_err e = lh_http_server_start(&c, &s);
  if (e) fail_msg("server start: %s", lh_last_error());
  assert_true(lh_http_server_port(s) > 0);
  return s;
}

static lh_http_server *start(int timeout_s, int max_connections, int max_per_ip) {
  return start_with(timeout_s, max_connections, max_per_ip, 0);
}

static lh_http_client *client_for(const lh_http_server *s) {
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", lh_http_server_port(s));
  lh_http_client *c = NULL;
  if (lh_http_client_create(url, &c)) fail_msg("client: %s", lh_last_error());
  return c;
}

static lh_http_reply get(lh_http_client *c, const char *path, const char *range, const char *inm) {
  lh_http_header h[2];
  int n = 0;
  if (range) h[n++] = (lh_http_header){"Range", range};
  if (inm) h[n++] = (lh_http_header){"If-None-Match", inm};
  lh_http_reply r;
  lh_err e = lh_http_client_request(c, "GET", path, h, n, NULL, 0, 1 << 20, 5000, &r);
  if (e) fail_msg("GET %s: %s", path, lh_last_error());
  return r;
}

/* The error code of a JSON error body. */
static void expect_error_body(const lh_http_reply *r, long status, const char *code) {
  assert_int_equal(r->status, status);
  assert_string_equal(lh_http_reply_header(r, "content-type"), "application/json");
  json_error_t je;
  json_t *v = json_loadb((const char *)r->body, r->len, 0, &je);
  if (!v) fail_msg("not JSON: %.*s", (int)r->len, (const char *)r->body);
  const char *got = json_string_value(json_object_get(json_object_get(v, "error"), "code"));
  const char *msg = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
  if (!got || strcmp(got, code) || !msg || !*msg)
    fail_msg("expected code %s and a message: %.*s", code, (int)r->len, (const char *)r->body);
  json_decref(v);
}

static int fixture_setup(void **state) {
  (void)state;
  snprintf(F.dir, sizeof F.dir, "%s/lh_test_http.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(F.dir)) return -1;
  snprintf(F.file, sizeof F.file, "%s/blob", F.dir);
  for (int i = 0; i < FILE_SIZE; i++)
    F.content[i] = (uint8_t)((i * 7919u) >> 3 ^ (unsigned)i);
  pthread_mutex_init(&F.mu, NULL);
  return lh_file_write_atomic(F.file, F.content, FILE_SIZE) == LH_ERR_OK ? 0 : -1;
}

static int fixture_teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", F.dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- raw sockets */

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

static void raw_send(int fd, const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w <= 0) fail_msg("send: %s", strerror(errno));
    s += w;
    n -= (size_t)w;
  }
}

/* Reads what arrives within timeout_ms, until the peer closes (or the buffer fills). Returns the
 * bytes read; *closed says whether the peer closed (EOF or reset). */
static size_t raw_read(int fd, char *buf, size_t cap, int timeout_ms, bool *closed) {
  size_t n = 0;
  double end = lh_time_now() + timeout_ms / 1000.0;
  *closed = false;
  while (n + 1 < cap) {
    int left = (int)((end - lh_time_now()) * 1000);
    struct pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
    ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
    if (r <= 0) {
      *closed = true;
      break;
    }
    n += (size_t)r;
  }
  buf[n] = 0;
  return n;
}

/* Whether the server closed fd within timeout_ms (anything it sent first is ignored). */
static bool raw_closed_within(int fd, int timeout_ms) {
  char buf[4096];
  bool closed;
  raw_read(fd, buf, sizeof buf, timeout_ms, &closed);
  return closed;
}

/* ---------------------------------------------------------------- round trips */

static void test_round_trips(void **state) {
  (void)state;
  lh_http_server *s = start(10, 0, 0);
  lh_http_client *c = client_for(s);
  lh_http_reply r = get(c, "/hello", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, 5);
  assert_memory_equal(r.body, "hello", 5);
  assert_string_equal(lh_http_reply_header(&r, "CONTENT-TYPE"), "text/plain");
  lh_http_reply_free(&r);

  /* a binary body of 100 kB goes both ways; headers, method and query arrive as sent */
  size_t n = 100000;
  uint8_t *body = malloc(n);
  for (size_t i = 0; i < n; i++)
    body[i] = (uint8_t)(i * 31 + 7);
  lh_http_header h[] = {{"Content-Type", "application/x-test"}, {"X-Test", "v 1"}};
  expect_ok(
      lh_http_client_request(c, "POST", "/echo?a=%20b&c=d+e", h, 2, body, n, 1 << 20, 5000, &r));
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, n);
  assert_memory_equal(r.body, body, n);
  assert_int_equal(r.body[r.len], 0);
  assert_string_equal(lh_http_reply_header(&r, "x-nul"), "yes"); /* the handler's body too */
  assert_string_equal(lh_http_reply_header(&r, "content-type"), "application/x-test");
  assert_string_equal(lh_http_reply_header(&r, "x-test"), "v 1");
  assert_string_equal(lh_http_reply_header(&r, "x-method"), "POST");
  assert_string_equal(lh_http_reply_header(&r, "x-query"), "a=%20b&c=d+e");
  char peer[64];
  snprintf(peer, sizeof peer, "%s", lh_http_reply_header(&r, "x-peer"));
  assert_int_equal(strncmp(peer, "127.0.0.1:", 10), 0);
  assert_non_null(lh_http_reply_header(&r, "content-length"));
  assert_null(lh_http_reply_header(&r, "x-absent"));
  lh_http_reply_free(&r);
  /* PUT, and an empty POST; the same kept-alive connection (the same peer port) */
  expect_ok(lh_http_client_request(c, "PUT", "/echo", NULL, 0, "xy", 2, 100, 5000, &r));
  assert_string_equal(lh_http_reply_header(&r, "x-method"), "PUT");
  assert_memory_equal(r.body, "xy", 2);
  assert_string_equal(lh_http_reply_header(&r, "x-peer"), peer);
  lh_http_reply_free(&r);
  expect_ok(lh_http_client_request(c, "POST", "/echo", NULL, 0, NULL, 0, 100, 5000, &r));
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, 0);
  assert_string_equal(lh_http_reply_header(&r, "x-peer"), peer);
  lh_http_reply_free(&r);

  /* errors are JSON with a code; a handler that sets no status gives 500 */
  r = get(c, "/nowhere", NULL, NULL);
  expect_error_body(&r, 404, "not_found");
  lh_http_reply_free(&r);
  r = get(c, "/nostatus", NULL, NULL);
  expect_error_body(&r, 500, "internal");
  lh_http_reply_free(&r);

  /* max_reply: a body of exactly the limit is read, one byte more is refused */
  expect_ok(lh_http_client_request(c, "GET", "/big?n=1000", NULL, 0, NULL, 0, 1000, 5000, &r));
  assert_int_equal(r.len, 1000);
  lh_http_reply_free(&r);
  expect_err(lh_http_client_request(c, "GET", "/big?n=1001", NULL, 0, NULL, 0, 1000, 5000, &r),
             LH_ERR_LIMIT, "more than 1000");
  assert_null(r.body);
  expect_err(lh_http_client_request(c, "GET", "/big?n=900000", NULL, 0, NULL, 0, 1000, 5000, &r),
             LH_ERR_LIMIT, "/big?n=900000");
  /* the client still works after a refusal */
  r = get(c, "/hello", NULL, NULL);
  assert_int_equal(r.status, 200);
  lh_http_reply_free(&r);

  /* bad requests are refused before anything is sent */
  lh_http_header bad[] = {{"X-Bad", "a\r\nInjected: 1"}};
  expect_err(lh_http_client_request(c, "GET", "/hello", bad, 1, NULL, 0, 100, 5000, &r),
             LH_ERR_INVAL, "control byte");
  expect_err(lh_http_client_request(c, "GET", "hello", NULL, 0, NULL, 0, 100, 5000, &r),
             LH_ERR_INVAL, "expected '/'");
  expect_err(lh_http_client_request(c, "GET", "/a b", NULL, 0, NULL, 0, 100, 5000, &r),
             LH_ERR_INVAL, "without spaces");
  expect_err(lh_http_client_request(c, "GE T", "/", NULL, 0, NULL, 0, 100, 5000, &r), LH_ERR_INVAL,
             "bad method");
  lh_http_client *bc = NULL;
  expect_err(lh_http_client_create("ftp://127.0.0.1:1", &bc), LH_ERR_INVAL, "expected http://");
  expect_err(lh_http_client_create("http://127.0.0.1:1/api", &bc), LH_ERR_INVAL, "expected");
  expect_ok(lh_http_client_create("http://127.0.0.1:1/", &bc));
  lh_http_client_free(bc);
  free(body);
  lh_http_client_free(c);
  lh_http_server_stop(s);
}

static void test_body_limits(void **state) {
  (void)state;
  lh_http_server *s = start(10, 0, 0);
  lh_http_client *c = client_for(s);
  lh_http_reply r;
  /* 16 bytes pass /small, 17 do not (Content-Length) */
  expect_ok(
      lh_http_client_request(c, "POST", "/small", NULL, 0, "0123456789abcdef", 16, 100, 5000, &r));
  assert_int_equal(r.status, 200);
  lh_http_reply_free(&r);
  expect_ok(lh_http_client_request(c, "POST", "/small", NULL, 0, "0123456789abcdefg", 17, 1000,
                                   5000, &r));
  expect_error_body(&r, 413, "body_too_large");
  lh_http_reply_free(&r);
  /* a large body over the limit: refused, and the client is still usable */
  size_t n = 4 << 20;
  uint8_t *big = calloc(n, 1);
  expect_ok(lh_http_client_request(c, "POST", "/echo", NULL, 0, big, n, 1000, 5000, &r));
  expect_error_body(&r, 413, "body_too_large");
  lh_http_reply_free(&r);
  free(big);
  r = get(c, "/hello", NULL, NULL);
  assert_int_equal(r.status, 200);
  lh_http_reply_free(&r);

  int port = lh_http_server_port(s);
  char buf[8192];
  bool closed;
  /* 413 before the body is read: the headers alone get the answer */
  int fd = raw_connect(port);
  raw_send(fd, "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n");
  raw_read(fd, buf, sizeof buf, 2000, &closed);
  if (strncmp(buf, "HTTP/1.1 413", 12)) fail_msg("got: %s", buf);
  assert_non_null(strstr(buf, "body_too_large"));
  close(fd);
  /* a client that sends its whole body before it reads still reads the 413 (the server reads
   * and drops the body before it closes, so the connection is not reset under the client) */
  fd = raw_connect(port);
  size_t blast = 4 << 20;
  char *junk = calloc(blast, 1);
  raw_send(fd, "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n");
  for (size_t off = 0; off < blast;) {
    ssize_t w = send(fd, junk + off, blast - off, MSG_NOSIGNAL);
    if (w <= 0) fail_msg("sending the body after a 413: %s", strerror(errno));
    off += (size_t)w;
  }
  free(junk);
  raw_read(fd, buf, sizeof buf, 2000, &closed);
  if (strncmp(buf, "HTTP/1.1 413", 12)) fail_msg("got: %s", buf);
  close(fd);
  /* a chunked body that grows past 16 bytes is cut off with 413 */
  fd = raw_connect(port);
  raw_send(fd, "POST /small HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               "a\r\n0123456789\r\n");
  closed = false;
  for (int i = 0; i < 10; i++) {
    if (send(fd, "a\r\n0123456789\r\n", 15, MSG_NOSIGNAL) != 15) break;
    sleep_ms(20);
  }
  raw_read(fd, buf, sizeof buf, 2000, &closed);
  if (strncmp(buf, "HTTP/1.1 413", 12)) fail_msg("got: %s", buf);
  assert_non_null(strstr(buf, "body_too_large"));
  close(fd);
  /* a chunked body within the limit arrives whole */
  fd = raw_connect(port);
  raw_send(fd, "POST /small HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               "Connection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
  raw_read(fd, buf, sizeof buf, 2000, &closed);
  if (strncmp(buf, "HTTP/1.1 200", 12)) fail_msg("got: %s", buf);
  assert_non_null(strstr(buf, "\r\n\r\nhello world"));
  close(fd);
  /* headers larger than the bound are refused by libmicrohttpd */
  fd = raw_connect(port);
  char *huge = malloc(LH_HTTP_MAX_HEADER_BYTES + 100);
  memset(huge, 'x', LH_HTTP_MAX_HEADER_BYTES + 99);
  huge[LH_HTTP_MAX_HEADER_BYTES + 99] = 0;
  raw_send(fd, "GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ");
  send(fd, huge, strlen(huge), MSG_NOSIGNAL);
  send(fd, "\r\n\r\n", 4, MSG_NOSIGNAL);
  raw_read(fd, buf, sizeof buf, 2000, &closed);
  if (strncmp(buf, "HTTP/1.1 431", 12) && strncmp(buf, "HTTP/1.1 413", 12) &&
      strncmp(buf, "HTTP/1.1 400", 12))
    fail_msg("a %d-byte header got: %.200s", LH_HTTP_MAX_HEADER_BYTES + 99, buf);
  free(huge);
  close(fd);
  lh_http_client_free(c);
  lh_http_server_stop(s);
}

/* ---------------------------------------------------------------- files */

static void test_files(void **state) {
  (void)state;
  lh_http_server *s = start(10, 0, 0);
  lh_http_client *c = client_for(s);
  char size[32], cr[64];
  snprintf(size, sizeof size, "%d", FILE_SIZE);
  lh_http_reply r = get(c, "/file", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, FILE_SIZE);
  assert_memory_equal(r.body, F.content, FILE_SIZE);
  assert_string_equal(lh_http_reply_header(&r, "etag"), "\"abc123\"");
  assert_string_equal(lh_http_reply_header(&r, "accept-ranges"), "bytes");
  assert_string_equal(lh_http_reply_header(&r, "cache-control"),
                      "public, max-age=31536000, immutable");
  assert_string_equal(lh_http_reply_header(&r, "content-length"), size);
  assert_string_equal(lh_http_reply_header(&r, "content-type"), "application/octet-stream");
  lh_http_reply_free(&r);

  const struct {
    const char *range;
    long status;
    uint64_t start, len;
  } cases[] = {
      {"bytes=10-19", 206, 10, 10},
      {"bytes=0-0", 206, 0, 1},
      {"bytes=-5", 206, FILE_SIZE - 5, 5},
      {"bytes=299990-", 206, 299990, 10},
      {"bytes=299990-999999", 206, 299990, 10},
      {"bytes=5-2", 200, 0, FILE_SIZE},     /* malformed: ignored */
      {"bytes=0-1,5-6", 200, 0, FILE_SIZE}, /* several: the whole */
      {"bytes=300000-", 416, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    r = get(c, "/file", cases[i].range, NULL);
    if (r.status != cases[i].status) fail_msg("%s: status %ld", cases[i].range, r.status);
    if (r.status == 416) {
      snprintf(cr, sizeof cr, "bytes */%d", FILE_SIZE);
      assert_string_equal(lh_http_reply_header(&r, "content-range"), cr);
      expect_error_body(&r, 416, "range_not_satisfiable");
      assert_string_equal(lh_http_reply_header(&r, "accept-ranges"), "bytes");
    } else {
      assert_int_equal(r.len, cases[i].len);
      assert_memory_equal(r.body, F.content + cases[i].start, cases[i].len);
      if (r.status == 206) {
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%d", (unsigned long long)cases[i].start,
                 (unsigned long long)(cases[i].start + cases[i].len - 1), FILE_SIZE);
        assert_string_equal(lh_http_reply_header(&r, "content-range"), cr);
      } else {
        assert_null(lh_http_reply_header(&r, "content-range"));
      }
    }
    lh_http_reply_free(&r);
  }
  /* If-None-Match: 304 without a body, with the tag; a weak match counts, another tag does not */
  const char *inm[] = {"\"abc123\"", "W/\"abc123\"", "\"zzz\", \"abc123\"", "*"};
  for (int i = 0; i < 4; i++) {
    r = get(c, "/file", "bytes=0-9", inm[i]);
    assert_int_equal(r.status, 304);
    assert_int_equal(r.len, 0);
    assert_string_equal(lh_http_reply_header(&r, "etag"), "\"abc123\"");
    assert_non_null(lh_http_reply_header(&r, "content-type"));
    lh_http_reply_free(&r);
  }
  /* If-Range: the range when the tag is ours, the whole file when it is not */
  lh_http_header ir[] = {{"Range", "bytes=0-9"}, {"If-Range", "\"abc123\""}};
  expect_ok(lh_http_client_request(c, "GET", "/file", ir, 2, NULL, 0, 1 << 20, 5000, &r));
  assert_int_equal(r.status, 206);
  assert_int_equal(r.len, 10);
  lh_http_reply_free(&r);
  ir[1].value = "\"old\"";
  expect_ok(lh_http_client_request(c, "GET", "/file", ir, 2, NULL, 0, 1 << 20, 5000, &r));
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, FILE_SIZE);
  lh_http_reply_free(&r);
  r = get(c, "/file", NULL, "\"zzz\"");
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, FILE_SIZE);
  lh_http_reply_free(&r);
  /* HEAD: the headers of the whole file, no body */
  expect_ok(lh_http_client_request(c, "HEAD", "/file", NULL, 0, NULL, 0, 10, 5000, &r));
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, 0);
  assert_string_equal(lh_http_reply_header(&r, "content-length"), size);
  assert_string_equal(lh_http_reply_header(&r, "etag"), "\"abc123\"");
  lh_http_reply_free(&r);
  /* a missing file is the handler's to answer */
  r = get(c, "/missing", NULL, NULL);
  expect_error_body(&r, 404, "not_found");
  lh_http_reply_free(&r);
  /* bad tags and headers are refused by the helpers */
  lh_http_response res = {.file_fd = -1};
  expect_err(lh_http_respond_file(&res, F.file, "a\"b", NULL), LH_ERR_INVAL, "etag");
  expect_err(lh_http_response_header(&res, "Content-Length", "5"), LH_ERR_INVAL, "itself");
  expect_err(lh_http_response_header(&res, "X Y", "5"), LH_ERR_INVAL, "not a token");
  expect_err(lh_http_response_header(&res, "X-Y", "a\nb"), LH_ERR_INVAL, "control byte");
  for (int i = 0; i < LH_HTTP_MAX_EXTRA_HEADERS; i++)
    expect_ok(lh_http_response_header(&res, "X-N", "v"));
  expect_err(lh_http_response_header(&res, "X-N", "v"), LH_ERR_LIMIT, "extra headers");
  for (int i = 0; i < res.n_headers; i++)
    free(res.headers[i].name), free(res.headers[i].value);
  lh_http_client_free(c);
  lh_http_server_stop(s);
}

/* ---------------------------------------------------------------- concurrency and timeouts */

typedef struct {
  const lh_http_server *s;
  const char *path;
  long timeout_ms;
  lh_err e;
  long status;
  double took;
} bg_request;

static void *bg_main(void *arg) {
  bg_request *b = arg;
  lh_http_client *c = client_for(b->s);
  lh_http_reply r = {0};
  double t0 = lh_time_now();
  b->e = lh_http_client_request(c, "GET", b->path, NULL, 0, NULL, 0, 1000, b->timeout_ms, &r);
  b->took = lh_time_now() - t0;
  b->status = r.status;
  lh_http_reply_free(&r);
  lh_http_client_free(c);
  return NULL;
}

static void test_long_poll(void **state) {
  (void)state;
  lh_http_server *s = start(10, 0, 0);
  bg_request b = {s, "/wait?ms=1000", 5000, 0, 0, 0};
  pthread_t t;
  pthread_create(&t, NULL, bg_main, &b);
  sleep_ms(100); /* the long poll is waiting in its handler */
  lh_http_client *c = client_for(s);
  double t0 = lh_time_now();
  lh_http_reply r = get(c, "/hello", NULL, NULL);
  double took = lh_time_now() - t0;
  assert_int_equal(r.status, 200);
  lh_http_reply_free(&r);
  if (took > 0.3) fail_msg("a request waited %.3f s behind a long poll", took);
  pthread_join(t, NULL);
  expect_ok(b.e);
  assert_int_equal(b.status, 200);
  assert_true(b.took >= 0.9);
  /* a client deadline shorter than the poll: a transport error naming the URL */
  expect_err(lh_http_client_request(c, "GET", "/wait?ms=2000", NULL, 0, NULL, 0, 100, 200, &r),
             LH_ERR_IO, "/wait?ms=2000");
  assert_non_null(strstr(lh_last_error(), "timed out")); /* curl: "Operation timed out" */
  lh_http_client_free(c);
  lh_http_server_stop(s);
}

/* Waits up to ms for the server to close any of fds[0, n) not yet cut, noting when (seconds
 * after t0) in cut[]; what they receive is dropped. */
static void note_closures(const int *fds, double *cut, int n, int ms, double t0) {
  double until = lh_time_now() + ms / 1000.0;
  for (;;) {
    struct pollfd p[4];
    int idx[4], m = 0;
    for (int k = 0; k < n; k++)
      if (!cut[k]) p[m] = (struct pollfd){fds[k], POLLIN, 0}, idx[m++] = k;
    int left = (int)((until - lh_time_now()) * 1000);
    if (m == 0 || left <= 0 || poll(p, (nfds_t)m, left) <= 0) return;
    for (int j = 0; j < m; j++) {
      char buf[4096];
      if (p[j].revents && recv(fds[idx[j]], buf, sizeof buf, 0) <= 0)
        cut[idx[j]] = lh_time_now() - t0;
    }
  }
}

static void test_slow_clients(void **state) {
  (void)state;
  lh_http_server *s = start_with(2, 0, 0, 3);
  int port = lh_http_server_port(s);
  /* a handler may block longer than timeout_s (a long poll) and still answer */
  bg_request b = {s, "/wait?ms=3000", 10000, 0, 0, 0};
  pthread_t t;
  pthread_create(&t, NULL, bg_main, &b);
  /* one client trickles a header byte a second, one says nothing, one trickles its body */
  int fds[3] = {raw_connect(port), raw_connect(port), raw_connect(port)};
  raw_send(fds[2], "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n");
  const char *req = "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaa\r\n\r\n";
  double t0 = lh_time_now(), cut[3] = {0, 0, 0};
  for (int i = 0; (!cut[0] || !cut[1] || !cut[2]) && lh_time_now() - t0 < 8; i++) {
    if (!cut[0] && send(fds[0], req + i, 1, MSG_NOSIGNAL) != 1) cut[0] = lh_time_now() - t0;
    if (!cut[2] && send(fds[2], "x", 1, MSG_NOSIGNAL) != 1) cut[2] = lh_time_now() - t0;
    note_closures(fds, cut, 3, 1000, t0);
  }
  for (int k = 0; k < 3; k++)
    close(fds[k]);
  if (cut[0] < 1.5 || cut[0] > 4.5)
    fail_msg("a client trickling its headers was cut off after %.2f s (timeout 2 s)", cut[0]);
  if (cut[1] < 1.5 || cut[1] > 4.5)
    fail_msg("a silent client was cut off after %.2f s (timeout 2 s)", cut[1]);
  if (cut[2] < 2.5 || cut[2] > 5.5)
    fail_msg("a client trickling its body was cut off after %.2f s (body timeout 3 s)", cut[2]);
  pthread_join(t, NULL);
  assert_int_equal(b.e, LH_ERR_OK);
  assert_int_equal(b.status, 200);
  assert_true(b.took >= 2.9);
  lh_http_server_stop(s);
}

static void test_connection_limits(void **state) {
  (void)state;
  for (int per_ip = 0; per_ip < 2; per_ip++) {
    /* two connections at most: overall, then per address (all of ours are 127.0.0.1) */
    lh_http_server *s = per_ip ? start(5, 8, 2) : start(5, 2, 0);
    int port = lh_http_server_port(s);
    int a = raw_connect(port), b = raw_connect(port);
    sleep_ms(50);
    int third = raw_connect(port); /* the kernel accepts; the server closes it at once */
    assert_true(raw_closed_within(third, 1000));
    close(third);
    lh_http_client *c = client_for(s);
    lh_http_reply r;
    expect_err(lh_http_client_request(c, "GET", "/hello", NULL, 0, NULL, 0, 100, 2000, &r),
               LH_ERR_IO, "/hello");
    close(a);
    lh_err e = LH_ERR_IO;
    for (int i = 0; i < 50 && e; i++) { /* the server notices the closed one */
      sleep_ms(20);
      e = lh_http_client_request(c, "GET", "/hello", NULL, 0, NULL, 0, 100, 2000, &r);
    }
    if (e) fail_msg("a freed connection was not reused: %s", lh_last_error());
    assert_int_equal(r.status, 200);
    lh_http_reply_free(&r);
    close(b);
    lh_http_client_free(c);
    lh_http_server_stop(s);
  }
}

static void test_stop_while_blocked(void **state) {
  (void)state;
  lh_http_server *s = start(10, 0, 0);
  atomic_store(&F.entered, 0);
  atomic_store(&F.saw_stop, 0);
  atomic_store(&F.on_stop_calls, 0);
  bg_request b = {s, "/block", 20000, 0, 0, 0};
  pthread_t t;
  pthread_create(&t, NULL, bg_main, &b);
  for (int i = 0; i < 200 && !atomic_load(&F.entered); i++)
    sleep_ms(10);
  assert_true(atomic_load(&F.entered));
  double t0 = lh_time_now();
  lh_http_server_stop(s);
  double took = lh_time_now() - t0;
  if (took > 2) fail_msg("stop took %.2f s while a handler waited", took);
  assert_int_equal(atomic_load(&F.saw_stop), 1);
  assert_int_equal(atomic_load(&F.on_stop_calls), 1);
  pthread_join(t, NULL);
  assert_true(b.took < 5); /* the client got an answer (503) or a closed connection at once */
  assert_true(b.e != LH_ERR_OK || b.status == 503);
  lh_http_server_stop(NULL);
}

/* ---------------------------------------------------------------- downloads */

static void write_bytes(const char *path, const void *data, size_t n) {
  expect_ok(lh_file_write_atomic(path, data, n));
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static void expect_downloaded(const char *dest) {
  char *got = NULL, part[400];
  size_t n = 0;
  expect_ok(lh_file_read(dest, 1 << 20, &got, &n));
  assert_int_equal(n, FILE_SIZE);
  assert_memory_equal(got, F.content, FILE_SIZE);
  free(got);
  snprintf(part, sizeof part, "%s.part", dest);
  assert_false(exists(part));
  unlink(dest);
}

static void last_range(char *out, size_t cap) {
  pthread_mutex_lock(&F.mu);
  snprintf(out, cap, "%s", F.last_range);
  pthread_mutex_unlock(&F.mu);
}

static void test_download(void **state) {
  (void)state;
  lh_http_server *s = start(10, 0, 0);
  lh_http_client *c = client_for(s);
  char dest[320], part[330], range[64];
  snprintf(dest, sizeof dest, "%s/got", F.dir);
  snprintf(part, sizeof part, "%s.part", dest);
  lh_http_reply meta;

  /* fresh */
  expect_ok(lh_http_client_download(c, "/file", dest, 1 << 20, 5000, &meta));
  assert_int_equal(meta.status, 200);
  assert_string_equal(lh_http_reply_header(&meta, "etag"), "\"abc123\"");
  lh_http_reply_free(&meta);
  last_range(range, sizeof range);
  assert_string_equal(range, "");
  expect_downloaded(dest);
  /* resumed from a part file of the first 100000 bytes: one request for the rest */
  write_bytes(part, F.content, 100000);
  expect_ok(lh_http_client_download(c, "/file", dest, 1 << 20, 5000, &meta));
  assert_int_equal(meta.status, 206);
  lh_http_reply_free(&meta);
  last_range(range, sizeof range);
  assert_string_equal(range, "bytes=100000-");
  expect_downloaded(dest);
  /* a server that answers 200 to the range: the part file (garbage here) starts again */
  write_bytes(part, "garbage garbage", 15);
  expect_ok(lh_http_client_download(c, "/whole", dest, 1 << 20, 5000, NULL));
  last_range(range, sizeof range);
  assert_string_equal(range, "bytes=15-");
  expect_downloaded(dest);
  /* a part file that is complete already: 416 of its size, renamed */
  write_bytes(part, F.content, FILE_SIZE);
  expect_ok(lh_http_client_download(c, "/file", dest, 1 << 20, 5000, NULL));
  expect_downloaded(dest);
  /* a part file longer than the file: 416 of another size, started again */
  uint8_t *longer = calloc(FILE_SIZE + 10, 1);
  write_bytes(part, longer, FILE_SIZE + 10);
  free(longer);
  expect_ok(lh_http_client_download(c, "/file", dest, 1 << 20, 5000, NULL));
  expect_downloaded(dest);
  /* over max_bytes: refused, nothing left (a fresh start, a resume, a 200 without length) */
  expect_err(lh_http_client_download(c, "/file", dest, 1000, 5000, NULL), LH_ERR_LIMIT,
             "more than the limit of 1000");
  assert_false(exists(part) || exists(dest));
  write_bytes(part, F.content, 500);
  expect_err(lh_http_client_download(c, "/file", dest, 1000, 5000, NULL), LH_ERR_LIMIT, "limit");
  assert_false(exists(part) || exists(dest));
  /* a 206 that starts elsewhere than asked: refused, the part file removed */
  write_bytes(part, F.content, 50);
  expect_err(lh_http_client_download(c, "/badrange", dest, 1 << 20, 5000, NULL), LH_ERR_MISMATCH,
             "starts at 0");
  assert_false(exists(part) || exists(dest));
  /* 404: NOTFOUND with the status and error body in meta; nothing written */
  expect_err(lh_http_client_download(c, "/missing", dest, 1 << 20, 5000, &meta), LH_ERR_NOTFOUND,
             "HTTP 404");
  expect_error_body(&meta, 404, "not_found");
  lh_http_reply_free(&meta);
  assert_false(exists(dest));
  /* a transport failure keeps the part file for the next try */
  lh_http_client_free(c);
  int port = lh_http_server_port(s);
  lh_http_server_stop(s);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
  expect_ok(lh_http_client_create(url, &c));
  write_bytes(part, F.content, 1234);
  expect_err(lh_http_client_download(c, "/file", dest, 1 << 20, 2000, NULL), LH_ERR_IO, url);
  struct stat st;
  assert_int_equal(stat(part, &st), 0);
  assert_int_equal(st.st_size, 1234);
  unlink(part);
  lh_http_reply r;
  expect_err(lh_http_client_request(c, "GET", "/hello", NULL, 0, NULL, 0, 100, 2000, &r), LH_ERR_IO,
             "/hello");
  lh_http_client_free(c);
}

static void test_server_config(void **state) {
  (void)state;
  lh_http_server *s = NULL;
  lh_http_server_config c = {.handler = handler, .host = "localhost"};
  expect_err(lh_http_server_start(&c, &s), LH_ERR_INVAL, "expected an IPv4 or IPv6 address");
  c.host = "127.0.0.1";
  c.port = 70000;
  expect_err(lh_http_server_start(&c, &s), LH_ERR_INVAL, "port 70000");
  c.port = 0;
  c.timeout_s = -1;
  expect_err(lh_http_server_start(&c, &s), LH_ERR_INVAL, "negative");
  c.timeout_s = 0;
  c.handler = NULL;
  expect_err(lh_http_server_start(&c, &s), LH_ERR_INVAL, "no handler");
  /* a port in use */
  lh_http_server *a = start(5, 0, 0);
  c.handler = handler;
  c.port = lh_http_server_port(a);
  expect_err(lh_http_server_start(&c, &s), LH_ERR_IO, "cannot listen");
  assert_null(s);
  lh_http_server_stop(a);
  /* IPv6 loopback, where the machine has it */
  c.host = "::1";
  c.port = 0;
  if (lh_http_server_start(&c, &s) == LH_ERR_OK) {
    char url[64];
    snprintf(url, sizeof url, "http://[::1]:%d", lh_http_server_port(s));
    lh_http_client *cl = NULL;
    expect_ok(lh_http_client_create(url, &cl));
    lh_http_reply r;
    expect_ok(lh_http_client_request(cl, "POST", "/echo", NULL, 0, "x", 1, 100, 2000, &r));
    assert_int_equal(strncmp(lh_http_reply_header(&r, "x-peer"), "[::1]:", 6), 0);
    lh_http_reply_free(&r);
    lh_http_client_free(cl);
    lh_http_server_stop(s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_range),
      cmocka_unit_test(test_content_range_and_etag),
      cmocka_unit_test(test_query),
      cmocka_unit_test(test_round_trips),
      cmocka_unit_test(test_body_limits),
      cmocka_unit_test(test_files),
      cmocka_unit_test(test_long_poll),
      cmocka_unit_test(test_slow_clients),
      cmocka_unit_test(test_connection_limits),
      cmocka_unit_test(test_stop_while_blocked),
      cmocka_unit_test(test_download),
      cmocka_unit_test(test_server_config),
  };
  return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}
