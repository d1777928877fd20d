/* longhaul base: per-thread error messages, fatal checks, checked allocation, logging, time,
 * atomic file writes. Everything here is safe to call from any thread. */
#include "longhaul/base.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static const char *const err_names[] = {
#define LH_ERR_NAME(name, msg) #name,
    LH_ERR_MAP(LH_ERR_NAME)
#undef LH_ERR_NAME
};
static const char *const err_msgs[] = {
#define LH_ERR_MSG(name, msg) msg,
    LH_ERR_MAP(LH_ERR_MSG)
#undef LH_ERR_MSG
};

static _Thread_local char last_msg[1024];

const char *lh_err_name(lh_err e) {
  return (unsigned)e < LH_ERR__COUNT ? err_names[e] : "UNKNOWN";
}

lh_err lh_errorf(lh_err code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  return code;
}

const char *lh_last_error(void) {
  return last_msg[0] ? last_msg : err_msgs[LH_ERR_INVAL];
}

void lh__fatal(const char *file, int line, const char *cond, const char *fmt, ...) {
  fprintf(stderr, "longhaul: fatal: %s:%d: check failed: %s: ", file, line, cond);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  abort();
}

void *lh_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  LH_CHECK(p, "out of memory allocating %zu bytes", n);
  return p;
}

void *lh_xcalloc(size_t count, size_t size) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  LH_CHECK(p, "out of memory allocating %zu x %zu bytes", count, size);
  return p;
}

void *lh_xmalloc_aligned(size_t n) {
  LH_CHECK(n <= SIZE_MAX - 63, "allocation of %zu bytes: size overflows", n);
  size_t rounded = (n + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  LH_CHECK(p, "out of memory allocating %zu bytes", n);
  return p;
}

void *lh_try_malloc_aligned(size_t n, const char *what) {
  void *p = NULL;
  if (n <= SIZE_MAX - 63) {
    size_t rounded = (n + 63) & ~(size_t)63;
    p = aligned_alloc(64, rounded ? rounded : 64);
  }
  if (!p) {
    if (n == SIZE_MAX)
      lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate: the size does not fit in %zu bytes", what,
                (size_t)SIZE_MAX);
    else
      lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %zu bytes (%.1f GiB)", what, n,
                (double)n / (double)(1u << 30));
  }
  return p;
}

size_t lh_size_mul(size_t a, size_t b) {
  size_t r;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

char *lh_xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = lh_xmalloc(n);
  memcpy(p, s, n);
  return p;
}

/* Length of the well-formed UTF-8 character at s[0, n) whose first byte is >= 0x80, or 0 when
 * the bytes there are not one (as the Unicode standard's table 3-7: no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len;
  unsigned lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else
    return 0;
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; i++)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return len;
}

/* Whether the well-formed character s[0, len) is one that lh_escape writes as \xNN bytes. */
static bool hidden_char(const unsigned char *s, size_t len) {
  if (len == 2) return s[0] == 0xC2 && s[1] <= 0x9F; /* C1 controls */
  if (len == 3 && s[0] == 0xE2 && s[1] == 0x80) return s[2] >= 0xA8 && s[2] <= 0xAE;
  if (len == 3 && s[0] == 0xE2 && s[1] == 0x81) return s[2] >= 0xA6 && s[2] <= 0xA9;
  return false;
}

const char *lh_escape(const char *s, size_t n, char *buf, size_t cap) {
  if (cap == 0) return "";
  static const char hex[] = "0123456789abcdef";
  const unsigned char *p = (const unsigned char *)s;
  size_t used = 0, safe = 0; /* safe: the last length with room for "..." after it */
  for (size_t i = 0; i < n;) {
    char unit[16];
    size_t ul = 0, take = 1;
    unsigned c = p[i];
    if (c == '\n' || c == '\r' || c == '\t' || c == '\\') {
      unit[ul++] = '\\';
      unit[ul++] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : '\\';
    } else if (c >= 0x20 && c < 0x7F) {
      unit[ul++] = (char)c;
    } else {
      size_t cl = c >= 0x80 ? utf8_char_len(p + i, n - i) : 0;
      bool esc = cl == 0 || hidden_char(p + i, cl);
      take = cl ? cl : 1;
      for (size_t k = 0; k < take; k++) {
        if (esc) {
          unit[ul++] = '\\';
          unit[ul++] = 'x';
          unit[ul++] = hex[p[i + k] >> 4];
          unit[ul++] = hex[p[i + k] & 15];
        } else {
          unit[ul++] = (char)p[i + k];
        }
      }
    }
    if (used + ul > cap - 1) { /* does not fit: cut back to where "..." fits */
      used = safe;
      for (int d = 0; d < 3 && used < cap - 1; d++)
        buf[used++] = '.';
      buf[used] = '\0';
      return buf;
    }
    memcpy(buf + used, unit, ul);
    used += ul;
    if (used + 3 <= cap - 1) safe = used;
    i += take;
  }
  buf[used] = '\0';
  return buf;
}

static int log_level = -1;

void lh_log(lh_log_level level, const char *fmt, ...) {
  if (log_level < 0) {
    const char *e = getenv("LONGHAUL_LOG");
    log_level = LH_LOG_INFO;
    if (e && !strcmp(e, "error")) log_level = LH_LOG_ERROR;
    if (e && !strcmp(e, "warn")) log_level = LH_LOG_WARN;
    if (e && !strcmp(e, "debug")) log_level = LH_LOG_DEBUG;
  }
  if ((int)level > log_level) return;
  static const char *const names[] = {"error", "warn", "info", "debug"};
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "longhaul: %s: %s\n", names[level], buf);
}

double lh_time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

lh_err lh_file_read(const char *path, size_t max_bytes, char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  FILE *f = fopen(path, "rbe");
  if (!f) return lh_errorf(LH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  lh_err err = LH_ERR_OK;
  char *buf = NULL;
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    err = lh_errorf(LH_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    goto out;
  }
  if (S_ISDIR(st.st_mode)) {
    err = lh_errorf(LH_ERR_IO, "%s: cannot read: it is a directory", path);
    goto out;
  }
  if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max_bytes) {
    err = lh_errorf(LH_ERR_LIMIT, "%s: %lld bytes, more than the limit of %zu", path,
                    (long long)st.st_size, max_bytes);
    goto out;
  }
  /* Read to the end rather than trusting the size: files in /proc say 0, pipes say nothing. */
  size_t limit = max_bytes < SIZE_MAX - 2 ? max_bytes + 1 : SIZE_MAX - 1; /* one byte over */
  size_t cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 2 : 4096, n = 0;
  if (cap > limit + 1) cap = limit + 1;
  for (;;) {
    if (n + 1 == cap) { /* full but for the NUL */
      if (n >= limit) break;
      size_t grown = cap > (limit + 1) / 2 ? limit + 1 : 2 * cap;
      char *p = realloc(buf, grown);
      if (!p) {
        err = lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, grown);
        goto out;
      }
      buf = p, cap = grown;
    } else if (!buf && !(buf = malloc(cap))) {
      err = lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, cap);
      goto out;
    }
    size_t got = fread(buf + n, 1, cap - 1 - n, f);
    n += got;
    if (got == 0) {
      if (ferror(f)) {
        err = lh_errorf(LH_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        goto out;
      }
      break;
    }
  }
  if (n > max_bytes) {
    err = lh_errorf(LH_ERR_LIMIT, "%s: more than the limit of %zu bytes", path, max_bytes);
    goto out;
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  buf = NULL;
out:
  free(buf);
  fclose(f);
  return err;
}

/* How many names lh_file_tmp_create tries before it gives up: leftovers of killed writers that
 * had this PID (containers repeat PIDs and the order of writes) take the first ones. */
#define TMP_TRIES 1024

lh_err lh_file_tmp_create(const char *path, char **tmp, int *fd) {
  static atomic_ulong calls;
  *tmp = NULL;
  *fd = -1;
  size_t cap = strlen(path) + 48;
  char *name = lh_xmalloc(cap);
  unsigned long first = 0;
  for (int i = 0; i < TMP_TRIES; i++) {
    unsigned long n = atomic_fetch_add(&calls, 1);
    if (i == 0) first = n;
    snprintf(name, cap, "%s.tmp.%ld.%lu", path, (long)getpid(), n);
    int f = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f >= 0) {
      *tmp = name;
      *fd = f;
      return LH_ERR_OK;
    }
    if (errno == EEXIST) continue;
    lh_err err = lh_errorf(LH_ERR_IO, "%s: cannot create: %s", name, strerror(errno));
    free(name);
    return err;
  }
  free(name);
  return lh_errorf(LH_ERR_IO,
                   "%s: cannot create a temporary file: the %d names tried, from %s.tmp.%ld.%lu "
                   "on, all exist",
                   path, TMP_TRIES, path, (long)getpid(), first);
}

lh_err lh_file_write_atomic(const char *path, const void *data, size_t len) {
  char *tmp = NULL;
  int fd = -1;
  lh_err err = lh_file_tmp_create(path, &tmp, &fd);
  if (err) goto out;
  const char *p = data;
  size_t left = len;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      err = lh_errorf(LH_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
      goto out;
    }
    p += w;
    left -= (size_t)w;
  }
  if (fsync(fd) != 0) {
    err = lh_errorf(LH_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    goto out;
  }
  if (close(fd) != 0) {
    fd = -1;
    err = lh_errorf(LH_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    unlink(tmp);
    goto out;
  }
  fd = -1;
  if ((err = lh_file_commit(tmp, path))) unlink(tmp);
out:
  if (fd >= 0) {
    close(fd);
    unlink(tmp);
  }
  free(tmp);
  return err;
}

lh_err lh_file_commit(const char *tmp, const char *path) {
  if (rename(tmp, path) != 0)
    return lh_errorf(LH_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
  char *dircopy = lh_xstrdup(path);
  int dfd = open(dirname(dircopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  free(dircopy);
  return LH_ERR_OK;
}

int lh_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int lh_thread_id(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

void lh_set_threads(int n) {
#ifdef _OPENMP
  if (n > 0) omp_set_num_threads(n);
#else
  (void)n;
#endif
}

lh_err lh_mkdir_p(const char *dir) {
  char *p = strdup(dir);
  if (!p) return lh_errorf(LH_ERR_NOMEM, "%s: out of memory", dir);
  lh_err e = LH_ERR_OK;
  size_t len = strlen(p);
  for (size_t i = 1; i <= len && !e; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
      e = lh_errorf(LH_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
    p[i] = c;
  }
  struct stat sb;
  if (!e && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
    e = lh_errorf(LH_ERR_IO, "%s: not a directory", dir);
  free(p);
  return e;
}

char *lh_path_join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  int slash = a > 0 && dir[a - 1] != '/';
  char *p = lh_xmalloc(a + (size_t)slash + b + 1);
  memcpy(p, dir, a);
  if (slash) p[a] = '/';
  memcpy(p + a + slash, name, b + 1);
  return p;
}

void lh_time_utc(char *buf, size_t cap, int millis) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char base[32];
  strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
  if (millis)
    snprintf(buf, cap, "%s.%03dZ", base, (int)(ts.tv_nsec / 1000000));
  else
    snprintf(buf, cap, "%sZ", base);
}
