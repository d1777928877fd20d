/* longhaul net: the HTTP layer of `longhaul serve` (a libmicrohttpd server) and `longhaul worker`
 * (a libcurl client), and the pure parsers of the header values and query strings they read.
 * Everything that reads outside bytes (requests, replies, header values, queries) returns an
 * lh_err with a message or answers with a status; nothing here aborts on what a peer sends, and
 * every size (headers, bodies, connections, reply headers) is bounded before it is stored.
 *
 * Ownership: a server or client is freed by its _stop or _free (NULL is accepted). A response's
 * strings and body are malloc'd and freed by the server after sending; a reply's body and headers
 * belong to the reply until lh_http_reply_free.
 * Thread safety: the server calls the handler on one thread per connection, so handlers run
 * concurrently and may block (a long poll); lh_http_server_stopping and lh_http_request_stopping
 * may be called from any thread. A client is one connection (keep-alive) for one thread at a
 * time; two threads use two clients. The parsers keep no state. */
#ifndef LONGHAUL_HTTP_H
#define LONGHAUL_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

struct json_t;

/* ---------------------------------------------------------------- pure parsers */

/* What a Range header asks of a representation of `size` bytes (RFC 9110, 14.2). */
typedef enum {
  LH_HTTP_RANGE_WHOLE = 0,     /* no header (NULL), or several ranges: send the whole, 200 */
  LH_HTTP_RANGE_ONE,           /* one satisfiable range: [*start, *start + *len), 206 */
  LH_HTTP_RANGE_UNSATISFIABLE, /* well-formed, but no range overlaps the content: 416 */
  LH_HTTP_RANGE_MALFORMED      /* not a "bytes=" range set: ignored, the whole is sent, 200 */
} lh_http_range;

/* Parses a Range header value: "bytes=A-B", "bytes=A-" and "bytes=-N" (the unit is matched
 * case-insensitively; spaces and tabs around commas; empty list elements are skipped). B past
 * the end is clamped to size - 1 and N past the size gives the whole content; A > B, a missing
 * number, a sign or anything else is MALFORMED; numbers too large for 64 bits saturate (so
 * they are unsatisfiable starts or lengths that cover everything). Several ranges give WHOLE
 * when any of them is satisfiable, else UNSATISFIABLE. *start and *len are set on every
 * result: the range for ONE, (0, size) for WHOLE and MALFORMED, (0, 0) for UNSATISFIABLE. */
lh_http_range lh_http_parse_range(const char *value, uint64_t size, uint64_t *start, uint64_t *len);

/* Parses a 206's Content-Range "bytes A-B/T" (T may be "*": *total is UINT64_MAX) or a 416's
 * "bytes * /T" without the space (*start = *end = UINT64_MAX). Requires A <= B and, with a
 * total, B < T; anything else is LH_ERR_FORMAT naming the value. */
lh_err lh_http_parse_content_range(const char *value, uint64_t *start, uint64_t *end,
                                   uint64_t *total);

/* Whether an If-None-Match value matches the entity tag `etag` (with its quotes, "\"abc\""):
 * "*" matches any, else a comma-separated list of entity tags compared weakly (W/"abc" matches
 * "abc"). A malformed list matches nothing. */
bool lh_http_etag_match(const char *if_none_match, const char *etag);

/* Finds `key` in a raw query string ("a=1&b=x%20y", without the '?'): pairs are split at '&',
 * a pair without '=' has the empty value, '+' is a space and %XX a byte (hex digits of either
 * case). Keys are compared after decoding. On success writes the decoded value and its NUL to
 * out[0, cap) and returns LH_ERR_OK. LH_ERR_NOTFOUND: no such key; LH_ERR_FORMAT: a bad escape
 * ("%", "%4", "%zz") anywhere in the query, a key given twice, or a value that decodes to a
 * NUL byte; LH_ERR_LIMIT: the value with its NUL needs more than cap bytes. On every error out
 * is "" (when cap > 0). Messages name the key, or the byte offset of a bad escape. */
lh_err lh_http_query_get(const char *query, const char *key, char *out, size_t cap);

/* Percent-encodes s[0, n) for a query value or a path segment: unreserved bytes (A-Z a-z 0-9
 * - . _ ~) are kept, every other byte becomes %XX (uppercase). Writes the text and its NUL to
 * out[0, cap); LH_ERR_LIMIT when it does not fit (out is then ""). */
lh_err lh_http_escape(const void *s, size_t n, char *out, size_t cap);

/* ---------------------------------------------------------------- server */

typedef struct lh_http_server lh_http_server;

/* One request as the handler sees it, valid during the handler's call only. */
typedef struct lh_http_request {
  const char *method;  /* "GET", "POST", "HEAD", ... as sent */
  const char *path;    /* the URL path without the query, as sent (not percent-decoded) */
  const char *query;   /* the raw query string after '?', "" when none */
  const uint8_t *body; /* the whole body, body_len bytes and a NUL after them (for JSON) */
  size_t body_len;
  const char *peer;     /* "127.0.0.1:PORT" or "[::1]:PORT" */
  const void *internal; /* the server's; read headers with lh_http_request_header */
  int64_t arrived_ms;   /* the wall clock (Unix ms) when the request line arrived, before the
                         * body (a signed time is checked against this, not the upload's end) */
} lh_http_request;

/* A request header's value (the first of that name, compared case-insensitively), or NULL. */
const char *lh_http_request_header(const lh_http_request *r, const char *name);
/* Whether the server that received r is stopping (lh_http_server_stop was called): a handler
 * that waits (a long poll) checks it at least every ~100 ms, or is woken by the config's on_stop
 * hook, and answers at once (503 is usual). */
bool lh_http_request_stopping(const lh_http_request *r);

#define LH_HTTP_MAX_EXTRA_HEADERS 8

/* What the handler answers. The server hands the handler a zeroed response (file_fd -1); the
 * helpers below fill it and return LH_ERR_NOMEM, LH_ERR_INVAL or LH_ERR_LIMIT on failure, the
 * response then unchanged (so a handler that ignores a failed respond_* leaves the status at 0).
 * Every response carries a Content-Type (application/octet-stream when content_type is NULL); a
 * status left at 0 (or outside 100 .. 599) is sent as a 500 error. */
typedef struct lh_http_response {
  int status;         /* 100 .. 599 */
  char *content_type; /* malloc'd, or NULL */
  uint8_t *body;      /* malloc'd, body_len bytes; the server frees it */
  size_t body_len;
  char *file_path;    /* instead of body: this open file is served (lh_http_respond_file) */
  int file_fd;        /* its descriptor, or -1; the server closes it */
  uint64_t file_size; /* its size when opened */
  char *etag;         /* the file's strong entity tag with its quotes, or NULL */
  int n_headers;
  struct {
    char *name, *value; /* malloc'd copies */
  } headers[LH_HTTP_MAX_EXTRA_HEADERS];
} lh_http_response;

/* Status and a copy of data[0, len) as the body. */
lh_err lh_http_respond_bytes(lh_http_response *res, int status, const char *content_type,
                             const void *data, size_t len);
/* Status and v as compact JSON (application/json). */
lh_err lh_http_respond_json(lh_http_response *res, int status, const struct json_t *v);
/* Status and {"error":{"code":CODE,"message":MESSAGE}} (application/json): code is a short
 * snake_case word a client can switch on, the message is for people (at most ~1 KiB kept; bytes
 * that are not UTF-8 become U+FFFD). */
lh_err lh_http_respond_error(lh_http_response *res, int status, const char *code, const char *fmt,
                             ...) __attribute__((format(printf, 4, 5)));
/* Serves the regular file at path (opened now, so a missing file is LH_ERR_NOTFOUND and other
 * failures LH_ERR_IO here, and the handler can answer 404 itself). The server then answers from
 * the request: HEAD without a body; If-None-Match matching the ETag: 304; Range (see
 * lh_http_parse_range): 206 with Content-Range, 416 with "Content-Range: bytes * /SIZE" (no
 * space), or the whole file 200; with Accept-Ranges: bytes, Content-Length, and Cache-Control
 * when given. etag is the tag without quotes (a hash's hex digits: printable ASCII other than
 * '"' and '\\'), or NULL for none; the file is streamed from its descriptor, never read whole. */
lh_err lh_http_respond_file(lh_http_response *res, const char *path, const char *etag,
                            const char *cache_control);
/* Adds a header (copied). At most LH_HTTP_MAX_EXTRA_HEADERS (LH_ERR_LIMIT); a name that is not
 * an HTTP token, an empty value or one with a control byte, and the headers the server writes
 * itself (Content-Type, Content-Length, Transfer-Encoding, Connection, ETag, Date) are
 * LH_ERR_INVAL. A file's Content-Range is the server's too: set one only with a body of bytes. */
lh_err lh_http_response_header(lh_http_response *res, const char *name, const char *value);

typedef void (*lh_http_handler)(void *ud, const lh_http_request *req, lh_http_response *res);

/* Zero fields take the defaults named. */
typedef struct lh_http_server_config {
  const char *host; /* an IPv4 or IPv6 literal to bind; NULL: "127.0.0.1" */
  int port;         /* 0: a free port chosen by the kernel (lh_http_server_port) */
  /* The largest body a route accepts (0: none). NULL: max_body_default for every route. A
   * Content-Length above it is answered 413 before the body is read; a chunked body that grows
   * past it is cut off with 413. */
  size_t (*max_body)(void *ud, const char *method, const char *path);
  size_t max_body_default; /* 0: LH_HTTP_DEFAULT_MAX_BODY */
  int max_connections;     /* open connections at most, one thread each; 0: 64 */
  int max_per_ip;          /* open connections from one address at most; 0: max_connections */
  /* Seconds of silence after which a connection is closed; also the deadline for a request's
   * headers to arrive from its connection's start or its previous response (a client that
   * trickles header bytes is cut off then). 0: 30. */
  int timeout_s;
  int body_timeout_s; /* a body must arrive within this of its headers; 0: 10 x timeout_s */
  lh_http_handler handler;
  void *ud;
  /* Called once by lh_http_server_stop, after the stopping flag is set and before the server
   * waits for handlers: wake waiting handlers here (broadcast their condition variables). */
  void (*on_stop)(void *ud);
} lh_http_server_config;

#define LH_HTTP_DEFAULT_MAX_BODY ((size_t)1 << 20)
/* Request line and headers of one request at most (libmicrohttpd's per-connection memory; more
 * is answered 431 or 414 by libmicrohttpd itself). */
#define LH_HTTP_MAX_HEADER_BYTES 32768

/* Binds, listens and starts serving. LH_ERR_INVAL for a host that is not an address literal or
 * a negative setting; LH_ERR_IO when the address cannot be bound (in use). */
lh_err lh_http_server_start(const lh_http_server_config *c, lh_http_server **out);
/* The bound port (the kernel's choice when the config said 0). */
int lh_http_server_port(const lh_http_server *s);
bool lh_http_server_stopping(const lh_http_server *s);
/* Sets the stopping flag, calls on_stop, stops accepting, closes the connections, waits for
 * running handlers to return and frees. NULL is accepted. */
void lh_http_server_stop(lh_http_server *s);

/* ---------------------------------------------------------------- client */

typedef struct lh_http_client lh_http_client;

typedef struct lh_http_header {
  const char *name, *value;
} lh_http_header;

#define LH_HTTP_REPLY_MAX_HEADERS      48
#define LH_HTTP_REPLY_MAX_HEADER_BYTES 16384 /* names and values together */

/* An answer. body is malloc'd with a NUL after its len bytes (for JSON; NULL when the reply had
 * no body); headers point into the reply's own storage (the last response's, after any 1xx). */
typedef struct lh_http_reply {
  long status;
  uint8_t *body;
  size_t len;
  int n_headers;
  lh_http_header headers[LH_HTTP_REPLY_MAX_HEADERS];
  char *header_bytes; /* the storage of the headers */
} lh_http_reply;

/* A client for base_url, "http://HOST:PORT" (https:// also; no path). One connection, kept alive
 * between requests; redirects are not followed. */
lh_err lh_http_client_create(const char *base_url, lh_http_client **out);
void lh_http_client_free(lh_http_client *c);

/* Sends METHOD base_url + path_query (which starts with '/') with the extra headers and body
 * (GET and HEAD send none; len 0 sends an empty body for other methods), and waits at most
 * timeout_ms (0: no deadline, but a transfer that moves no byte for 60 s fails). Any HTTP status
 * is LH_ERR_OK, with *out filled (free it with lh_http_reply_free). Failures clear *out:
 * LH_ERR_IO for the transport (refused, reset, timed out) with curl's words and the URL;
 * LH_ERR_LIMIT for a body over max_reply bytes (reading stops there) or more reply headers than
 * the bounds above; LH_ERR_INVAL for a header with CR or LF or a bad method. Never sends
 * "Expect: 100-continue". */
lh_err lh_http_client_request(lh_http_client *c, const char *method, const char *path_query,
                              const lh_http_header *headers, int n_headers, const void *body,
                              size_t len, size_t max_reply, long timeout_ms, lh_http_reply *out);
/* A reply header's value (the first of that name, case-insensitive), or NULL. */
const char *lh_http_reply_header(const lh_http_reply *r, const char *name);
void lh_http_reply_free(lh_http_reply *r);

/* GETs path into the file dest: the bytes go to DEST.part, and when DEST.part exists already
 * (an interrupted download) it is resumed with "Range: bytes=N-": a 206 must start at N (else
 * LH_ERR_MISMATCH and the part file is removed), a 200 restarts it from zero, a 416 whose size
 * is N means it was complete. The complete file is fsynced and renamed to DEST. More than
 * max_bytes in all: LH_ERR_LIMIT, and the part file is removed. A transport failure is LH_ERR_IO
 * and keeps the part file for the next try. A status other than 200/206: LH_ERR_NOTFOUND for
 * 404, else LH_ERR_IO naming it, with the error body (at most 64 KiB) in meta. meta (may be
 * NULL) gets the last reply's status and headers (its body only on an HTTP error); free it with
 * lh_http_reply_free. The caller checks the content's hash. */
lh_err lh_http_client_download(lh_http_client *c, const char *path, const char *dest,
                               uint64_t max_bytes, long timeout_ms, lh_http_reply *meta);

#endif
