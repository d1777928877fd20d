/* `longhaul netem --listen HOST:PORT --upstream HOST:PORT [...]`: runs the WAN-emulating proxy of
 * include/longhaul/netem.h until SIGINT or SIGTERM. Prints one line on stdout once it listens
 * ("netem: listening on 127.0.0.1:PORT -> 127.0.0.1:UPSTREAM", flushed, so a script started with
 * --listen 127.0.0.1:0 can read the port), and its counters on stderr when it stops (exit 0):
 * "netem: stopped (SIGTERM): accepted=N refused=N reset=N upstream_failed=N bytes_up=N bytes_down=N
 * dropped=N". */
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longhaul/netem.h"

#define CMD "netem"

static const lh__flag flags[] = {
    {"listen", "HOST:PORT", true, "where to listen: 127.x.y.z or localhost; port 0: any free port"},
    {"upstream", "HOST:PORT", true, "where each client is connected to: 127.x.y.z or localhost"},
    {"delay", "MS", false,
     "one-way delay added to each direction, 2 x MS a round trip (default 0)"},
    {"jitter", "MS", false, "each chunk's delay uniform in delay +- MS, MS <= delay (default 0)"},
    {"rate", "KBPS", false, "kilobits/s per direction per connection (default 0 = unlimited)"},
    {"drop", "P", false, "probability in [0, 1] a chunk is lost and resent late (default 0)"},
    {"reset-after", "BYTES", false, "RST a connection after BYTES, both ways (default 0 = never)"},
    {"seed", "S", false, "seed of the jitter and drop draws (default 0)"},
    {"max-connections", "N", false, "open at once; more are closed at once (default 64)"},
    {"window", "BYTES", false, "bytes in flight per direction per connection (default 262144)"},
};

#define ABOUT                                                                                      \
  "A TCP proxy on loopback that makes every connection through it behave like a wide-area\n"       \
  "link. Bytes from each side are cut into chunks of at most 1448 bytes; each is sent at\n"        \
  "--rate and delivered --delay +- --jitter ms later, never ahead of the chunk before it\n"        \
  "(nothing is reordered). With --drop P a chunk is \"lost\" with probability P: it and\n"         \
  "everything behind it arrive a retransmission timeout, max(200, 4 x delay) ms, later;\n"         \
  "no byte is ever lost. At most --window bytes a direction are in flight, from when they\n"       \
  "are read until their emulated acknowledgement returns (delay ms after delivery); while\n"       \
  "the window is full the proxy stops reading from the sender. A FIN is forwarded after the\n"     \
  "bytes queued ahead of it; a reset from one side resets the other; an upstream that\n"           \
  "refuses closes the client. With --reset-after, both sockets of a connection are closed\n"       \
  "with an RST once it has forwarded exactly BYTES (both directions together).\n"                  \
  "Loopback only: both hosts must be in 127.0.0.0/8 (or localhost).\n"                             \
  "Prints \"netem: listening on HOST:PORT -> HOST:PORT\" on stdout once it listens, runs\n"        \
  "until SIGINT or SIGTERM, then prints its counters on stderr and exits 0."

/* HOST:PORT into a host (malloc'd) and a port in [lo, 65535]. */
static int parse_hostport(const char *flag, const char *v, long lo, char **host, uint16_t *port) {
  const char *colon = strrchr(v, ':');
  const char *p = colon ? colon + 1 : NULL;
  bool ok = colon && colon != v && *p;
  long x = 0;
  for (; ok && *p; p++) {
    ok = *p >= '0' && *p <= '9' && x <= 65535;
    x = x * 10 + (*p - '0');
  }
  if (!ok || x < lo || x > 65535)
    return lh__cli_error(CMD, LH__EXIT_USAGE,
                         "--%s: expected HOST:PORT with a port in [%ld, 65535], "
                         "got \"%s\"",
                         flag, lo, v);
  size_t n = (size_t)(colon - v);
  *host = lh_xmalloc(n + 1);
  memcpy(*host, v, n);
  (*host)[n] = '\0';
  *port = (uint16_t)x;
  return LH__ARGS_CONTINUE;
}

/* The host as the line prints it: localhost is 127.0.0.1; a literal in its canonical form. */
static void canonical(const char *host, char out[INET_ADDRSTRLEN]) {
  struct in_addr a;
  if (strcmp(host, "localhost") != 0 && inet_pton(AF_INET, host, &a) == 1)
    inet_ntop(AF_INET, &a, out, INET_ADDRSTRLEN);
  else
    snprintf(out, INET_ADDRSTRLEN, "127.0.0.1");
}

static int parse(lh__args *a, lh_netem_config *cfg, char **lhost, char **uhost) {
  int rc = parse_hostport("listen", lh__args_str(a, "listen", NULL), 0, lhost, &cfg->listen_port);
  if (rc == LH__ARGS_CONTINUE)
    rc = parse_hostport("upstream", lh__args_str(a, "upstream", NULL), 1, uhost,
                        &cfg->upstream_port);
  long delay = 0, jitter = 0, maxc = LH_NETEM_DEFAULT_CONNECTIONS;
  uint64_t window = LH_NETEM_DEFAULT_WINDOW;
  if (rc == LH__ARGS_CONTINUE) rc = lh__args_int(a, "delay", 0, LH_NETEM_MAX_DELAY_MS, 0, &delay);
  if (rc == LH__ARGS_CONTINUE) rc = lh__args_int(a, "jitter", 0, LH_NETEM_MAX_DELAY_MS, 0, &jitter);
  if (rc == LH__ARGS_CONTINUE && jitter > delay)
    rc = lh__cli_error(CMD, LH__EXIT_USAGE,
                       "--jitter %ld is larger than --delay %ld (a chunk's delay is drawn in delay "
                       "+- jitter and cannot be negative)",
                       jitter, delay);
  if (rc == LH__ARGS_CONTINUE)
    rc = lh__args_u64(a, "rate", LH_NETEM_MAX_RATE_KBPS, 0, &cfg->rate_kbps);
  if (rc == LH__ARGS_CONTINUE) rc = lh__args_double(a, "drop", 0.0, 1.0, 0.0, &cfg->drop);
  if (rc == LH__ARGS_CONTINUE)
    rc = lh__args_u64(a, "reset-after", UINT64_MAX, 0, &cfg->reset_after);
  if (rc == LH__ARGS_CONTINUE) rc = lh__args_u64(a, "seed", LH__SEED_MAX, 0, &cfg->seed);
  if (rc == LH__ARGS_CONTINUE)
    rc = lh__args_int(a, "max-connections", 1, LH_NETEM_MAX_CONNECTIONS,
                      LH_NETEM_DEFAULT_CONNECTIONS, &maxc);
  if (rc == LH__ARGS_CONTINUE)
    rc = lh__args_u64(a, "window", LH_NETEM_MAX_WINDOW, LH_NETEM_DEFAULT_WINDOW, &window);
  if (rc == LH__ARGS_CONTINUE && window < LH_NETEM_MIN_WINDOW)
    rc = lh__cli_error(CMD, LH__EXIT_USAGE, "--window: expected an integer in [%u, %u], got %llu",
                       LH_NETEM_MIN_WINDOW, LH_NETEM_MAX_WINDOW, (unsigned long long)window);
  cfg->listen_host = *lhost;
  cfg->upstream_host = *uhost;
  cfg->delay_ms = (uint32_t)delay;
  cfg->jitter_ms = (uint32_t)jitter;
  cfg->max_connections = (int)maxc;
  cfg->window_bytes = (size_t)window;
  return rc;
}

int lh__cmd_netem(int argc, char **argv) {
  lh__args a = {
      .cmd = CMD, .about = ABOUT, .flags = flags, .n_flags = (int)(sizeof flags / sizeof flags[0])};
  int rc = lh__args_parse(&a, argc, argv);
  if (rc != LH__ARGS_CONTINUE) return rc;
  lh_netem_config cfg = {0};
  char *lhost = NULL, *uhost = NULL;
  rc = parse(&a, &cfg, &lhost, &uhost);
  if (rc != LH__ARGS_CONTINUE) {
    free(lhost);
    free(uhost);
    return rc;
  }
  /* SIGINT and SIGTERM stay blocked except inside sigsuspend, so none is lost between the check
   * of lh__stop and the wait (the proxy's thread blocks every signal) */
  sigset_t stop_set, old;
  sigemptyset(&stop_set);
  sigaddset(&stop_set, SIGINT);
  sigaddset(&stop_set, SIGTERM);
  sigprocmask(SIG_BLOCK, &stop_set, &old);
  lh__stop_on_signals();
  lh_netem *n = NULL;
  lh_err e = lh_netem_start(&cfg, &n);
  if (e) {
    free(lhost);
    free(uhost);
    /* a host that is not loopback, or a setting out of range, is the flags' fault */
    return e == LH_ERR_INVAL ? lh__cli_error(CMD, LH__EXIT_USAGE, "%s", lh_last_error())
                             : lh__cli_fail(CMD);
  }
  char lshown[INET_ADDRSTRLEN], ushown[INET_ADDRSTRLEN];
  canonical(lhost, lshown);
  canonical(uhost, ushown);
  free(lhost);
  free(uhost);
  char rate[48] = "unlimited", reset[48] = "never";
  if (cfg.rate_kbps) snprintf(rate, sizeof rate, "%llu kbit/s", (unsigned long long)cfg.rate_kbps);
  if (cfg.reset_after)
    snprintf(reset, sizeof reset, "after %llu bytes", (unsigned long long)cfg.reset_after);
  fprintf(stderr,
          "netem: delay %u ms each way (+- %u ms), rate %s, drop %g, reset %s, window %zu bytes, "
          "at most %d connections\n",
          cfg.delay_ms, cfg.jitter_ms, rate, cfg.drop, reset, cfg.window_bytes,
          cfg.max_connections);
  printf("netem: listening on %s:%u -> %s:%u\n", lshown, lh_netem_port(n), ushown,
         cfg.upstream_port);
  if (lh__cli_flush_stdout(CMD) != LH__EXIT_OK) {
    lh_netem_stop(n);
    return LH__EXIT_FAIL;
  }
  sigset_t wait_set = old;
  sigdelset(&wait_set, SIGINT);
  sigdelset(&wait_set, SIGTERM);
  while (!lh__stop)
    sigsuspend(&wait_set);
  lh_netem_counters s;
  lh_netem_stats(n, &s);
  lh_netem_stop(n);
  fprintf(stderr,
          "netem: stopped (%s): accepted=%llu refused=%llu reset=%llu upstream_failed=%llu "
          "bytes_up=%llu bytes_down=%llu dropped=%llu\n",
          lh__stop_name(), (unsigned long long)s.accepted, (unsigned long long)s.refused,
          (unsigned long long)s.reset, (unsigned long long)s.upstream_failed,
          (unsigned long long)s.bytes_up, (unsigned long long)s.bytes_down,
          (unsigned long long)s.dropped);
  return LH__EXIT_OK;
}
