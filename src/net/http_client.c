/* longhaul net: the HTTP client of `longhaul worker` over libcurl (http.h). One easy handle per
 * client keeps its connection alive between requests; reply bodies and headers are bounded as
 * they arrive (reading stops at the bound); downloads go to DEST.part, resume with a Range and
 * are renamed into place when complete. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/http.h"

#define ERROR_BODY_MAX   65536 /* what a download keeps of an HTTP error's body */
#define STALL_SECONDS    60    /* a transfer that moves no byte this long fails */
#define CONNECT_MAX_MS   30000
#define FAIL_MESSAGE_MAX 512

struct lh_http_client {
  CURL *easy;
  char *base; /* "http://host:port", no trailing '/' */
  char errbuf[CURL_ERROR_SIZE];
};

/* Where a reply's body goes: memory (bounded), or a download's part file. */
typedef enum { SINK_MEMORY, SINK_FILE, SINK_ERROR } sink_kind;

/* The state of one transfer, shared by the header and write callbacks. */
typedef struct xfer {
  long status;       /* of the last status line */
  bool headers_done; /* the final response's headers are in */
  /* headers as "name\0value\0" pairs, by offset until the reply takes them */
  char *hbytes;
  size_t hlen;
  int n_headers;
  size_t name_off[LH_HTTP_REPLY_MAX_HEADERS], value_off[LH_HTTP_REPLY_MAX_HEADERS];
  /* the body in memory */
  uint8_t *body;
  size_t len, cap, max_body;
  /* a download */
  bool download, head;
  bool error_cut; /* an HTTP error's body was longer than what is kept */
  sink_kind sink;
  int fd;
  uint64_t resume_from, written, max_file, total; /* total: of a 206's Content-Range */
  /* why a callback stopped the transfer (LH_ERR_OK: it did not) */
  lh_err fail;
  char fail_msg[FAIL_MESSAGE_MAX];
} xfer;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result = CURLE_FAILED_INIT;

static void curl_init_once(void) {
  curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static bool printable(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f) return false;
  return true;
}

lh_err lh_http_client_create(const char *base_url, lh_http_client **out) {
  *out = NULL;
  pthread_once(&curl_once, curl_init_once);
  if (curl_init_result != CURLE_OK)
    return lh_errorf(LH_ERR_IO, "http client: libcurl does not start: %s",
                     curl_easy_strerror(curl_init_result));
  char shown[128];
  lh_escape(base_url, strnlen(base_url, 512), shown, sizeof shown);
  size_t skip = !strncmp(base_url, "http://", 7) ? 7 : !strncmp(base_url, "https://", 8) ? 8 : 0;
  const char *host = base_url + skip, *slash = strchr(host, '/');
  if (!skip || !*host || slash == host || (slash && slash[1]) || !printable(base_url) ||
      strlen(base_url) > 2048)
    return lh_errorf(LH_ERR_INVAL, "http client: base URL \"%s\": expected http://HOST:PORT",
                     shown);
  lh_http_client *c = calloc(1, sizeof *c);
  if (!c || !(c->base = strdup(base_url))) {
    free(c);
    return lh_errorf(LH_ERR_NOMEM, "http client: out of memory");
  }
  size_t n = strlen(c->base);
  if (c->base[n - 1] == '/') c->base[n - 1] = 0;
  if (!(c->easy = curl_easy_init())) {
    lh_http_client_free(c);
    return lh_errorf(LH_ERR_NOMEM, "http client: curl_easy_init failed");
  }
  *out = c;
  return LH_ERR_OK;
}

void lh_http_client_free(lh_http_client *c) {
  if (!c) return;
  if (c->easy) curl_easy_cleanup(c->easy);
  free(c->base);
  free(c);
}

/* ---------------------------------------------------------------- replies */

const char *lh_http_reply_header(const lh_http_reply *r, const char *name) {
  for (int i = 0; i < r->n_headers; i++)
    if (!strcasecmp(r->headers[i].name, name)) return r->headers[i].value;
  return NULL;
}

void lh_http_reply_free(lh_http_reply *r) {
  if (!r) return;
  free(r->body);
  free(r->header_bytes);
  memset(r, 0, sizeof *r);
}

static void xfer_free(xfer *x) {
  free(x->hbytes);
  free(x->body);
  x->hbytes = NULL;
  x->body = NULL;
}

/* Moves x's status, headers and body into out. */
static void xfer_to_reply(xfer *x, lh_http_reply *out) {
  memset(out, 0, sizeof *out);
  out->status = x->status;
  out->body = x->body;
  out->len = x->len;
  out->header_bytes = x->hbytes;
  out->n_headers = x->n_headers;
  for (int i = 0; i < x->n_headers; i++) {
    out->headers[i].name = x->hbytes + x->name_off[i];
    out->headers[i].value = x->hbytes + x->value_off[i];
  }
  x->body = NULL;
  x->hbytes = NULL;
}

static size_t stop(xfer *x, lh_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static size_t stop(xfer *x, lh_err code, const char *fmt, ...) {
  if (x->fail == LH_ERR_OK) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->fail_msg, sizeof x->fail_msg, fmt, ap);
    va_end(ap);
    x->fail = code;
  }
  return 0; /* libcurl stops the transfer */
}

static const char *xfer_header(const xfer *x, const char *name) {
  for (int i = 0; i < x->n_headers; i++)
    if (!strcasecmp(x->hbytes + x->name_off[i], name)) return x->hbytes + x->value_off[i];
  return NULL;
}

static bool parse_u64(const char *s, uint64_t *v) {
  uint64_t x = 0;
  if (!*s) return false;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return false;
    unsigned d = (unsigned)(*s - '0');
    if (x > (UINT64_MAX - d) / 10) return false;
    x = x * 10 + d;
  }
  *v = x;
  return true;
}

/* A download's final headers are in: where its body goes (http.h, lh_http_client_download). */
static size_t download_decide(xfer *x) {
  uint64_t start, end, total, n;
  const char *cr = xfer_header(x, "Content-Range");
  const char *cl = xfer_header(x, "Content-Length");
  if (x->status == 206) {
    if (lh_http_parse_content_range(cr, &start, &end, &total))
      return stop(x, LH_ERR_FORMAT, "206 reply: %s", lh_last_error());
    if (start != x->resume_from)
      return stop(x, LH_ERR_MISMATCH,
                  "asked for bytes from %llu, the 206 reply starts at %llu (Content-Range: %s)",
                  (unsigned long long)x->resume_from, (unsigned long long)start, cr);
    if (total != UINT64_MAX && total > x->max_file)
      return stop(x, LH_ERR_LIMIT, "the file has %llu bytes, more than the limit of %llu",
                  (unsigned long long)total, (unsigned long long)x->max_file);
    x->sink = SINK_FILE;
    x->written = x->resume_from;
    x->total = total;
  } else if (x->status == 200) {
    if (cl && parse_u64(cl, &n) && n > x->max_file)
      return stop(x, LH_ERR_LIMIT, "the file has %llu bytes, more than the limit of %llu",
                  (unsigned long long)n, (unsigned long long)x->max_file);
    if (x->resume_from && (ftruncate(x->fd, 0) != 0 || lseek(x->fd, 0, SEEK_SET) != 0))
      return stop(x, LH_ERR_IO, "cannot truncate the part file: %s", strerror(errno));
    x->sink = SINK_FILE;
    x->written = 0;
    x->total = UINT64_MAX;
  } else {
    x->sink = SINK_ERROR; /* a 416 or an HTTP error: the body is kept in memory, bounded */
    x->max_body = ERROR_BODY_MAX;
  }
  return 1;
}

/* One header line of the reply: a status line starts a new response (after a 1xx), the empty
 * line ends the headers; others are kept within the bounds. */
static size_t on_header(char *line, size_t size, size_t nitems, void *ud) {
  xfer *x = ud;
  size_t n = size * nitems, total = n;
  while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
    n--;
  if (n >= 5 && !memcmp(line, "HTTP/", 5)) {
    const char *sp = memchr(line, ' ', n);
    x->status = sp && (size_t)(sp - line) + 4 <= n ? strtol(sp + 1, NULL, 10) : 0;
    x->n_headers = 0;
    x->hlen = 0;
    return total;
  }
  if (n == 0) {
    if (x->status >= 200) {
      x->headers_done = true;
      if (x->download && download_decide(x) == 0) return 0;
    }
    return total;
  }
  if (line[0] == ' ' || line[0] == '\t') return total; /* obsolete folding: dropped */
  const char *colon = memchr(line, ':', n);
  if (!colon || colon == line) return total;
  size_t kn = (size_t)(colon - line), v0 = kn + 1;
  while (v0 < n && (line[v0] == ' ' || line[v0] == '\t'))
    v0++;
  size_t vn = n - v0;
  while (vn && (line[v0 + vn - 1] == ' ' || line[v0 + vn - 1] == '\t'))
    vn--;
  if (x->n_headers >= LH_HTTP_REPLY_MAX_HEADERS)
    return stop(x, LH_ERR_LIMIT, "the reply has more than %d headers", LH_HTTP_REPLY_MAX_HEADERS);
  if (x->hlen + kn + vn + 2 > LH_HTTP_REPLY_MAX_HEADER_BYTES)
    return stop(x, LH_ERR_LIMIT, "the reply's headers take more than %d bytes",
                LH_HTTP_REPLY_MAX_HEADER_BYTES);
  if (!x->hbytes && !(x->hbytes = malloc(LH_HTTP_REPLY_MAX_HEADER_BYTES)))
    return stop(x, LH_ERR_NOMEM, "out of memory for the reply's headers");
  x->name_off[x->n_headers] = x->hlen;
  memcpy(x->hbytes + x->hlen, line, kn);
  x->hlen += kn;
  x->hbytes[x->hlen++] = 0;
  x->value_off[x->n_headers] = x->hlen;
  memcpy(x->hbytes + x->hlen, line + v0, vn);
  x->hlen += vn;
  x->hbytes[x->hlen++] = 0;
  x->n_headers++;
  uint64_t cl;
  if (!x->download && !x->head && kn == 14 && !strncasecmp(line, "Content-Length", 14) &&
      parse_u64(x->hbytes + x->value_off[x->n_headers - 1], &cl) && cl > x->max_body)
    return stop(x, LH_ERR_LIMIT, "the reply declares a body of %llu bytes, more than %zu",
                (unsigned long long)cl, x->max_body);
  return total;
}

static size_t to_memory(xfer *x, const char *data, size_t n) {
  if (n > x->max_body - x->len)
    return stop(x, LH_ERR_LIMIT, "the reply's body is longer than %zu bytes", x->max_body);
  if (x->len + n + 1 > x->cap) {
    size_t cap = x->cap ? x->cap : 4096;
    while (cap < x->len + n + 1)
      cap *= 2;
    if (cap > x->max_body + 1) cap = x->max_body + 1;
    uint8_t *b = realloc(x->body, cap);
    if (!b) return stop(x, LH_ERR_NOMEM, "out of memory for a reply of %zu bytes", x->len + n);
    x->body = b;
    x->cap = cap;
  }
  memcpy(x->body + x->len, data, n);
  x->len += n;
  x->body[x->len] = 0;
  return n;
}

static size_t to_file(xfer *x, const char *data, size_t n) {
  if (n > x->max_file - x->written)
    return stop(x, LH_ERR_LIMIT, "the file is longer than the limit of %llu bytes",
                (unsigned long long)x->max_file);
  for (size_t done = 0; done < n;) {
    ssize_t w = write(x->fd, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return stop(x, LH_ERR_IO, "cannot write the part file: %s", strerror(errno));
    done += (size_t)w;
  }
  x->written += n;
  return n;
}

static size_t on_body(char *data, size_t size, size_t nitems, void *ud) {
  xfer *x = ud;
  size_t n = size * nitems;
  if (x->sink == SINK_FILE) return to_file(x, data, n);
  if (x->sink == SINK_ERROR && n > x->max_body - x->len) {
    to_memory(x, data, x->max_body - x->len); /* keep what fits of an error's body */
    x->error_cut = true;
    return 0;
  }
  return to_memory(x, data, n);
}

/* ---------------------------------------------------------------- requests */

static bool is_token(const char *s) {
  if (!*s) return false;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          strchr("!#$%&'*+-.^_`|~", c)))
      return false;
  }
  return true;
}

/* The request headers: the caller's, no "Expect", and a Content-Type for a body. */
static lh_err build_headers(const lh_http_header *headers, int n, bool has_body,
                            struct curl_slist **out) {
  struct curl_slist *list = NULL, *next;
  bool content_type = false;
  char line[4096];
  *out = NULL;
  for (int i = 0; i < n; i++) {
    const char *v = headers[i].value;
    bool ok = is_token(headers[i].name);
    for (const char *p = v; ok && *p; p++)
      ok = !(((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f);
    if (!ok || snprintf(line, sizeof line, "%s: %s", headers[i].name, v) >= (int)sizeof line) {
      curl_slist_free_all(list);
      return lh_errorf(LH_ERR_INVAL,
                       "http client: header %d (\"%.64s\"): a bad name, a control "
                       "byte in its value, or longer than %zu bytes",
                       i, headers[i].name, sizeof line);
    }
    content_type |= !strcasecmp(headers[i].name, "Content-Type");
    if (!(next = curl_slist_append(list, line))) goto nomem;
    list = next;
  }
  if (!(next = curl_slist_append(list, "Expect:"))) goto nomem;
  list = next;
  if (has_body && !content_type) {
    if (!(next = curl_slist_append(list, "Content-Type: application/octet-stream"))) goto nomem;
    list = next;
  }
  *out = list;
  return LH_ERR_OK;
nomem:
  curl_slist_free_all(list);
  return lh_errorf(LH_ERR_NOMEM, "http client: out of memory");
}

/* Sets up and runs one transfer; the reply's status, headers and body are in x. */
static lh_err perform(lh_http_client *c, const char *method, const char *path_query,
                      const lh_http_header *headers, int n_headers, const void *body, size_t len,
                      long timeout_ms, xfer *x) {
  bool get = !strcmp(method, "GET"), head = !strcmp(method, "HEAD");
  if (!is_token(method))
    return lh_errorf(LH_ERR_INVAL, "http client: bad method \"%.32s\"", method);
  if (path_query[0] != '/' || !printable(path_query) || strlen(path_query) > 8192)
    return lh_errorf(LH_ERR_INVAL,
                     "http client: path \"%.200s\": expected '/' and printable "
                     "ASCII without spaces",
                     path_query);
  if ((get || head) && len)
    return lh_errorf(LH_ERR_INVAL, "http client: %s sends no body (%zu bytes given)", method, len);
  if (timeout_ms < 0) return lh_errorf(LH_ERR_INVAL, "http client: negative timeout");
  size_t ul = strlen(c->base) + strlen(path_query) + 1;
  char *url = malloc(ul);
  if (!url) return lh_errorf(LH_ERR_NOMEM, "http client: out of memory");
  snprintf(url, ul, "%s%s", c->base, path_query);
  struct curl_slist *list = NULL;
  lh_err e = build_headers(headers, n_headers, !(get || head), &list);
  if (e) {
    free(url);
    return e;
  }
  CURL *h = c->easy;
  x->head = head;
  curl_easy_reset(h); /* options only: the connection stays open */
  c->errbuf[0] = 0;
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
  curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)STALL_SECONDS);
  long connect_ms = timeout_ms > 0 && timeout_ms < CONNECT_MAX_MS ? timeout_ms : CONNECT_MAX_MS;
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
  if (timeout_ms > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  if (get) {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else if (head) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else {
    if (strcmp(method, "POST") != 0) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, len ? body : "");
  }
  CURLcode rc = curl_easy_perform(h);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
  curl_slist_free_all(list);
  if (x->fail != LH_ERR_OK) {
    e = lh_errorf(x->fail, "%s %s: %s", method, url, x->fail_msg);
  } else if (rc != CURLE_OK && !(x->error_cut && rc == CURLE_WRITE_ERROR)) {
    e = lh_errorf(LH_ERR_IO, "%s %s: %s", method, url,
                  c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc));
  } else {
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (status) x->status = status;
  }
  free(url);
  return e;
}

lh_err lh_http_client_request(lh_http_client *c, const char *method, const char *path_query,
                              const lh_http_header *headers, int n_headers, const void *body,
                              size_t len, size_t max_reply, long timeout_ms, lh_http_reply *out) {
  memset(out, 0, sizeof *out);
  xfer x = {.max_body = max_reply, .fd = -1};
  lh_err e = perform(c, method, path_query, headers, n_headers, body, len, timeout_ms, &x);
  if (e == LH_ERR_OK) xfer_to_reply(&x, out);
  xfer_free(&x);
  return e;
}

/* ---------------------------------------------------------------- downloads */

static lh_err open_part(const char *part, int *fd, uint64_t *size) {
  *fd = open(part, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  struct stat st;
  if (*fd < 0 || fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    lh_err e = lh_errorf(LH_ERR_IO, "%s: cannot open the part file: %s", part,
                         *fd < 0 ? strerror(errno) : "not a regular file");
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return e;
  }
  *size = (uint64_t)st.st_size;
  if (lseek(*fd, 0, SEEK_END) < 0) {
    close(*fd);
    *fd = -1;
    return lh_errorf(LH_ERR_IO, "%s: cannot seek: %s", part, strerror(errno));
  }
  return LH_ERR_OK;
}

/* Whether a 416 says the part file holds the whole file already. */
static bool complete_416(const xfer *x) {
  uint64_t s, e, total;
  return lh_http_parse_content_range(xfer_header(x, "Content-Range"), &s, &e, &total) == 0 &&
         s == UINT64_MAX && total == x->resume_from;
}

/* One GET of path into part (resuming it): 1 when the part file is complete, 0 when it must
 * start again from zero (a 416 that does not match it), -1 with *err set on failure. */
static int download_once(lh_http_client *c, const char *path, const char *part, uint64_t max_bytes,
                         long timeout_ms, lh_http_reply *meta, lh_err *err) {
  int fd = -1;
  uint64_t have = 0;
  lh_err e = open_part(part, &fd, &have);
  if (e) return *err = e, -1;
  int r = -1;
  bool too_long = have > max_bytes; /* not a prefix of what we may take: start again */
  if (too_long && (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0))
    e = lh_errorf(LH_ERR_IO, "%s: cannot truncate: %s", part, strerror(errno));
  if (too_long) have = 0;
  xfer x = {.download = true, .fd = fd, .resume_from = have, .max_file = max_bytes};
  char range[64];
  snprintf(range, sizeof range, "bytes=%llu-", (unsigned long long)have);
  lh_http_header h = {"Range", range};
  if (e) goto out;
  e = perform(c, "GET", path, &h, have ? 1 : 0, NULL, 0, timeout_ms, &x);
  if (e) goto out;
  if (x.status == 206 && x.total != UINT64_MAX && x.written != x.total) {
    e = lh_errorf(LH_ERR_IO, "GET %s%s: the 206 reply ends at byte %llu of %llu", c->base, path,
                  (unsigned long long)x.written, (unsigned long long)x.total);
  } else if (x.status == 200 || x.status == 206 || (x.status == 416 && complete_416(&x))) {
    if (fsync(fd) != 0)
      e = lh_errorf(LH_ERR_IO, "%s: fsync failed: %s", part, strerror(errno));
    else
      r = 1;
  } else if (x.status == 416) {
    r = ftruncate(fd, 0) == 0 ? 0 : -1; /* the part file does not fit the file: start over */
    if (r < 0) e = lh_errorf(LH_ERR_IO, "%s: cannot truncate: %s", part, strerror(errno));
  } else {
    char shown[256];
    lh_escape((const char *)x.body, x.len < 200 ? x.len : 200, shown, sizeof shown);
    e = lh_errorf(x.status == 404 ? LH_ERR_NOTFOUND : LH_ERR_IO, "GET %s%s: HTTP %ld: %s", c->base,
                  path, x.status, shown);
  }
out:
  close(fd);
  if (meta && x.status) {
    lh_http_reply_free(meta);
    if (r != -1) { /* the body of a file, or of a 416 that is no error, is not kept */
      free(x.body);
      x.body = NULL;
      x.len = 0;
    }
    xfer_to_reply(&x, meta);
  }
  xfer_free(&x);
  *err = e;
  return r;
}

lh_err lh_http_client_download(lh_http_client *c, const char *path, const char *dest,
                               uint64_t max_bytes, long timeout_ms, lh_http_reply *meta) {
  if (meta) memset(meta, 0, sizeof *meta);
  size_t n = strlen(dest) + 6;
  char *part = malloc(n);
  if (!part) return lh_errorf(LH_ERR_NOMEM, "http client: out of memory");
  snprintf(part, n, "%s.part", dest);
  lh_err e = LH_ERR_OK;
  int r = 0;
  for (int attempt = 0; attempt < 2 && r == 0; attempt++)
    r = download_once(c, path, part, max_bytes, timeout_ms, meta, &e);
  if (r == 0)
    e = lh_errorf(LH_ERR_MISMATCH, "GET %s%s: the server refuses every range of %s", c->base, path,
                  part);
  if (r > 0) e = lh_file_commit(part, dest);
  if (e == LH_ERR_LIMIT || e == LH_ERR_MISMATCH || e == LH_ERR_FORMAT) unlink(part);
  free(part);
  return e;
}
