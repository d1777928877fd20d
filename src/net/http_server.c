/* longhaul net: the HTTP server of `longhaul serve` over libmicrohttpd (http.h). One thread per
 * connection, so a handler may block (a long poll) without stalling other connections; bodies are
 * bounded per route before they are read and handed over whole; a watchdog thread cuts off
 * connections whose headers or body arrive too slowly; files are streamed from descriptors. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "longhaul/http.h"

#define ERROR_MESSAGE_MAX 1024
#define WATCH_TICK_MS     100
#define LINGER_S          1.0
#define LINGER_BYTES      ((size_t)8 << 20)

/* A connection the watchdog may cut off: its socket and the time by which what it is sending now
 * (headers, or a body) must have arrived; 0: no deadline (a handler runs or a response goes). */
typedef struct watch_slot {
  int fd;
  bool used;
  double deadline;
} watch_slot;

struct lh_http_server {
  struct MHD_Daemon *daemon;
  lh_http_server_config cfg; /* zero fields replaced by their defaults; host points to host[] */
  char host[INET6_ADDRSTRLEN];
  int port;
  atomic_bool stopping;
  pthread_mutex_t mu; /* guards the slots and quit */
  pthread_cond_t cv;
  pthread_t watchdog;
  bool watchdog_started, quit;
  watch_slot *slots;
  int n_slots;
};

/* One request: made when its request line arrives (the URI callback), freed when it completes. */
typedef struct req_state {
  lh_http_server *s;
  struct MHD_Connection *conn;
  char *path;        /* the request target as sent, cut at '?' */
  const char *query; /* into path's allocation, after the '?' ("" when none) */
  uint8_t *body;
  size_t len, cap, limit;
  bool started, too_big, no_memory;
  bool lingered; /* what the client still sent after a 413 was read and dropped */
  char peer[INET6_ADDRSTRLEN + 16];
  int64_t arrived_ms; /* the wall clock when the request line arrived */
} req_state;

/* ---------------------------------------------------------------- responses */

static bool is_tchar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool header_value_ok(const char *v) {
  for (; *v; v++)
    if (((unsigned char)*v < 0x20 && *v != '\t') || *v == 0x7f) return false;
  return true;
}

static void response_clear_body(lh_http_response *res) {
  free(res->body);
  res->body = NULL;
  res->body_len = 0;
  free(res->file_path);
  res->file_path = NULL;
  free(res->etag);
  res->etag = NULL;
  if (res->file_fd >= 0) close(res->file_fd);
  res->file_fd = -1;
  res->file_size = 0;
}

static void response_free(lh_http_response *res) {
  response_clear_body(res);
  free(res->content_type);
  res->content_type = NULL;
  for (int i = 0; i < res->n_headers; i++) {
    free(res->headers[i].name);
    free(res->headers[i].value);
  }
  res->n_headers = 0;
}

static lh_err set_content_type(lh_http_response *res, const char *content_type) {
  if (!content_type) return LH_ERR_OK;
  if (!header_value_ok(content_type))
    return lh_errorf(LH_ERR_INVAL, "http response: content type holds a control byte");
  char *ct = strdup(content_type);
  if (!ct) return lh_errorf(LH_ERR_NOMEM, "http response: out of memory");
  free(res->content_type);
  res->content_type = ct;
  return LH_ERR_OK;
}

lh_err lh_http_respond_bytes(lh_http_response *res, int status, const char *content_type,
                             const void *data, size_t len) {
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return lh_errorf(LH_ERR_NOMEM, "http response: cannot allocate %zu bytes", len);
  lh_err e = set_content_type(res, content_type);
  if (e) {
    free(copy);
    return e;
  }
  if (len) memcpy(copy, data, len);
  response_clear_body(res);
  res->status = status;
  res->body = copy;
  res->body_len = len;
  return LH_ERR_OK;
}

lh_err lh_http_respond_json(lh_http_response *res, int status, const json_t *v) {
  char *text = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  if (!text) return lh_errorf(LH_ERR_INVAL, "http response: the JSON value cannot be encoded");
  lh_err e = lh_http_respond_bytes(res, status, "application/json", text, strlen(text));
  free(text);
  return e;
}

lh_err lh_http_respond_error(lh_http_response *res, int status, const char *code, const char *fmt,
                             ...) {
  char msg[ERROR_MESSAGE_MAX];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
  json_t *m = lh_json_text(msg, len), *c = lh_json_text(code, strlen(code));
  json_t *v = m && c ? json_pack("{s:{s:o,s:o}}", "error", "code", c, "message", m) : NULL;
  if (!v) {
    json_decref(m);
    json_decref(c);
    return lh_errorf(LH_ERR_NOMEM, "http response: out of memory");
  }
  lh_err e = lh_http_respond_json(res, status, v);
  json_decref(v);
  return e;
}

lh_err lh_http_respond_file(lh_http_response *res, const char *path, const char *etag,
                            const char *cache_control) {
  char *quoted = NULL, *copy = NULL;
  int fd = -1;
  lh_err e = LH_ERR_OK;
  if (etag) {
    for (const char *p = etag; *p; p++)
      if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f || *p == '"' || *p == '\\')
        return lh_errorf(LH_ERR_INVAL,
                         "http response: etag \"%s\": expected printable ASCII "
                         "without quotes or backslashes",
                         etag);
    size_t n = strlen(etag) + 3;
    if (!(quoted = malloc(n))) return lh_errorf(LH_ERR_NOMEM, "http response: out of memory");
    snprintf(quoted, n, "\"%s\"", etag);
  }
  if (cache_control && !header_value_ok(cache_control)) {
    e = lh_errorf(LH_ERR_INVAL, "http response: Cache-Control holds a control byte");
    goto fail;
  }
  struct stat st;
  if (access(path, F_OK) != 0 && errno == ENOENT) {
    e = lh_errorf(LH_ERR_NOTFOUND, "%s: no such file", path);
    goto fail;
  }
  if ((e = lh_file_open_read(path, &fd))) goto fail;
  if (fstat(fd, &st) != 0) {
    e = lh_errorf(LH_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    goto fail;
  }
  if (!(copy = strdup(path))) {
    e = lh_errorf(LH_ERR_NOMEM, "http response: out of memory");
    goto fail;
  }
  if (cache_control && (e = lh_http_response_header(res, "Cache-Control", cache_control)))
    goto fail;
  response_clear_body(res);
  res->status = 200;
  res->file_path = copy;
  res->file_fd = fd;
  res->file_size = (uint64_t)st.st_size;
  res->etag = quoted;
  return LH_ERR_OK;
fail:
  if (fd >= 0) close(fd);
  free(copy);
  free(quoted);
  return e;
}

lh_err lh_http_response_header(lh_http_response *res, const char *name, const char *value) {
  static const char *const reserved[] = {"Content-Type", "Content-Length", "Transfer-Encoding",
                                         "Connection",   "ETag",           "Date"};
  if (!*name) return lh_errorf(LH_ERR_INVAL, "http response: empty header name");
  for (const char *p = name; *p; p++)
    if (!is_tchar((unsigned char)*p))
      return lh_errorf(LH_ERR_INVAL, "http response: header name \"%s\" is not a token", name);
  for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
    if (!strcasecmp(name, reserved[i]))
      return lh_errorf(LH_ERR_INVAL, "http response: the server writes %s itself", reserved[i]);
  if (!header_value_ok(value))
    return lh_errorf(LH_ERR_INVAL, "http response: header %s: the value holds a control byte",
                     name);
  if (!*value) /* libmicrohttpd sends no header with an empty value */
    return lh_errorf(LH_ERR_INVAL, "http response: header %s: empty value", name);
  if (res->n_headers >= LH_HTTP_MAX_EXTRA_HEADERS)
    return lh_errorf(LH_ERR_LIMIT, "http response: more than %d extra headers",
                     LH_HTTP_MAX_EXTRA_HEADERS);
  char *n = strdup(name), *v = strdup(value);
  if (!n || !v) {
    free(n);
    free(v);
    return lh_errorf(LH_ERR_NOMEM, "http response: out of memory");
  }
  res->headers[res->n_headers].name = n;
  res->headers[res->n_headers].value = v;
  res->n_headers++;
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- the watchdog */

static watch_slot *conn_slot(lh_http_server *s, struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  intptr_t i = ci ? (intptr_t)ci->socket_context : 0;
  return i > 0 && i <= s->n_slots ? &s->slots[i - 1] : NULL;
}

/* What conn sends next must arrive within `seconds` (0: no deadline). */
static void watch_set(lh_http_server *s, struct MHD_Connection *conn, int seconds) {
  pthread_mutex_lock(&s->mu);
  watch_slot *w = conn_slot(s, conn);
  if (w) w->deadline = seconds ? lh_time_now() + seconds : 0;
  pthread_mutex_unlock(&s->mu);
}

/* Slots are taken when libmicrohttpd has accepted a socket and released before it closes it (its
 * "closed" notification precedes the close), so a socket shut down here is never a reused one. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  lh_http_server *s = cls;
  pthread_mutex_lock(&s->mu);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    *socket_context = NULL;
    for (int i = 0; ci && i < s->n_slots; i++) {
      if (s->slots[i].used) continue;
      s->slots[i] = (watch_slot){ci->connect_fd, true, lh_time_now() + s->cfg.timeout_s};
      *socket_context = (void *)(intptr_t)(i + 1);
      break;
    }
  } else {
    intptr_t i = (intptr_t)*socket_context;
    if (i > 0 && i <= s->n_slots) s->slots[i - 1].used = false;
    *socket_context = NULL;
  }
  pthread_mutex_unlock(&s->mu);
}

static void *watchdog_main(void *arg) {
  lh_http_server *s = arg;
  pthread_mutex_lock(&s->mu);
  while (!s->quit) {
    double now = lh_time_now();
    for (int i = 0; i < s->n_slots; i++) {
      watch_slot *w = &s->slots[i];
      if (!w->used || w->deadline == 0 || now < w->deadline) continue;
      lh_log(LH_LOG_DEBUG, "http: connection %d too slow, cut off", w->fd);
      shutdown(w->fd, SHUT_RDWR);
      w->deadline = 0;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += WATCH_TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* ---------------------------------------------------------------- requests */

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
  lh_http_server *s = cls;
  req_state *st = calloc(1, sizeof *st);
  if (!st || !(st->path = strdup(uri))) {
    free(st);
    return NULL;
  }
  st->s = s;
  st->conn = conn;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  st->arrived_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  char *q = strchr(st->path, '?');
  st->query = "";
  if (q) {
    *q = 0;
    st->query = q + 1;
  }
  return st;
}

/* A 413 answered before its body was read ends the connection, and closing a socket with unread
 * bytes resets it: the client, still sending, may see "broken pipe" before it reads the 413. So
 * the server first stops writing and reads and drops what arrives until the client closes, for
 * LINGER_S and LINGER_BYTES at most. On the connection's own thread, before libmicrohttpd
 * closes the socket (in its completion notification, or before the answer to the handler
 * call). */
static void linger(req_state *st) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(st->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci || st->lingered) return;
  st->lingered = true;
  int fd = ci->connect_fd;
  shutdown(fd, SHUT_WR);
  double deadline = lh_time_now() + LINGER_S;
  char sink[4096];
  size_t dropped = 0;
  while (dropped < LINGER_BYTES) {
    int left = (int)((deadline - lh_time_now()) * 1000);
    struct pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
    ssize_t r = recv(fd, sink, sizeof sink, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) break;
    if (r > 0) dropped += (size_t)r;
  }
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  lh_http_server *s = cls;
  req_state *st = *con_cls;
  if (st && st->too_big && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) linger(st);
  if (st) {
    free(st->path);
    free(st->body);
    free(st);
    *con_cls = NULL;
  }
  watch_set(s, conn, s->cfg.timeout_s); /* the next request's headers, on a kept-alive one */
}

/* The URL is kept as sent: handlers see the raw path and query. */
static size_t no_unescape(void *cls, struct MHD_Connection *conn, char *s) {
  return strlen(s);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  char buf[512];
  vsnprintf(buf, sizeof buf, fmt, ap);
  size_t n = strlen(buf);
  while (n && buf[n - 1] == '\n')
    buf[--n] = 0;
  lh_log(LH_LOG_DEBUG, "http: libmicrohttpd: %s", buf);
}

static void format_peer(struct MHD_Connection *conn, char *out, size_t cap) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  char ip[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ci->client_addr;
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    port = ntohs(a->sin_port);
    snprintf(out, cap, "%s:%d", ip, port);
  } else if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ci->client_addr;
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    port = ntohs(a->sin6_port);
    snprintf(out, cap, "[%s]:%d", ip, port);
  } else {
    snprintf(out, cap, "?");
  }
}

const char *lh_http_request_header(const lh_http_request *r, const char *name) {
  const req_state *st = r->internal;
  return MHD_lookup_connection_value(st->conn, MHD_HEADER_KIND, name);
}

bool lh_http_request_stopping(const lh_http_request *r) {
  const req_state *st = r->internal;
  return lh_http_server_stopping(st->s);
}

static bool add_header(struct MHD_Response *r, const char *name, const char *value) {
  return MHD_add_response_header(r, name, value) == MHD_YES;
}

/* The MHD response of a file: 304, 206, 416 or 200 as the request asks (http.h). */
static struct MHD_Response *file_response(req_state *st, const char *method, lh_http_response *res,
                                          int *status) {
  uint64_t size = res->file_size, start = 0, len = size;
  const char *inm = MHD_lookup_connection_value(st->conn, MHD_HEADER_KIND, "If-None-Match");
  if (res->etag && inm && lh_http_etag_match(inm, res->etag)) {
    *status = 304;
    return MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  }
  const char *range = MHD_lookup_connection_value(st->conn, MHD_HEADER_KIND, "Range");
  const char *if_range = MHD_lookup_connection_value(st->conn, MHD_HEADER_KIND, "If-Range");
  if (strcmp(method, "GET") != 0 || (if_range && (!res->etag || strcmp(if_range, res->etag))))
    range = NULL; /* Range is for GET; an If-Range that is not our tag asks for the whole */
  lh_http_range r = lh_http_parse_range(range, size, &start, &len);
  char cr[80];
  if (r == LH_HTTP_RANGE_UNSATISFIABLE) {
    response_clear_body(res);
    lh_http_respond_error(res, 416, "range_not_satisfiable",
                          "Range \"%.200s\" lies outside the %llu bytes of the file", range,
                          (unsigned long long)size);
    *status = 416;
    snprintf(cr, sizeof cr, "bytes */%llu", (unsigned long long)size);
    struct MHD_Response *m =
        MHD_create_response_from_buffer(res->body_len, res->body, MHD_RESPMEM_MUST_FREE);
    if (m) res->body = NULL;
    if (m && (!add_header(m, "Content-Range", cr) || !add_header(m, "Accept-Ranges", "bytes")))
      MHD_destroy_response(m), m = NULL;
    return m;
  }
  struct MHD_Response *m = MHD_create_response_from_fd_at_offset64(len, res->file_fd, start);
  if (!m) return NULL;
  res->file_fd = -1; /* the response owns it now */
  *status = 200;
  if (r == LH_HTTP_RANGE_ONE) {
    *status = 206;
    snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)start,
             (unsigned long long)(start + len - 1), (unsigned long long)size);
    if (!add_header(m, "Content-Range", cr)) MHD_destroy_response(m), m = NULL;
  }
  return m;
}

/* Queues what the handler left in res (or a 500 when it left no status) and frees res. */
static enum MHD_Result send_response(req_state *st, const char *method, lh_http_response *res) {
  if (res->status < 100 || res->status > 599) {
    int bad = res->status;
    response_clear_body(res);
    lh_http_respond_error(res, 500, "internal", "the handler gave status %d", bad);
    res->status = 500;
  }
  int status = res->status;
  struct MHD_Response *m;
  if (res->file_fd >= 0) {
    m = file_response(st, method, res, &status);
  } else {
    m = MHD_create_response_from_buffer(res->body_len, res->body ? (void *)res->body : (void *)"",
                                        res->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (m) res->body = NULL;
  }
  bool ok = m != NULL;
  if (ok && res->etag) ok = add_header(m, "ETag", res->etag);
  if (ok && res->file_path) ok = add_header(m, "Accept-Ranges", "bytes");
  if (ok) {
    const char *ct = res->content_type ? res->content_type : "application/octet-stream";
    if (status == 416) ct = "application/json";
    ok = add_header(m, "Content-Type", ct);
  }
  for (int i = 0; ok && i < res->n_headers; i++)
    ok = add_header(m, res->headers[i].name, res->headers[i].value);
  enum MHD_Result q = ok ? MHD_queue_response(st->conn, (unsigned)status, m) : MHD_NO;
  if (m) MHD_destroy_response(m);
  response_free(res);
  if (!ok) { /* out of memory, most likely: a bare 500, or the connection closes */
    lh_log(LH_LOG_DEBUG, "http: %s %s: the response could not be built", method, st->path);
    static const char body[] = "{\"error\":{\"code\":\"internal\",\"message\":\"no response\"}}";
    m = MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    if (m && add_header(m, "Content-Type", "application/json"))
      q = MHD_queue_response(st->conn, 500, m);
    if (m) MHD_destroy_response(m);
  }
  return q;
}

static enum MHD_Result send_error(req_state *st, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result send_error(req_state *st, int status, const char *code, const char *fmt,
                                  ...) {
  lh_http_response res = {.file_fd = -1};
  char msg[ERROR_MESSAGE_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (lh_http_respond_error(&res, status, code, "%s", msg)) {
    response_free(&res);
    return MHD_NO;
  }
  return send_response(st, "", &res);
}

/* Decimal Content-Length, or false when absent or not a plain number (libmicrohttpd refuses
 * those itself). */
static bool content_length(struct MHD_Connection *conn, uint64_t *n) {
  const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
  if (!v || !*v) return false;
  uint64_t x = 0;
  for (; *v; v++) {
    if (*v < '0' || *v > '9') return false;
    unsigned d = (unsigned)(*v - '0');
    x = x > (UINT64_MAX - d) / 10 ? UINT64_MAX : x * 10 + d;
  }
  *n = x;
  return true;
}

/* The request's headers are complete: the body limit, checked against Content-Length. */
static enum MHD_Result request_start(req_state *st, const char *method) {
  lh_http_server *s = st->s;
  st->started = true;
  format_peer(st->conn, st->peer, sizeof st->peer);
  st->limit =
      s->cfg.max_body ? s->cfg.max_body(s->cfg.ud, method, st->path) : s->cfg.max_body_default;
  watch_set(s, st->conn, s->cfg.body_timeout_s);
  uint64_t n;
  if (content_length(st->conn, &n) && n > st->limit) {
    st->too_big = true;
    return send_error(st, 413, "body_too_large",
                      "%s %.200s takes a body of at most %zu bytes, the request declares %llu",
                      method, st->path, st->limit, (unsigned long long)n);
  }
  return MHD_YES;
}

/* Appends a piece of the body, or marks it too big (and forgets it). */
static void request_body(req_state *st, const char *data, size_t n) {
  if (st->too_big || st->no_memory) return;
  if (n > st->limit - st->len) {
    st->too_big = true;
    free(st->body);
    st->body = NULL;
    st->len = st->cap = 0;
    return;
  }
  if (st->len + n + 1 > st->cap) {
    size_t cap = st->cap ? st->cap : 4096;
    while (cap < st->len + n + 1)
      cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    if (cap > st->limit + 1) cap = st->limit + 1;
    uint8_t *b = realloc(st->body, cap);
    if (!b) {
      st->no_memory = true;
      return;
    }
    st->body = b;
    st->cap = cap;
  }
  memcpy(st->body + st->len, data, n);
  st->len += n;
}

/* Sends all of buf[0, n) on the non-blocking socket fd within the deadline. */
static bool send_all(int fd, const char *buf, size_t n, double deadline) {
  while (n) {
    ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
    if (w > 0) {
      buf += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    int left = (int)((deadline - lh_time_now()) * 1000);
    struct pollfd p = {fd, POLLOUT, 0};
    if (left <= 0 || poll(&p, 1, left) < 0) return false;
  }
  return true;
}

/* A body that grew past its limit while it was read (chunked): libmicrohttpd 0.9.75 queues no
 * response in the middle of a body, so the 413 is written here, on the connection's own thread
 * before libmicrohttpd has written anything of its own, and the connection is closed after a
 * linger (below). */
static enum MHD_Result cut_off(req_state *st, const char *method) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(st->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return MHD_NO;
  int fd = ci->connect_fd;
  char body[ERROR_MESSAGE_MAX], head[256];
  lh_http_response res = {.file_fd = -1};
  if (lh_http_respond_error(&res, 413, "body_too_large",
                            "%s %.200s takes a body of at most %zu bytes, the request sent more",
                            method, st->path, st->limit) ||
      res.body_len >= sizeof body) {
    response_free(&res);
    return MHD_NO;
  }
  memcpy(body, res.body, res.body_len);
  size_t n = res.body_len;
  response_free(&res);
  int h = snprintf(head, sizeof head,
                   "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   n);
  double deadline = lh_time_now() + LINGER_S;
  if (send_all(fd, head, (size_t)h, deadline) && send_all(fd, body, n, deadline)) linger(st);
  return MHD_NO; /* libmicrohttpd closes the connection */
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  lh_http_server *s = cls;
  req_state *st = *con_cls;
  if (!st) return MHD_NO; /* no memory for the request's state: close */
  if (!st->started) return request_start(st, method);
  if (*upload_size) {
    request_body(st, upload, *upload_size);
    *upload_size = 0;
    return st->too_big ? cut_off(st, method) : MHD_YES;
  }
  if (st->too_big) return MHD_YES; /* answered already */
  if (st->no_memory)
    return send_error(st, 500, "out_of_memory", "no memory for a body of %zu bytes", st->len);
  watch_set(s, conn, 0);
  lh_http_request req = {method,  st->path, st->query, st->body ? st->body : (const uint8_t *)"",
                         st->len, st->peer, st,        st->arrived_ms};
  if (st->body) st->body[st->len] = 0;
  lh_http_response res = {.file_fd = -1};
  s->cfg.handler(s->cfg.ud, &req, &res);
  return send_response(st, method, &res);
}

/* ---------------------------------------------------------------- start and stop */

static lh_err parse_host(const char *host, int port, struct sockaddr_storage *ss, bool *v6) {
  memset(ss, 0, sizeof *ss);
  struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    *v6 = false;
    return LH_ERR_OK;
  }
  if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    *v6 = true;
    return LH_ERR_OK;
  }
  return lh_errorf(LH_ERR_INVAL, "http server: host \"%s\": expected an IPv4 or IPv6 address",
                   host);
}

static lh_err check_config(const lh_http_server_config *c) {
  if (!c->handler) return lh_errorf(LH_ERR_INVAL, "http server: no handler");
  if (c->port < 0 || c->port > 65535)
    return lh_errorf(LH_ERR_INVAL, "http server: port %d: expected 0 .. 65535", c->port);
  if (c->max_connections < 0 || c->max_per_ip < 0 || c->timeout_s < 0 || c->body_timeout_s < 0)
    return lh_errorf(LH_ERR_INVAL,
                     "http server: negative limit (max_connections %d, max_per_ip "
                     "%d, timeout_s %d, body_timeout_s %d)",
                     c->max_connections, c->max_per_ip, c->timeout_s, c->body_timeout_s);
  if (c->max_connections > 100000 || c->timeout_s > 86400 || c->body_timeout_s > 86400)
    return lh_errorf(LH_ERR_INVAL,
                     "http server: limit out of range (max_connections %d, "
                     "timeout_s %d, body_timeout_s %d)",
                     c->max_connections, c->timeout_s, c->body_timeout_s);
  return LH_ERR_OK;
}

static void server_free(lh_http_server *s) {
  if (s->watchdog_started) {
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->watchdog, NULL);
  }
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s->slots);
  free(s);
}

lh_err lh_http_server_start(const lh_http_server_config *c, lh_http_server **out) {
  *out = NULL;
  lh_err e = check_config(c);
  if (e) return e;
  lh_http_server *s = calloc(1, sizeof *s);
  if (!s) return lh_errorf(LH_ERR_NOMEM, "http server: out of memory");
  s->cfg = *c;
  snprintf(s->host, sizeof s->host, "%s", c->host ? c->host : "127.0.0.1");
  s->cfg.host = s->host;
  if (!s->cfg.max_body_default) s->cfg.max_body_default = LH_HTTP_DEFAULT_MAX_BODY;
  if (!s->cfg.max_connections) s->cfg.max_connections = 64;
  if (!s->cfg.timeout_s) s->cfg.timeout_s = 30;
  if (!s->cfg.body_timeout_s) s->cfg.body_timeout_s = 10 * s->cfg.timeout_s;
  atomic_init(&s->stopping, false);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&s->mu, NULL);
  struct sockaddr_storage ss;
  bool v6 = false;
  if ((e = parse_host(s->host, c->port, &ss, &v6))) goto fail;
  s->n_slots = s->cfg.max_connections + 8;
  if (!(s->slots = calloc((size_t)s->n_slots, sizeof *s->slots))) {
    e = lh_errorf(LH_ERR_NOMEM, "http server: out of memory");
    goto fail;
  }
  if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
    e = lh_errorf(LH_ERR_NOMEM, "http server: cannot start the watchdog thread");
    goto fail;
  }
  s->watchdog_started = true;
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                   MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
  s->daemon = MHD_start_daemon(
      flags, (uint16_t)c->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log,
      s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned)s->cfg.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)s->cfg.max_per_ip, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.timeout_s,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)LH_HTTP_MAX_HEADER_BYTES,
      MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_UNESCAPE_CALLBACK, no_unescape, s,
      MHD_OPTION_END);
  if (!s->daemon) {
    e = lh_errorf(LH_ERR_IO,
                  "http server: cannot listen on %s port %d (in use, or not an "
                  "address of this machine)",
                  s->host, c->port);
    goto fail;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : c->port;
  *out = s;
  return LH_ERR_OK;
fail:
  server_free(s);
  return e;
}

int lh_http_server_port(const lh_http_server *s) {
  return s->port;
}

bool lh_http_server_stopping(const lh_http_server *s) {
  return atomic_load(&s->stopping);
}

void lh_http_server_stop(lh_http_server *s) {
  if (!s) return;
  atomic_store(&s->stopping, true);
  if (s->cfg.on_stop) s->cfg.on_stop(s->cfg.ud);
  MHD_stop_daemon(s->daemon); /* stops listening, shuts the sockets, joins every thread */
  server_free(s);
}
