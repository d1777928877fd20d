/* longhaul base: error codes with messages, logging, checked allocation, monotonic time.
 * Functions that can fail on outside input return an lh_err and leave a message that says what
 * was expected, what was found and where; lh_last_error() returns it (per thread). */
#ifndef LONGHAUL_BASE_H
#define LONGHAUL_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* longhaul's version, as `longhaul --version` prints it and run.json records it */
#define LH_VERSION "0.2.0"

/* One table generates the enum, the names and the default messages. */
#define LH_ERR_MAP(X)                                                                              \
  X(OK, "success")                                                                                 \
  X(INVAL, "invalid argument")                                                                     \
  X(NOMEM, "out of memory")                                                                        \
  X(IO, "input/output error")                                                                      \
  X(FORMAT, "malformed input")                                                                     \
  X(LIMIT, "input exceeds a configured limit")                                                     \
  X(MISMATCH, "input does not match what was expected")                                            \
  X(UNSUPPORTED, "unsupported feature or version")                                                 \
  X(NOTFOUND, "not found")                                                                         \
  X(NONFINITE, "a value is not a finite number")                                                   \
  X(USAGE, "invalid setting")                                                                      \
  X(SIGNATURE, "signature does not verify")

/* LH_ERR_SIGNATURE: a signature over outside bytes does not verify under the key it claims (the
 * bytes were changed after signing); a signature by another key than the pinned one is
 * LH_ERR_MISMATCH. */
/* LH_ERR_USAGE: the caller's settings are wrong, not the data they name: an environment spec
 * with an unknown or repeated key or an out-of-range value (lh_env_config_parse, lh_env_create).
 * A command line reports it as a usage error (exit code 2), like a bad flag. */

typedef enum {
#define LH_ERR_ENUM(name, msg) LH_ERR_##name,
  LH_ERR_MAP(LH_ERR_ENUM)
#undef LH_ERR_ENUM
      LH_ERR__COUNT
} lh_err;

/* Short name of a code, e.g. "FORMAT". */
const char *lh_err_name(lh_err e);
/* Sets the calling thread's last-error message (printf format) and returns `code`. */
lh_err lh_errorf(lh_err code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The calling thread's last-error message, or the default message of the last code. */
const char *lh_last_error(void);

/* Internal invariants: abort with file, line and a hint. Never for outside input. */
#define LH_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) lh__fatal(__FILE__, __LINE__, #cond, __VA_ARGS__);                                \
  } while (0)
_Noreturn void lh__fatal(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Allocation that aborts on failure (trainer setup, sizes already validated). Memory from
 * lh_xmalloc_aligned is 64-byte aligned and released with free(). */
void *lh_xmalloc(size_t n);
void *lh_xcalloc(size_t count, size_t size);
void *lh_xrealloc(void *p, size_t n);
void *lh_xmalloc_aligned(size_t n);
char *lh_xstrdup(const char *s);
/* Allocation sized by a config file or a user, which must fail with a message instead of
 * aborting: n bytes, 64-byte aligned, released with free(); on failure returns NULL with
 * LH_ERR_NOMEM's message set to "WHAT: cannot allocate N bytes (G GiB)". n == SIZE_MAX (what
 * lh_size_mul saturates to) always fails. */
void *lh_try_malloc_aligned(size_t n, const char *what);
/* The same for a large buffer that is streamed through again and again (a model's weights):
 * aligned to 2 MiB and, on Linux, marked for transparent huge pages (madvise MADV_HUGEPAGE)
 * before any of it is touched, so the kernel backs it with 2 MiB pages where it can: one TLB
 * entry and one page fault per 2 MiB instead of per 4 KiB; when a 2 MiB-aligned block cannot be
 * had, as lh_try_malloc_aligned. Released with free(). */
void *lh_try_malloc_huge(size_t n, const char *what);
/* a * b, or SIZE_MAX when the product does not fit: chains of products that saturate. */
size_t lh_size_mul(size_t a, size_t b);

/* Printable text for a message or a log line from bytes s[0, n) that came from outside (a data
 * file, a spec, a program's output), so that they cannot move the cursor, recolour or clear a
 * terminal, or hide what follows them: valid UTF-8 is kept, "\n", "\r", "\t" and "\\" become
 * those two-character escapes, and every other control byte (C0, DEL), C1 control (U+0080 to
 * U+009F), line or paragraph separator (U+2028, U+2029), bidirectional embedding, override or
 * isolate (U+202A to U+202E, U+2066 to U+2069) and byte of ill-formed UTF-8 becomes \xNN, one
 * per byte. Writes at most cap bytes to buf, the NUL included; text that does not fit ends with
 * "..." (never inside an escape or a character). Returns buf, or "" when cap is 0; s may be NULL
 * when n is 0. */
const char *lh_escape(const char *s, size_t n, char *buf, size_t cap);

/* Logging to stderr; level from LONGHAUL_LOG (error, warn, info, debug), default info. */
typedef enum { LH_LOG_ERROR, LH_LOG_WARN, LH_LOG_INFO, LH_LOG_DEBUG } lh_log_level;
void lh_log(lh_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Monotonic time in seconds. */
double lh_time_now(void);

/* Whole-file helpers.
 *
 * Reading. lh_file_open_read opens PATH read-only (close-on-exec) only when it names a regular
 * file, after a stat and again on the open descriptor: a FIFO (opened with O_NONBLOCK, so it
 * never waits for a writer), a device, a socket or a directory is refused with LH_ERR_IO and
 * "PATH: not a regular file (a FIFO)". Commands that read standard input say so ("-") and read
 * it themselves. lh_file_read reads a whole file so opened into a malloc'd buffer
 * (NUL-terminated, *len excludes the NUL); files larger than max_bytes are refused with
 * LH_ERR_LIMIT.
 *
 * Writing. lh_file_write_atomic writes `data` as the whole new content of PATH, and what it does
 * depends on what PATH names (the same for lh_file_out_open and lh_safetensors_write):
 *  - nothing, or a regular file: a new temporary file in PATH's directory (lh_file_tmp_create)
 *    is written, fsynced and renamed over PATH, and the directory fsynced, so PATH holds the old
 *    content or the new, never a mix; on failure the temporary file is removed (only the one it
 *    created). Stale temporary files of PATH (PATH.tmp.PID.N of a dead PID, see
 *    lh_file_clean_stale_tmp) are removed first.
 *  - a symbolic link (a chain of them): followed to its final target, a regular file or a name
 *    that does not exist yet, and that TARGET is replaced as above (the temporary file is made
 *    in the target's directory); the link stays. More than 40 links is an error.
 *  - /dev/stdout, /dev/stderr, /dev/fd/N or /proc/self/fd/N: written to that open descriptor of
 *    this process at its current offset (stdout or stderr flushed first), never replaced.
 *  - a FIFO, a character or block device or any other file that is neither regular nor a
 *    directory: written in place, opened for writing without creating or truncating it (a pipe,
 *    /dev/null, a terminal). A FIFO waits for a reader, as a shell redirection does. A write
 *    error is reported ("/dev/full: write failed: No space left on device"); nothing is
 *    fsynced and nothing is atomic there.
 *  - a directory: refused, LH_ERR_IO "PATH: is a directory, expected a file".
 * lh_file_out_* stream the same writes for content too large to assemble in memory:
 * lh_file_out_open decides as above, lh_file_out_write appends (buffered), lh_file_out_commit
 * finishes (fsync + rename, or flush) and lh_file_out_free abandons an uncommitted write
 * (removing its temporary file) and frees; it accepts NULL. lh_file_out_check reports, without
 * writing anything, the error lh_file_out_open would give for what PATH names now, or
 * LH_ERR_IO when the directory that would hold the temporary file (or the file written in
 * place) is not writable: for failing early, before a long job. */
lh_err lh_file_open_read(const char *path, int *fd);
lh_err lh_file_read(const char *path, size_t max_bytes, char **out, size_t *len);
lh_err lh_file_write_atomic(const char *path, const void *data, size_t len);
typedef struct lh_file_out lh_file_out;
lh_err lh_file_out_open(const char *path, lh_file_out **out);
lh_err lh_file_out_write(lh_file_out *o, const void *data, size_t len);
lh_err lh_file_out_commit(lh_file_out *o);
void lh_file_out_free(lh_file_out *o);
lh_err lh_file_out_check(const char *path);
/* Removes, in directory dir, the temporary files that killed atomic writes left: regular files
 * named exactly NAME.tmp.PID.N (NAME not empty, PID and N decimal numbers, as
 * lh_file_tmp_create names them) whose PID is not a live process (kill(PID, 0) fails with
 * ESRCH). A file of a live process (another writer, or this one), or of a PID that exists but
 * belongs to another user, is kept; so is every name that does not match exactly and anything
 * that is not a regular file. Returns LH_ERR_IO naming dir when it cannot be listed, or the
 * first file that could not be removed (the others are still tried). PIDs are those of this
 * PID namespace: a writer in another container that shares the directory looks dead. */
lh_err lh_file_clean_stale_tmp(const char *dir);
/* Reads one line from f: bytes up to and including '\n' (or to the end of the input) into *buf,
 * grown as getline(3) grows it (the caller frees it); *len is its length with the '\n'. At the
 * end of the input *len is 0. A line of more than max bytes (its '\n' included) is LH_ERR_LIMIT
 * "line longer than MAX bytes", after reading at most max + 1 of its bytes (an endless line,
 * such as /dev/zero's, costs max bytes of memory); a read error is LH_ERR_IO. Callers put
 * "FILE:LINE: " before the message. */
lh_err lh_file_getline(FILE *f, size_t max, char **buf, size_t *cap, size_t *len);
/* Creates (O_EXCL, mode 0644, close-on-exec) and opens for writing the temporary file of one
 * atomic write of path, "PATH.tmp.PID.N", N counting this process's tries, so no two writers
 * (threads or processes) share one. A name that exists already (left by a killed writer that
 * had this PID) is skipped, never opened or removed, and the next N is tried, up to 1024 names;
 * then LH_ERR_IO. On success *tmp is the name (malloc'd, the caller frees it) and *fd the open
 * file, which the caller closes (or fdopen()s) and renames or unlinks; on failure *tmp is NULL
 * and *fd is -1. */
lh_err lh_file_tmp_create(const char *path, char **tmp, int *fd);
/* The last step of an atomic write whose temporary file (or directory) is written and fsynced:
 * renames tmp over path and fsyncs the directory that holds path. */
lh_err lh_file_commit(const char *tmp, const char *path);
/* mkdir -p: creates every missing component of dir (mode 0755); fails if dir is not a
 * directory afterwards. */
lh_err lh_mkdir_p(const char *dir);

/* DIR/NAME, malloc'd (DIR "" gives NAME; a trailing '/' of DIR is not doubled). For building
 * paths of any length: no fixed-size buffers. */
char *lh_path_join(const char *dir, const char *name);
/* Whether two paths name the same file (./m, m/ and /abs/m are one), compared by device and
 * inode when both exist, else as strings. */
bool lh_path_same(const char *a, const char *b);
/* The current wall-clock time in UTC as ISO 8601, "2026-12-01T14:30:00Z", or with milliseconds
 * "2026-12-01T14:30:00.123Z"; buf holds at least 32 bytes. */
void lh_time_utc(char *buf, size_t cap, int millis);

/* Number of threads OpenMP loops use (1 without OpenMP); lh_set_threads(0) keeps the default. */
int lh_threads(void);
void lh_set_threads(int n);
/* Index of the calling thread in the current OpenMP team, in [0, lh_threads()); 0 outside. */
int lh_thread_id(void);

/* A barrier for the threads of one team (an OpenMP parallel region, or pthreads) that runs many
 * short steps one after the other, as an inference forward does: a thread that arrives early
 * spins for a while, then sleeps (a futex on Linux, else it yields), so a gap of a few
 * microseconds between two steps costs no wake-up and a long one no CPU. How long it spins
 * adapts, process-wide, to how waits end: it halves after a wait that had to sleep and grows
 * back (up to 100 us) after waits that did not, so on a machine whose cores are busy with other
 * work, where the thread waited for is often descheduled and spinning only burns the time it
 * needs, the waiting threads soon sleep at once. LH_SPIN_US=N in the environment fixes it at N
 * microseconds instead (0: always sleep at once). Zero-initialise the barrier ({0}) before the
 * team starts; every thread of a team of n calls lh_barrier_wait(b, n), all with the same n;
 * none returns before all n have called it, and what each thread wrote before the call is
 * visible to every thread after it. Reusable at once. */
typedef struct lh_barrier {
  _Atomic unsigned arrived, phase, sleepers; /* private */
} lh_barrier;
void lh_barrier_wait(lh_barrier *b, int n);

/* The JSON type of a jansson value in words ("integer", "string", ...), for error messages
 * such as "field num_heads: expected an integer, found string". */
struct json_t;
const char *lh_json_type_name(const struct json_t *v);
/* A JSON string of the bytes s[0..n): unchanged when they are UTF-8; otherwise each maximal
 * ill-formed subpart becomes U+FFFD (as Python's decode(errors="replace")), so model output cut
 * inside a character still encodes. NULL only when out of memory. */
struct json_t *lh_json_text(const char *s, size_t n);
/* Bounds what parsing outside JSON text will cost before jansson builds its tree, which takes
 * ~50 bytes per value and ~200 per object, whatever the text's size: "[{},{},...]" costs ~80
 * bytes of memory per byte. Counts, outside strings, the brackets that open an object or array
 * and the separators (, and :); more than max_open openings or max_tokens of both is an
 * LH_ERR_LIMIT error naming `what`. */
lh_err lh_json_check_cost(const char *text, size_t len, size_t max_open, size_t max_tokens,
                          const char *what);

/* Little-endian words of the byte formats (rollout batches, patches, snapshots), whatever the
 * host's byte order. */
static inline void lh_put_le16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}
static inline void lh_put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline void lh_put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t lh_get_le16(const uint8_t *p) {
  return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t lh_get_le32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}
static inline uint64_t lh_get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* BLAKE2b-256 of data[0..len) (libsodium), and its lowercase hex (65 bytes with the NUL). */
#define LH_HASH_BYTES 32
void lh_hash256(const void *data, size_t len, uint8_t out[LH_HASH_BYTES]);
void lh_hash_hex(const uint8_t h[LH_HASH_BYTES], char hex[2 * LH_HASH_BYTES + 1]);

/* Philox4x32-10 counter-based generator: four 32-bit words for key `seed` and counter
 * (stream, position). The same inputs give the same words on any thread or machine. */
void lh_philox(uint64_t seed, uint64_t stream, uint64_t position, uint32_t out[4]);
/* A uniform float in [0, 1) from one 32-bit word (its top 24 bits). */
float lh_uniform_from_u32(uint32_t w);
/* Two independent standard normals from one Philox call (Box-Muller). */
void lh_philox_normal2(uint64_t seed, uint64_t stream, uint64_t position, float out[2]);

#endif
