/* The netem proxy against a loopback server of its own (a thread per connection that echoes, or
 * sends a fixed stream): bytes intact and in order both ways with jitter on, half-closes
 * forwarded, the round trip costs 2 x delay, the rate limit bounds throughput, the window bounds
 * bytes in flight, reset_after cuts after exactly that many bytes, drops delay but lose nothing,
 * non-loopback addresses and bad settings refused, max_connections refuses the extra one, a
 * refusing upstream closes the client, and stop with connections open frees everything. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/netem.h"

/* ---------------------------------------------------------------- a loopback server */

enum { ECHO, SOURCE };
#define SERVER_CONNS 32

typedef struct server {
  int fd, wake[2], mode;
  uint16_t port;
  const uint8_t *source; /* SOURCE: sent to each client, then the connection is closed */
  size_t source_len;
  pthread_t thread;
  pthread_t conn_thread[SERVER_CONNS];
  int conn_fd[SERVER_CONNS];
  int n;
} server;

typedef struct served {
  server *s;
  int fd;
} served;

static bool send_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= (size_t)w;
  }
  return true;
}

/* Echoes until EOF, then shuts its write side; or sends the source and closes its write side.
 * The fd is closed by server_stop, after the join, so its number is never reused meanwhile. */
static void *serve_conn(void *arg) {
  served *sv = arg;
  int fd = sv->fd;
  server *s = sv->s;
  free(sv);
  if (s->mode == SOURCE) {
    send_all(fd, s->source, s->source_len);
  } else {
    uint8_t buf[16384];
    for (;;) {
      ssize_t r = recv(fd, buf, sizeof buf, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0 || !send_all(fd, buf, (size_t)r)) break;
    }
  }
  shutdown(fd, SHUT_WR);
  return NULL;
}

static void *serve(void *arg) {
  server *s = arg;
  for (;;) {
    struct pollfd p[2] = {{.fd = s->fd, .events = POLLIN}, {.fd = s->wake[0], .events = POLLIN}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents) return NULL;
    int fd = accept(s->fd, NULL, NULL);
    if (fd < 0) continue;
    if (s->n == SERVER_CONNS) {
      close(fd);
      continue;
    }
    served *sv = malloc(sizeof *sv);
    sv->s = s;
    sv->fd = fd;
    s->conn_fd[s->n] = fd;
    assert_int_equal(pthread_create(&s->conn_thread[s->n], NULL, serve_conn, sv), 0);
    s->n++;
  }
}

static int listen_loopback(uint16_t *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(fd, 64), 0);
  socklen_t len = sizeof sa;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  *port = ntohs(sa.sin_port);
  return fd;
}

static server *server_start(int mode, const uint8_t *source, size_t source_len) {
  server *s = calloc(1, sizeof *s);
  s->mode = mode;
  s->source = source;
  s->source_len = source_len;
  s->fd = listen_loopback(&s->port);
  assert_int_equal(pipe(s->wake), 0);
  assert_int_equal(pthread_create(&s->thread, NULL, serve, s), 0);
  return s;
}

static void server_stop(server *s) {
  assert_int_equal(write(s->wake[1], "x", 1), 1);
  pthread_join(s->thread, NULL);
  for (int i = 0; i < s->n; i++)
    shutdown(s->conn_fd[i], SHUT_RDWR);
  for (int i = 0; i < s->n; i++) {
    pthread_join(s->conn_thread[i], NULL);
    close(s->conn_fd[i]);
  }
  close(s->fd);
  close(s->wake[0]);
  close(s->wake[1]);
  free(s);
}

/* ---------------------------------------------------------------- clients */

static double now_s(void) {
  return lh_time_now();
}

static int dial(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {
      .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons(port)};
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  return fd;
}

/* Sends out[0, n) (then shuts the write side when `shut`) while reading into in[0, cap) until
 * EOF, an error or cap bytes; returns the bytes read, *err 0 at EOF, else the errno (-1: cap
 * reached). Fails the test after 30 s without progress. */
static size_t exchange(int fd, const uint8_t *out, size_t n, bool shut, uint8_t *in, size_t cap,
                       int *err) {
  size_t sent = 0, got = 0;
  bool shut_done = false;
  *err = -1;
  while (got < cap) {
    if (sent == n && shut && !shut_done) {
      shutdown(fd, SHUT_WR);
      shut_done = true;
    }
    struct pollfd p = {.fd = fd, .events = (short)(POLLIN | (sent < n ? POLLOUT : 0))};
    int r = poll(&p, 1, 30000);
    if (r == 0) fail_msg("no progress for 30 s (sent %zu of %zu, read %zu)", sent, n, got);
    if (r < 0) continue;
    if ((p.revents & POLLOUT) && sent < n) {
      ssize_t w =
          send(fd, out + sent, n - sent > 65536 ? 65536 : n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) sent += (size_t)w;
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t rd = recv(fd, in + got, cap - got, MSG_DONTWAIT);
      if (rd == 0) {
        *err = 0;
        break;
      }
      if (rd < 0 && errno != EAGAIN && errno != EINTR) {
        *err = errno;
        break;
      }
      if (rd > 0) got += (size_t)rd;
    }
  }
  return got;
}

static void fill_random(uint8_t *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i += 16) {
    uint32_t w[4];
    lh_philox(seed, 0, i / 16, w);
    memcpy(p + i, w, n - i < 16 ? n - i : 16);
  }
}

static lh_netem *proxy(const lh_netem_config *base, uint16_t upstream) {
  lh_netem_config c = *base;
  c.listen_host = "127.0.0.1";
  c.upstream_host = "127.0.0.1";
  c.upstream_port = upstream;
  lh_netem *n = NULL;
  lh_err e = lh_netem_start(&c, &n);
  if (e) fail_msg("lh_netem_start: %s", lh_last_error());
  assert_true(lh_netem_port(n) != 0);
  return n;
}

/* Waits up to 5 s for the proxy's counters to satisfy `ok`. */
static lh_netem_counters wait_stats(lh_netem *n, bool (*ok)(const lh_netem_counters *)) {
  lh_netem_counters s;
  for (int i = 0; i < 500; i++) {
    lh_netem_stats(n, &s);
    if (ok(&s)) break;
    usleep(10000);
  }
  return s;
}

/* Echoes n random bytes through the proxy in one connection; returns the seconds it took. */
static double echo_through(lh_netem *n, size_t len, uint64_t seed) {
  uint8_t *out = malloc(len), *in = malloc(len + 1);
  fill_random(out, len, seed);
  int fd = dial(lh_netem_port(n));
  int err;
  double t0 = now_s();
  size_t got = exchange(fd, out, len, true, in, len + 1, &err);
  double dt = now_s() - t0;
  if (err != 0)
    fail_msg("echo of %zu bytes: expected EOF, got error %d after %zu bytes", len, err, got);
  assert_int_equal(got, len);
  assert_memory_equal(in, out, len);
  close(fd);
  free(out);
  free(in);
  return dt;
}

/* ---------------------------------------------------------------- tests */

static bool closed_all(const lh_netem_counters *s) {
  return s->active == 0;
}

static void test_integrity_with_jitter(void **state) {
  (void)state;
  server *s = server_start(ECHO, NULL, 0);
  lh_netem_config c = {.delay_ms = 5, .jitter_ms = 5, .seed = 11};
  lh_netem *n = proxy(&c, s->port);
  const size_t len = 3u << 20;
  double dt = echo_through(n, len, 1); /* the client's and the server's FINs both came through */
  lh_netem_counters st = wait_stats(n, closed_all);
  assert_int_equal(st.bytes_up, len);
  assert_int_equal(st.bytes_down, len);
  assert_int_equal(st.accepted, 1);
  assert_int_equal(st.active, 0); /* both FINs forwarded: the proxy closed the connection */
  assert_int_equal(st.dropped, 0);
  print_message("integrity: %zu bytes echoed through delay 5 +- 5 ms in %.2f s\n", len, dt);
  lh_netem_stop(n);
  server_stop(s);
}

static void test_round_trip_costs_twice_the_delay(void **state) {
  (void)state;
  server *s = server_start(ECHO, NULL, 0);
  lh_netem_config c = {.delay_ms = 100};
  lh_netem *n = proxy(&c, s->port);
  int fd = dial(lh_netem_port(n));
  for (int i = 0; i < 2; i++) { /* twice on one connection: the window adds nothing */
    uint8_t in[16];
    int err;
    double t0 = now_s();
    size_t got = exchange(fd, (const uint8_t *)"ping-0123456789", 16, false, in, 16, &err);
    double dt = now_s() - t0;
    assert_int_equal(got, 16);
    assert_memory_equal(in, "ping-0123456789", 16);
    print_message("round trip %d through delay 100 ms: %.0f ms\n", i, dt * 1e3);
    assert_true(dt >= 0.195);
    assert_true(dt < 1.5);
  }
  close(fd);
  lh_netem_stop(n);
  server_stop(s);
}

static void test_rate_limit(void **state) {
  (void)state;
  server *s = server_start(ECHO, NULL, 0);
  lh_netem_config c = {.rate_kbps = 800};
  lh_netem *n = proxy(&c, s->port);
  /* 200 KiB at 800 kbit/s (100 000 bytes/s) each way, the two directions pipelined: 2.05 s */
  double dt = echo_through(n, 200 * 1024, 2);
  print_message("rate: 200 KiB echoed at 800 kbit/s in %.2f s\n", dt);
  assert_true(dt >= 1.8);
  assert_true(dt < 8.0);
  lh_netem_stop(n);
  server_stop(s);
}

static void test_window_bounds_throughput(void **state) {
  (void)state;
  server *s = server_start(ECHO, NULL, 0);
  /* a 16 KiB window comes back a round trip (2 x 50 ms) after it was read: 160 KiB needs at
   * least 10 round trips each way */
  lh_netem_config c = {.delay_ms = 50, .window_bytes = 16384};
  lh_netem *n = proxy(&c, s->port);
  double dt = echo_through(n, 160 * 1024, 3);
  print_message("window: 160 KiB echoed with a 16 KiB window at 100 ms RTT in %.2f s\n", dt);
  assert_true(dt >= 0.9);
  assert_true(dt < 10.0);
  lh_netem_stop(n);
  server_stop(s);
}

static void test_reset_after(void **state) {
  (void)state;
  /* a download cut mid-transfer: the server sends 1 MiB, the proxy forwards exactly 100 000
   * bytes and resets; what the client read is a prefix of the stream */
  const size_t len = 1u << 20, cut = 100000;
  uint8_t *data = malloc(len), *in = malloc(len);
  fill_random(data, len, 4);
  server *s = server_start(SOURCE, data, len);
  lh_netem_config c = {.delay_ms = 2, .reset_after = cut};
  lh_netem *n = proxy(&c, s->port);
  int fd = dial(lh_netem_port(n));
  int err;
  size_t got = exchange(fd, NULL, 0, false, in, len, &err);
  print_message("reset_after %zu: the client read %zu bytes, then %s\n", cut, got,
                err == 0 ? "EOF" : strerror(err));
  assert_true(got <= cut);
  assert_true(got > 0);
  assert_memory_equal(in, data, got);
  assert_true(err == 0 || err == ECONNRESET);
  lh_netem_counters st = wait_stats(n, closed_all);
  assert_int_equal(st.reset, 1);
  assert_int_equal(st.bytes_down, cut);
  assert_int_equal(st.bytes_up, 0);
  close(fd);

  /* both directions count: an echo of 20 000 bytes is cut at 5 000 in all */
  server *e = server_start(ECHO, NULL, 0);
  lh_netem_config c2 = {.reset_after = 5000};
  lh_netem *n2 = proxy(&c2, e->port);
  fd = dial(lh_netem_port(n2));
  got = exchange(fd, data, 20000, false, in, len, &err);
  assert_true(got < 5000);
  assert_memory_equal(in, data, got);
  assert_true(err == 0 || err == ECONNRESET || err == EPIPE);
  st = wait_stats(n2, closed_all);
  assert_int_equal(st.bytes_up + st.bytes_down, 5000);
  assert_int_equal(st.reset, 1);
  close(fd);
  lh_netem_stop(n2);
  server_stop(e);
  lh_netem_stop(n);
  server_stop(s);
  free(data);
  free(in);
}

static void test_drops_delay_but_lose_nothing(void **state) {
  (void)state;
  server *s = server_start(ECHO, NULL, 0);
  /* every chunk lost once: each direction waits delay + the 200 ms retransmission timeout */
  lh_netem_config c = {.delay_ms = 10, .drop = 1.0, .seed = 5};
  lh_netem *n = proxy(&c, s->port);
  double dt = echo_through(n, 100, 5);
  print_message("drop 1: a round trip through delay 10 ms took %.0f ms\n", dt * 1e3);
  assert_true(dt >= 2 * (0.010 + 0.200) - 0.005);
  assert_true(dt < 3.0);
  lh_netem_counters st;
  lh_netem_stats(n, &st);
  assert_true(st.dropped >= 2);
  lh_netem_stop(n);

  /* 20% of ~45 chunks a direction: some stall, nothing is lost or reordered */
  lh_netem_config c2 = {.delay_ms = 2, .drop = 0.2, .seed = 7};
  n = proxy(&c2, s->port);
  dt = echo_through(n, 64 * 1024, 6);
  lh_netem_stats(n, &st);
  print_message("drop 0.2: 64 KiB echoed in %.2f s, %llu chunks dropped\n", dt,
                (unsigned long long)st.dropped);
  assert_true(st.dropped > 0);
  assert_true(dt >= 0.2);
  assert_int_equal(st.bytes_up, 64 * 1024);
  assert_int_equal(st.bytes_down, 64 * 1024);
  lh_netem_stop(n);
  server_stop(s);
}

static void expect_refused(lh_netem_config c, const char *needle) {
  lh_netem *n = (lh_netem *)&c; /* must be reset to NULL */
  lh_err e = lh_netem_start(&c, &n);
  if (e != LH_ERR_INVAL || !strstr(lh_last_error(), needle))
    fail_msg("expected INVAL with \"%s\", got %s: %s", needle, lh_err_name(e), lh_last_error());
  assert_null(n);
}

static void test_loopback_only_and_settings(void **state) {
  (void)state;
  const char *bad[] = {"10.0.0.1",   "0.0.0.0",     "8.8.8.8", "192.168.1.1",
                       "128.0.0.1",  "example.com", "::1",     "127.1",
                       " 127.0.0.1", "127.0.0.1 ",  ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    lh_netem_config c = {.listen_host = bad[i], .upstream_port = 9};
    expect_refused(c, "listen host");
    expect_refused(c, "netem never sends traffic off this machine");
    lh_netem_config u = {.upstream_host = bad[i], .upstream_port = 9};
    expect_refused(u, "upstream host");
  }
  lh_netem_config c = {.upstream_port = 9, .delay_ms = 10, .jitter_ms = 11};
  expect_refused(c, "jitter 11 ms is larger than the delay 10 ms");
  c = (lh_netem_config){.upstream_port = 0};
  expect_refused(c, "upstream port 0");
  c = (lh_netem_config){.upstream_port = 9, .drop = 1.5};
  expect_refused(c, "drop probability 1.5");
  c = (lh_netem_config){.upstream_port = 9, .drop = NAN};
  expect_refused(c, "drop probability");
  c = (lh_netem_config){.upstream_port = 9, .delay_ms = LH_NETEM_MAX_DELAY_MS + 1};
  expect_refused(c, "delay 60001 ms");
  c = (lh_netem_config){.upstream_port = 9, .window_bytes = 100};
  expect_refused(c, "window 100 bytes");
  c = (lh_netem_config){.upstream_port = 9, .max_connections = LH_NETEM_MAX_CONNECTIONS + 1};
  expect_refused(c, "max_connections");
  /* localhost and the rest of 127.0.0.0/8 are loopback */
  const char *good[] = {"localhost", "127.0.0.1", "127.0.0.2", NULL};
  for (int i = 0; i < 4; i++) {
    lh_netem_config ok = {.listen_host = good[i], .upstream_host = good[3 - i], .upstream_port = 9};
    lh_netem *n = NULL;
    lh_err e = lh_netem_start(&ok, &n);
    if (e) fail_msg("%s: %s", good[i] ? good[i] : "NULL", lh_last_error());
    lh_netem_stop(n);
  }
  lh_netem_stop(NULL);
}

static bool one_active(const lh_netem_counters *s) {
  return s->active == 1;
}

static void round_trip(int fd) {
  uint8_t in[5];
  int err;
  assert_int_equal(exchange(fd, (const uint8_t *)"hello", 5, false, in, 5, &err), 5);
  assert_memory_equal(in, "hello", 5);
}

static void test_max_connections(void **state) {
  (void)state;
  server *s = server_start(ECHO, NULL, 0);
  lh_netem_config c = {.max_connections = 2};
  lh_netem *n = proxy(&c, s->port);
  int a = dial(lh_netem_port(n)), b = dial(lh_netem_port(n));
  round_trip(a);
  round_trip(b);
  int extra = dial(lh_netem_port(n));
  uint8_t in[8];
  int err;
  double t0 = now_s();
  size_t got = exchange(extra, (const uint8_t *)"x", 1, false, in, sizeof in, &err);
  assert_int_equal(got, 0);
  assert_true(err == 0 || err == ECONNRESET);
  assert_true(now_s() - t0 < 5.0);
  lh_netem_counters st;
  lh_netem_stats(n, &st);
  assert_int_equal(st.accepted, 2);
  assert_int_equal(st.refused, 1);
  /* a connection closed frees its place */
  close(a);
  st = wait_stats(n, one_active);
  assert_int_equal(st.active, 1);
  int d = dial(lh_netem_port(n));
  round_trip(d);
  round_trip(b);
  lh_netem_stats(n, &st);
  assert_int_equal(st.accepted, 3);
  close(b);
  close(d);
  close(extra);
  lh_netem_stop(n);
  server_stop(s);
}

static bool one_failed(const lh_netem_counters *s) {
  return s->upstream_failed == 1 && s->active == 0;
}

static void test_upstream_refused(void **state) {
  (void)state;
  uint16_t port;
  int fd = listen_loopback(&port);
  close(fd); /* nothing listens there now */
  lh_netem_config c = {.delay_ms = 20};
  lh_netem *n = proxy(&c, port);
  int cl = dial(lh_netem_port(n));
  uint8_t in[8];
  int err;
  double t0 = now_s();
  size_t got = exchange(cl, NULL, 0, false, in, sizeof in, &err);
  assert_int_equal(got, 0);
  assert_true(err == 0 || err == ECONNRESET);
  assert_true(now_s() - t0 < 5.0);
  lh_netem_counters st = wait_stats(n, one_failed);
  assert_int_equal(st.upstream_failed, 1);
  assert_int_equal(st.active, 0);
  close(cl);
  lh_netem_stop(n);
}

static void test_stop_with_connections_open(void **state) {
  (void)state;
  server *s = server_start(ECHO, NULL, 0);
  lh_netem_config c = {.delay_ms = 500, .rate_kbps = 1000};
  lh_netem *n = proxy(&c, s->port);
  int fds[3];
  uint8_t *data = malloc(100000);
  fill_random(data, 100000, 8);
  for (int i = 0; i < 3; i++) { /* bytes queued in the proxy, none delivered yet */
    fds[i] = dial(lh_netem_port(n));
    assert_int_equal(send(fds[i], data, 100000, MSG_DONTWAIT | MSG_NOSIGNAL) > 0, 1);
  }
  usleep(50000);
  lh_netem_counters st;
  lh_netem_stats(n, &st);
  assert_int_equal(st.active, 3);
  assert_int_equal(st.bytes_up, 0);
  lh_netem_stop(n); /* closes all three; ASan checks nothing leaks */
  for (int i = 0; i < 3; i++) {
    uint8_t in[16];
    int err;
    assert_int_equal(exchange(fds[i], NULL, 0, false, in, sizeof in, &err), 0);
    assert_true(err == 0 || err == ECONNRESET);
    close(fds[i]);
  }
  free(data);
  server_stop(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_integrity_with_jitter),
      cmocka_unit_test(test_round_trip_costs_twice_the_delay),
      cmocka_unit_test(test_rate_limit),
      cmocka_unit_test(test_window_bounds_throughput),
      cmocka_unit_test(test_reset_after),
      cmocka_unit_test(test_drops_delay_but_lose_nothing),
      cmocka_unit_test(test_loopback_only_and_settings),
      cmocka_unit_test(test_max_connections),
      cmocka_unit_test(test_upstream_refused),
      cmocka_unit_test(test_stop_with_connections_open),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
