/* longhaul netem: a TCP proxy on loopback that makes each connection through it behave like a
 * wide-area link (one-way delay, jitter, a bandwidth limit, lost segments, resets), for tests and
 * the demo: each worker talks to `longhaul serve` through its own proxy (this kernel has no tc
 * netem). It emulates at the level of a byte stream, not of packets: bytes are never lost,
 * duplicated or reordered; a "drop" is a late delivery, as TCP's retransmission makes it.
 *
 * What a connection through the proxy sees, per direction (client -> upstream and back):
 *  - delay_ms is added to EACH direction: a request and its reply cost 2 x delay_ms more than
 *    without the proxy (delay 75 gives a 150 ms round trip).
 *  - Bytes read from the sender are cut into chunks of at most LH_NETEM_CHUNK bytes (a segment).
 *    Each chunk is delivered delay_ms +- jitter_ms (uniform, drawn per chunk) after the link has
 *    sent it; a chunk is never delivered before the one ahead of it (a stream keeps its order),
 *    so jitter only ever holds bytes back.
 *  - rate_kbps (kilobits per second, 1000 bits): the link sends one chunk after another at that
 *    rate, each taking len x 8 / rate_kbps ms (a token bucket one chunk deep: no burst credit
 *    builds up while the link is idle). 0: unlimited. The limit applies to each direction of
 *    each connection on its own.
 *  - drop: each chunk is "lost" with this probability. It and everything behind it in that
 *    direction then arrive only after an extra retransmission timeout of
 *    max(200 ms, 2 x (2 x delay_ms)), as a TCP sender's retransmission would deliver them.
 *    Nothing is lost; the stream only stalls.
 *  - The window: at most window_bytes per direction are in flight, counted from when the proxy
 *    reads them from the sender until the emulated acknowledgement comes back, delay_ms after
 *    their delivery. While the window is full the proxy stops reading from the sender, whose
 *    writes then block as over a real link: one connection's throughput is at most about
 *    window_bytes per round trip, and the proxy holds at most window_bytes a direction.
 *  - Half-close: when one side shuts down its write side (FIN), the proxy shuts down its write
 *    side toward the other after delivering every byte queued ahead of the FIN (which takes the
 *    same delay). A connection is closed when both directions have finished so. A side that
 *    resets its connection (or a write to it fails) resets the other side too.
 *  - reset_after (0: never): once a connection has forwarded that many bytes, both directions
 *    together (the last write is cut to make it exact), both its sockets are closed with an RST
 *    (SO_LINGER 0). The client reads at most that many bytes, then sees a reset (or EOF); a
 *    download cut so is what HTTP Range requests resume.
 *  - An upstream that refuses the connection (or cannot be reached) closes the client's.
 *  - Connection setup costs no round trip: the kernel completes the client's handshake with the
 *    proxy at once, and the proxy connects to the upstream at once.
 *  - max_connections: connections beyond that many open at once are accepted and closed at once
 *    (counted as refused).
 *  The random draws (jitter, drops) come from Philox keyed by seed, per connection (numbered in
 *  the order they were accepted) and direction: a run with the same seed and the same reads
 *  makes the same draws.
 *
 * Loopback only: the listen and upstream hosts must be IPv4 literals in 127.0.0.0/8 or the name
 * "localhost" (taken as 127.0.0.1); anything else (another address, 0.0.0.0, any other name,
 * IPv6) is LH_ERR_INVAL, so the proxy can never send or accept traffic off this machine.
 *
 * Resources: one thread per proxy, running one poll loop with timers (no busy waiting); two
 * sockets and 2 x window_bytes of buffer (plus a few KiB of bookkeeping) per open connection, so
 * at most max_connections x 2 x window_bytes in all.
 * Ownership: lh_netem_start returns a proxy that lh_netem_stop stops (its connections closed,
 * its thread joined) and frees; stop accepts NULL. The config's strings are copied.
 * Thread safety: lh_netem_port and lh_netem_stats may be called from any thread while the proxy
 * runs; lh_netem_stop once, from one thread. The proxy's thread blocks every signal. */
#ifndef LONGHAUL_NETEM_H
#define LONGHAUL_NETEM_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

#define LH_NETEM_CHUNK               1448 /* bytes: one segment (a 1500-byte MTU's TCP payload) */
#define LH_NETEM_DEFAULT_WINDOW      (256u * 1024u)
#define LH_NETEM_DEFAULT_CONNECTIONS 64
#define LH_NETEM_MAX_DELAY_MS        60000
#define LH_NETEM_MAX_RATE_KBPS       100000000ull /* 100 Gbit/s */
#define LH_NETEM_MIN_WINDOW          4096
#define LH_NETEM_MAX_WINDOW          (64u * 1024u * 1024u)
#define LH_NETEM_MAX_CONNECTIONS     4096
#define LH_NETEM_MIN_RTO_MS          200

typedef struct lh_netem_config {
  const char *listen_host;   /* 127.x.y.z or "localhost"; NULL: 127.0.0.1 */
  uint16_t listen_port;      /* 0: the kernel picks a free port (see lh_netem_port) */
  const char *upstream_host; /* 127.x.y.z or "localhost"; NULL: 127.0.0.1 */
  uint16_t upstream_port;    /* 1 .. 65535 */
  uint32_t delay_ms;         /* one-way, added to each direction; <= LH_NETEM_MAX_DELAY_MS */
  uint32_t jitter_ms;        /* <= delay_ms */
  uint64_t rate_kbps;        /* per direction per connection; 0: unlimited */
  double drop;               /* probability in [0, 1] that a chunk is "lost" (delivered late) */
  uint64_t reset_after;      /* bytes forwarded (both directions) before an RST; 0: never */
  uint64_t seed;             /* of the jitter and drop draws */
  int max_connections;       /* open at once, 1 .. LH_NETEM_MAX_CONNECTIONS; 0: the default */
  size_t window_bytes;       /* per direction, LH_NETEM_MIN_WINDOW .. MAX; 0: the default */
} lh_netem_config;

typedef struct lh_netem_counters {
  uint64_t accepted;        /* connections proxied */
  uint64_t refused;         /* accepted and closed at once: max_connections were open */
  uint64_t reset;           /* connections closed with an RST by reset_after */
  uint64_t upstream_failed; /* connections whose upstream refused or could not be reached */
  uint64_t active;          /* connections open now */
  uint64_t bytes_up;        /* delivered client -> upstream */
  uint64_t bytes_down;      /* delivered upstream -> client */
  uint64_t dropped;         /* chunks "lost", i.e. held back a retransmission timeout */
} lh_netem_counters;

typedef struct lh_netem lh_netem;

/* Checks cfg (every out-of-range field is LH_ERR_INVAL naming it, a host that is not loopback
 * included), binds and listens (LH_ERR_IO when the port is taken), starts the proxy's thread and
 * returns. The upstream need not be listening yet: it is connected to per client connection. */
lh_err lh_netem_start(const lh_netem_config *cfg, lh_netem **out);
/* The port the proxy listens on (the kernel's choice when listen_port was 0). */
uint16_t lh_netem_port(const lh_netem *n);
/* The counters so far, a consistent snapshot. */
void lh_netem_stats(const lh_netem *n, lh_netem_counters *stats);
/* Closes the listening socket and every connection (unsent bytes are discarded), joins the
 * thread and frees everything. Accepts NULL. */
void lh_netem_stop(lh_netem *n);

#endif
