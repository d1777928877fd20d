/* The netem proxy (include/longhaul/netem.h): one thread runs one ppoll loop over a wake pipe, the
 * listening socket and two sockets per connection. Every emulated effect (rate, delay, jitter,
 * drop) becomes a due time on a chunk when its bytes are read, so the loop sleeps until the
 * earliest due time, acknowledgement or FIN, or until a socket is ready; it never spins. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "longhaul/netem.h"

#define CHUNKS       1024 /* chunk descriptors a direction: a sender of tiny writes stops there */
#define ACKS         256 /* pending acknowledgements a direction (merged into the last when full) */
#define SOCK_BUF     (64 * 1024) /* the proxy's kernel receive buffers: the window does the rest */
#define ACCEPT_BURST 64          /* connections accepted per wake-up */
#define ACCEPT_PAUSE 100000      /* us to stop accepting after EMFILE and the like */

typedef struct chunk {
  int64_t due;  /* monotonic us when its bytes may be written to the receiver */
  uint32_t len; /* bytes still to write */
} chunk;

typedef struct ack {
  int64_t at; /* us when the sender's window gets the bytes back */
  uint32_t bytes;
} ack;

/* One direction: bytes read from one socket, waiting for their due time to be written to the
 * other. The ring holds `used` bytes from `head`, described in order by the chunk queue. */
typedef struct dir {
  uint8_t *ring; /* (window) */
  size_t head, used;
  chunk chunks[CHUNKS];
  size_t c_head, c_n;
  ack acks[ACKS];
  size_t a_head, a_n;
  size_t inflight;   /* read and not yet acknowledged: <= window */
  int64_t last_due;  /* due times never decrease: a stream keeps its order */
  int64_t link_free; /* when the rate-limited link has sent what it was given */
  int64_t fin_due;
  uint64_t draws; /* Philox position */
  bool eof;       /* the sender shut its write side: a FIN waits behind the bytes */
  bool fin_sent;
  bool blocked; /* the last write found the receiver's buffer full: wait for POLLOUT */
} dir;

typedef struct conn {
  int fd[2]; /* 0: the client, 1: the upstream */
  bool connecting, dead;
  uint64_t id;
  uint64_t forwarded; /* both directions, for reset_after */
  dir d[2];           /* d[k] reads fd[k] and writes fd[1 - k] */
} conn;

struct lh_netem {
  struct sockaddr_in upstream;
  int listen_fd, wake[2];
  uint16_t port;
  int64_t delay_us, jitter_us, rto_us;
  uint64_t rate_kbps, reset_after, seed;
  double drop;
  size_t window;
  int max_conns, n_conns;
  conn **conns;       /* [max_conns] */
  struct pollfd *pfd; /* [2 + 2 max_conns] */
  uint64_t next_id;
  int64_t accept_pause_until;
  pthread_t thread;
  pthread_mutex_t mu; /* guards stats */
  lh_netem_counters stats;
};

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#define COUNT(n, field, v)                                                                         \
  do {                                                                                             \
    pthread_mutex_lock(&(n)->mu);                                                                  \
    (n)->stats.field += (v);                                                                       \
    pthread_mutex_unlock(&(n)->mu);                                                                \
  } while (0)

/* ---------------------------------------------------------------- configuration */

static lh_err loopback_addr(const char *host, uint16_t port, const char *what,
                            struct sockaddr_in *sa) {
  if (!host) host = "127.0.0.1";
  struct in_addr a;
  char shown[96];
  lh_escape(host, strlen(host), shown, sizeof shown);
  if (!strcmp(host, "localhost"))
    a.s_addr = htonl(INADDR_LOOPBACK);
  else if (inet_pton(AF_INET, host, &a) != 1)
    return lh_errorf(LH_ERR_INVAL,
                     "%s host \"%s\": expected an IPv4 loopback address (127.0.0.0/8) or "
                     "\"localhost\" (netem never sends traffic off this machine)",
                     what, shown);
  if ((ntohl(a.s_addr) >> 24) != 127)
    return lh_errorf(LH_ERR_INVAL,
                     "%s host \"%s\": not a loopback address, expected 127.0.0.0/8 or "
                     "\"localhost\" (netem never sends traffic off this machine)",
                     what, shown);
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_addr = a;
  sa->sin_port = htons(port);
  return LH_ERR_OK;
}

static lh_err check_config(const lh_netem_config *c) {
  if (c->upstream_port == 0)
    return lh_errorf(LH_ERR_INVAL, "upstream port 0: expected a port in [1, 65535]");
  if (c->delay_ms > LH_NETEM_MAX_DELAY_MS)
    return lh_errorf(LH_ERR_INVAL, "delay %u ms: expected at most %d ms", c->delay_ms,
                     LH_NETEM_MAX_DELAY_MS);
  if (c->jitter_ms > c->delay_ms)
    return lh_errorf(LH_ERR_INVAL,
                     "jitter %u ms is larger than the delay %u ms (each chunk's delay is drawn in "
                     "delay +- jitter and cannot be negative)",
                     c->jitter_ms, c->delay_ms);
  if (c->rate_kbps > LH_NETEM_MAX_RATE_KBPS)
    return lh_errorf(LH_ERR_INVAL, "rate %llu kbit/s: expected at most %llu (0: unlimited)",
                     (unsigned long long)c->rate_kbps, LH_NETEM_MAX_RATE_KBPS);
  if (!(c->drop >= 0.0 && c->drop <= 1.0))
    return lh_errorf(LH_ERR_INVAL, "drop probability %g: expected a number in [0, 1]", c->drop);
  if (c->max_connections < 0 || c->max_connections > LH_NETEM_MAX_CONNECTIONS)
    return lh_errorf(LH_ERR_INVAL, "max_connections %d: expected 1 .. %d (0: %d)",
                     c->max_connections, LH_NETEM_MAX_CONNECTIONS, LH_NETEM_DEFAULT_CONNECTIONS);
  if (c->window_bytes &&
      (c->window_bytes < LH_NETEM_MIN_WINDOW || c->window_bytes > LH_NETEM_MAX_WINDOW))
    return lh_errorf(LH_ERR_INVAL, "window %zu bytes: expected %u .. %u (0: %u)", c->window_bytes,
                     LH_NETEM_MIN_WINDOW, LH_NETEM_MAX_WINDOW, LH_NETEM_DEFAULT_WINDOW);
  return LH_ERR_OK;
}

/* ---------------------------------------------------------------- connections */

/* Counters change before the sockets close: a client that sees its connection end may read
 * them at once. */
static void close_conn(lh_netem *n, conn *c, bool rst) {
  if (c->dead) return;
  c->dead = true;
  pthread_mutex_lock(&n->mu);
  n->stats.active--;
  pthread_mutex_unlock(&n->mu);
  for (int s = 0; s < 2; s++) {
    if (c->fd[s] < 0) continue;
    if (rst) {
      struct linger lg = {.l_onoff = 1, .l_linger = 0};
      setsockopt(c->fd[s], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(c->fd[s]);
    c->fd[s] = -1;
  }
}

static void free_conn(conn *c) {
  if (!c) return;
  free(c->d[0].ring); /* one allocation for both rings */
  free(c);
}

static void set_int_opt(int fd, int level, int name, int v) {
  setsockopt(fd, level, name, &v, sizeof v); /* best effort: a tuning, not a requirement */
}

static void open_conn(lh_netem *n, int fd) {
  conn *c = calloc(1, sizeof *c);
  uint8_t *ring = malloc(2 * n->window);
  if (!c || !ring) {
    lh_log(LH_LOG_WARN, "netem: out of memory for a connection; closing it");
    free(c);
    free(ring);
    close(fd);
    COUNT(n, refused, 1);
    return;
  }
  c->d[0].ring = ring;
  c->d[1].ring = ring + n->window;
  c->fd[0] = fd;
  c->fd[1] = -1;
  c->id = n->next_id++;
  set_int_opt(fd, IPPROTO_TCP, TCP_NODELAY, 1);
  n->conns[n->n_conns++] = c;
  pthread_mutex_lock(&n->mu);
  n->stats.accepted++;
  n->stats.active++;
  pthread_mutex_unlock(&n->mu);

  int u = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (u >= 0) {
    c->fd[1] = u;
    set_int_opt(u, SOL_SOCKET, SO_RCVBUF, SOCK_BUF);
    set_int_opt(u, IPPROTO_TCP, TCP_NODELAY, 1);
    if (connect(u, (const struct sockaddr *)&n->upstream, sizeof n->upstream) == 0) return;
    if (errno == EINPROGRESS) {
      c->connecting = true;
      return;
    }
  }
  lh_log(LH_LOG_DEBUG, "netem: connection %llu: upstream: %s", (unsigned long long)c->id,
         strerror(errno));
  COUNT(n, upstream_failed, 1);
  close_conn(n, c, false);
}

static void accept_all(lh_netem *n, int64_t now) {
  for (int i = 0; i < ACCEPT_BURST; i++) {
    int fd = accept4(n->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      /* EMFILE, ENFILE, ENOBUFS, ENOMEM: the pending connection stays, and so would the
       * listening socket's readiness; wait a little instead of spinning */
      lh_log(LH_LOG_WARN, "netem: accept: %s; pausing 100 ms", strerror(errno));
      n->accept_pause_until = now + ACCEPT_PAUSE;
      return;
    }
    if (n->n_conns >= n->max_conns) {
      COUNT(n, refused, 1); /* counted first: the client may look at the counters once closed */
      close(fd);
      continue;
    }
    open_conn(n, fd);
  }
}

/* ---------------------------------------------------------------- one direction */

/* When the chunk of len bytes read now may be delivered: after the link has sent it (rate),
 * delay +- jitter later, a retransmission timeout later if it is "lost", and never before the
 * chunk ahead of it. */
static int64_t schedule(lh_netem *n, conn *c, int k, size_t len, int64_t now) {
  dir *d = &c->d[k];
  int64_t start = now > d->link_free ? now : d->link_free;
  int64_t tx = 0;
  if (n->rate_kbps) /* len x 8 bits at rate_kbps x 1000 bits/s, in us, rounded up */
    tx = (int64_t)(((uint64_t)len * 8000u + n->rate_kbps - 1) / n->rate_kbps);
  d->link_free = start + tx;
  uint32_t r[4];
  lh_philox(n->seed, c->id * 2 + (uint64_t)k, d->draws++, r);
  int64_t due = d->link_free + n->delay_us;
  if (n->jitter_us) due += (int64_t)(r[0] % (uint32_t)(2 * n->jitter_us + 1)) - n->jitter_us;
  if (n->drop > 0 && (double)r[1] * (1.0 / 4294967296.0) < n->drop) {
    due += n->rto_us;
    COUNT(n, dropped, 1);
  }
  if (due < d->last_due) due = d->last_due;
  d->last_due = due;
  return due;
}

static bool wants_read(const lh_netem *n, const conn *c, int k) {
  const dir *d = &c->d[k];
  return !d->eof && d->inflight < n->window && d->c_n < CHUNKS && !(k == 1 && c->connecting);
}

/* Reads what the window allows from fd[k] and queues it as chunks. */
static void read_side(lh_netem *n, conn *c, int k, int64_t now) {
  dir *d = &c->d[k];
  size_t room = n->window - d->inflight; /* used <= inflight, so the ring has this room */
  size_t tail = (d->head + d->used) % n->window;
  if (room > n->window - tail) room = n->window - tail;
  size_t by_chunks = (CHUNKS - d->c_n) * (size_t)LH_NETEM_CHUNK;
  if (room > by_chunks) room = by_chunks;
  if (room == 0) return;
  ssize_t r = recv(c->fd[k], d->ring + tail, room, MSG_DONTWAIT);
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    close_conn(n, c, true); /* the sender reset: so does the proxy, toward the other side */
    return;
  }
  if (r == 0) {
    d->eof = true;
    int64_t start = now > d->link_free ? now : d->link_free;
    d->fin_due = start + n->delay_us;
    if (d->fin_due < d->last_due) d->fin_due = d->last_due;
    return;
  }
  d->used += (size_t)r;
  d->inflight += (size_t)r;
  for (size_t off = 0; off < (size_t)r; off += LH_NETEM_CHUNK) {
    size_t len = (size_t)r - off < LH_NETEM_CHUNK ? (size_t)r - off : LH_NETEM_CHUNK;
    chunk *ch = &d->chunks[(d->c_head + d->c_n++) % CHUNKS];
    ch->len = (uint32_t)len;
    ch->due = schedule(n, c, k, len, now);
  }
}

static void add_ack(dir *d, int64_t at, size_t bytes) {
  if (d->a_n == ACKS) { /* merge into the newest: released a little later, never earlier */
    ack *last = &d->acks[(d->a_head + ACKS - 1) % ACKS];
    last->at = at;
    last->bytes += (uint32_t)bytes;
    return;
  }
  d->acks[(d->a_head + d->a_n++) % ACKS] = (ack){.at = at, .bytes = (uint32_t)bytes};
}

static void consume(dir *d, size_t w, size_t window) {
  d->head = (d->head + w) % window;
  d->used -= w;
  while (w > 0) {
    chunk *ch = &d->chunks[d->c_head];
    size_t take = w < ch->len ? w : ch->len;
    ch->len -= (uint32_t)take;
    w -= take;
    if (ch->len == 0) d->c_head = (d->c_head + 1) % CHUNKS, d->c_n--;
  }
}

/* Writes the chunks that are due to fd[1 - k], up to reset_after. */
static void write_due(lh_netem *n, conn *c, int k, int64_t now) {
  dir *d = &c->d[k];
  size_t due = 0;
  for (size_t i = 0; i < d->c_n; i++) {
    const chunk *ch = &d->chunks[(d->c_head + i) % CHUNKS];
    if (ch->due > now) break;
    due += ch->len;
  }
  if (due == 0) return;
  if (n->reset_after && due > n->reset_after - c->forwarded)
    due = (size_t)(n->reset_after - c->forwarded);
  struct iovec iov[2];
  size_t first = n->window - d->head < due ? n->window - d->head : due;
  iov[0] = (struct iovec){.iov_base = d->ring + d->head, .iov_len = first};
  iov[1] = (struct iovec){.iov_base = d->ring, .iov_len = due - first};
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = due > first ? 2 : 1};
  ssize_t w = sendmsg(c->fd[1 - k], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) d->blocked = true;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    close_conn(n, c, true); /* the receiver is gone: reset the sender */
    return;
  }
  consume(d, (size_t)w, n->window);
  c->forwarded += (uint64_t)w;
  add_ack(d, now + n->delay_us, (size_t)w);
  if ((size_t)w < due) d->blocked = true;
  pthread_mutex_lock(&n->mu);
  if (k == 0)
    n->stats.bytes_up += (uint64_t)w;
  else
    n->stats.bytes_down += (uint64_t)w;
  pthread_mutex_unlock(&n->mu);
  if (n->reset_after && c->forwarded >= n->reset_after) {
    COUNT(n, reset, 1);
    close_conn(n, c, true);
  }
}

static void pump_dir(lh_netem *n, conn *c, int k, int64_t now) {
  dir *d = &c->d[k];
  bool can_write = !(k == 0 && c->connecting);
  if (can_write && !d->blocked) write_due(n, c, k, now);
  if (c->dead) return;
  while (d->a_n && d->acks[d->a_head].at <= now) {
    d->inflight -= d->acks[d->a_head].bytes;
    d->a_head = (d->a_head + 1) % ACKS;
    d->a_n--;
  }
  if (can_write && d->eof && !d->fin_sent && d->used == 0 && now >= d->fin_due) {
    shutdown(c->fd[1 - k], SHUT_WR);
    d->fin_sent = true;
  }
}

/* The earliest time this direction has something to do by itself (INT64_MAX: none). */
static int64_t dir_next(const conn *c, int k) {
  const dir *d = &c->d[k];
  int64_t t = INT64_MAX;
  if (d->a_n) t = d->acks[d->a_head].at;
  if (k == 0 && c->connecting) return t;
  if (d->c_n && !d->blocked && d->chunks[d->c_head].due < t) t = d->chunks[d->c_head].due;
  if (d->eof && !d->fin_sent && d->used == 0 && d->fin_due < t) t = d->fin_due;
  return t;
}

/* ---------------------------------------------------------------- the loop */

static void sweep(lh_netem *n) {
  int j = 0;
  for (int i = 0; i < n->n_conns; i++) {
    if (n->conns[i]->dead)
      free_conn(n->conns[i]);
    else
      n->conns[j++] = n->conns[i];
  }
  n->n_conns = j;
}

/* Fills the poll set (the wake pipe, the listening socket, two per connection) and the earliest
 * timer; returns the number of entries. */
static nfds_t build_poll(lh_netem *n, int64_t now, int64_t *next) {
  n->pfd[0] = (struct pollfd){.fd = n->wake[0], .events = POLLIN};
  bool paused = now < n->accept_pause_until;
  n->pfd[1] = (struct pollfd){.fd = paused ? -1 : n->listen_fd, .events = POLLIN};
  if (paused) *next = n->accept_pause_until;
  for (int i = 0; i < n->n_conns; i++) {
    conn *c = n->conns[i];
    for (int s = 0; s < 2; s++) {
      short ev = 0;
      if (s == 1 && c->connecting) {
        ev = POLLOUT;
      } else {
        if (wants_read(n, c, s)) ev |= POLLIN;
        if (c->d[1 - s].blocked) ev |= POLLOUT;
      }
      /* a socket with nothing to wait for is left out: a hung-up one would be reported at once
       * by every poll (POLLHUP cannot be masked) and the loop would spin */
      n->pfd[2 + 2 * i + s] = (struct pollfd){.fd = ev ? c->fd[s] : -1, .events = ev};
      int64_t t = dir_next(c, s);
      if (t < *next) *next = t;
    }
  }
  return (nfds_t)(2 + 2 * n->n_conns);
}

static void finish_connect(lh_netem *n, conn *c) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(c->fd[1], SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err == 0) {
    c->connecting = false;
    return;
  }
  lh_log(LH_LOG_DEBUG, "netem: connection %llu: upstream: %s", (unsigned long long)c->id,
         strerror(err));
  COUNT(n, upstream_failed, 1);
  close_conn(n, c, false);
}

static void handle_events(lh_netem *n, conn *c, const struct pollfd *p, int64_t now) {
  short re[2] = {p[0].revents, p[1].revents};
  if (c->connecting) { /* fd[1] was polled for the connect's end only */
    if (re[1]) finish_connect(n, c);
    re[1] = 0;
  }
  for (int s = 0; s < 2 && !c->dead; s++) {
    if (re[s] & POLLERR) {
      close_conn(n, c, true); /* a reset from one side resets the other */
      return;
    }
    if (re[s] & POLLOUT) c->d[1 - s].blocked = false;
    if ((re[s] & (POLLIN | POLLHUP)) && wants_read(n, c, s)) {
      read_side(n, c, s, now);
    } else if ((re[s] & POLLHUP) && !(re[s] & POLLOUT)) {
      /* polled for writing only, and hung up: the socket is closed (a FIN we would read
       * could not hang it up while our write side is open); left alone it would be reported
       * by every poll */
      close_conn(n, c, true);
    }
  }
}

static void *loop(void *arg) {
  lh_netem *n = arg;
  for (;;) {
    int64_t now = now_us();
    for (int i = 0; i < n->n_conns; i++)
      for (int k = 0; k < 2 && !n->conns[i]->dead; k++)
        pump_dir(n, n->conns[i], k, now);
    for (int i = 0; i < n->n_conns; i++) {
      conn *c = n->conns[i];
      if (!c->dead && c->d[0].fin_sent && c->d[1].fin_sent) close_conn(n, c, false);
    }
    sweep(n);
    int64_t next = INT64_MAX;
    nfds_t np = build_poll(n, now, &next);
    struct timespec ts, *tp = NULL;
    if (next != INT64_MAX) {
      int64_t wait = next > now ? next - now : 0;
      ts.tv_sec = (time_t)(wait / 1000000);
      ts.tv_nsec = (long)(wait % 1000000) * 1000;
      tp = &ts;
    }
    int r = ppoll(n->pfd, np, tp, NULL);
    if (r < 0) {
      if (errno != EINTR) { /* ENOMEM: try again a little later */
        lh_log(LH_LOG_WARN, "netem: poll: %s", strerror(errno));
        nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
      }
      continue;
    }
    if (n->pfd[0].revents) break;
    now = now_us();
    int polled = n->n_conns; /* accept_all appends after these */
    for (int i = 0; i < polled; i++)
      if (!n->conns[i]->dead) handle_events(n, n->conns[i], &n->pfd[2 + 2 * i], now);
    if (n->pfd[1].revents) {
      sweep(n); /* the places of connections just closed are free again */
      accept_all(n, now);
    }
  }
  for (int i = 0; i < n->n_conns; i++)
    close_conn(n, n->conns[i], false);
  sweep(n);
  return NULL;
}

/* ---------------------------------------------------------------- public */

static lh_err listen_on(lh_netem *n, const struct sockaddr_in *sa) {
  char shown[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa->sin_addr, shown, sizeof shown);
  n->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (n->listen_fd < 0) return lh_errorf(LH_ERR_IO, "cannot make a socket: %s", strerror(errno));
  set_int_opt(n->listen_fd, SOL_SOCKET, SO_REUSEADDR, 1);
  set_int_opt(n->listen_fd, SOL_SOCKET, SO_RCVBUF, SOCK_BUF); /* inherited by accepted sockets */
  if (bind(n->listen_fd, (const struct sockaddr *)sa, sizeof *sa) != 0)
    return lh_errorf(LH_ERR_IO, "cannot listen on %s:%u: %s", shown, ntohs(sa->sin_port),
                     strerror(errno));
  if (listen(n->listen_fd, 128) != 0)
    return lh_errorf(LH_ERR_IO, "cannot listen on %s:%u: %s", shown, ntohs(sa->sin_port),
                     strerror(errno));
  struct sockaddr_in got;
  socklen_t len = sizeof got;
  if (getsockname(n->listen_fd, (struct sockaddr *)&got, &len) != 0)
    return lh_errorf(LH_ERR_IO, "getsockname: %s", strerror(errno));
  n->port = ntohs(got.sin_port);
  return LH_ERR_OK;
}

static void free_netem(lh_netem *n) {
  if (n->listen_fd >= 0) close(n->listen_fd);
  for (int i = 0; i < 2; i++)
    if (n->wake[i] >= 0) close(n->wake[i]);
  free(n->conns);
  free(n->pfd);
  pthread_mutex_destroy(&n->mu);
  free(n);
}

lh_err lh_netem_start(const lh_netem_config *cfg, lh_netem **out) {
  *out = NULL;
  struct sockaddr_in listen_sa;
  lh_err e = check_config(cfg);
  if (!e) e = loopback_addr(cfg->listen_host, cfg->listen_port, "listen", &listen_sa);
  struct sockaddr_in up;
  if (!e) e = loopback_addr(cfg->upstream_host, cfg->upstream_port, "upstream", &up);
  if (e) return e;
  lh_netem *n = calloc(1, sizeof *n);
  if (!n) return lh_errorf(LH_ERR_NOMEM, "netem: cannot allocate the proxy");
  n->listen_fd = n->wake[0] = n->wake[1] = -1;
  pthread_mutex_init(&n->mu, NULL);
  n->upstream = up;
  n->delay_us = (int64_t)cfg->delay_ms * 1000;
  n->jitter_us = (int64_t)cfg->jitter_ms * 1000;
  int64_t rto = 4 * n->delay_us; /* 2 x the round trip */
  n->rto_us = rto > LH_NETEM_MIN_RTO_MS * 1000 ? rto : LH_NETEM_MIN_RTO_MS * 1000;
  n->rate_kbps = cfg->rate_kbps;
  n->reset_after = cfg->reset_after;
  n->seed = cfg->seed;
  n->drop = cfg->drop;
  n->window = cfg->window_bytes ? cfg->window_bytes : LH_NETEM_DEFAULT_WINDOW;
  n->max_conns = cfg->max_connections ? cfg->max_connections : LH_NETEM_DEFAULT_CONNECTIONS;
  n->conns = calloc((size_t)n->max_conns, sizeof *n->conns);
  n->pfd = calloc(2 + 2 * (size_t)n->max_conns, sizeof *n->pfd);
  if (!n->conns || !n->pfd) {
    free_netem(n);
    return lh_errorf(LH_ERR_NOMEM, "netem: cannot allocate the connection table");
  }
  if (pipe2(n->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    e = lh_errorf(LH_ERR_IO, "netem: pipe: %s", strerror(errno));
    free_netem(n);
    return e;
  }
  e = listen_on(n, &listen_sa);
  if (e) {
    free_netem(n);
    return e;
  }
  /* the thread blocks every signal: they belong to the program that runs the proxy */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&n->thread, NULL, loop, n);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    free_netem(n);
    return lh_errorf(LH_ERR_IO, "netem: cannot start its thread: %s", strerror(rc));
  }
  *out = n;
  return LH_ERR_OK;
}

uint16_t lh_netem_port(const lh_netem *n) {
  return n->port;
}

void lh_netem_stats(const lh_netem *n, lh_netem_counters *stats) {
  pthread_mutex_t *mu = (pthread_mutex_t *)&n->mu; /* a snapshot does not change the proxy */
  pthread_mutex_lock(mu);
  *stats = n->stats;
  pthread_mutex_unlock(mu);
}

void lh_netem_stop(lh_netem *n) {
  if (!n) return;
  ssize_t w;
  do
    w = write(n->wake[1], "x", 1);
  while (w < 0 && errno == EINTR);
  pthread_join(n->thread, NULL);
  free_netem(n);
}
