/* longhaul base: per-thread error messages, fatal checks, checked allocation, logging, time,
 * atomic file writes. Everything here is safe to call from any thread. */
#include "longhaul/base.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

void *lh_xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  LH_CHECK(q, "out of memory reallocating %zu bytes", n);
  return q;
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

void *lh_try_malloc_huge(size_t n, const char *what) {
  const size_t huge = (size_t)2 << 20;
  if (n > SIZE_MAX - huge) return lh_try_malloc_aligned(SIZE_MAX, what); /* the same message */
  size_t rounded = n ? (n + huge - 1) / huge * huge : huge;
  void *p = aligned_alloc(huge, rounded);
  if (!p) return lh_try_malloc_aligned(n, what); /* fails with its message, or gets 64 bytes */
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE); /* a hint: without it the pages are 4 KiB, nothing else */
#endif
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

/* Read once, on the first message of any thread (services log from their own threads). */
static int log_level = LH_LOG_INFO, log_tty;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_init(void) {
  const char *e = getenv("LONGHAUL_LOG");
  if (e && !strcmp(e, "error")) log_level = LH_LOG_ERROR;
  if (e && !strcmp(e, "warn")) log_level = LH_LOG_WARN;
  if (e && !strcmp(e, "debug")) log_level = LH_LOG_DEBUG;
  log_tty = isatty(2);
}

void lh_log(lh_log_level level, const char *fmt, ...) {
  pthread_once(&log_once, log_init);
  if ((int)level > log_level) return;
  static const char *const names[] = {"error", "warn", "info", "debug"};
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  /* on a terminal, a progress line may be open (drawn with \r): clear it first, so the message
   * starts its own line; the progress line is redrawn after the next step */
  fprintf(stderr, "%slonghaul: %s: %s\n", log_tty ? "\r\033[K" : "", names[level], buf);
}

double lh_time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "a FIFO", "a directory", ...: what a file of mode m is, for "not a regular file" messages. */
static const char *file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "neither a file nor a directory";
}

lh_err lh_file_open_read(const char *path, int *fd) {
  *fd = -1;
  /* stat first, so a device is never opened (opening some has effects); then the descriptor is
   * checked again, in case the name changed in between */
  struct stat sb;
  if (stat(path, &sb) != 0)
    return lh_errorf(LH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  if (!S_ISREG(sb.st_mode))
    return lh_errorf(LH_ERR_IO, "%s: not a regular file (%s)", path, file_kind(sb.st_mode));
  int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (f < 0) return lh_errorf(LH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  if (fstat(f, &sb) != 0) {
    lh_err e = lh_errorf(LH_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    close(f);
    return e;
  }
  if (!S_ISREG(sb.st_mode)) {
    close(f);
    return lh_errorf(LH_ERR_IO, "%s: not a regular file (%s)", path, file_kind(sb.st_mode));
  }
  int flags = fcntl(f, F_GETFL);
  if (flags >= 0) fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
  *fd = f;
  return LH_ERR_OK;
}

lh_err lh_file_read(const char *path, size_t max_bytes, char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  int fd = -1;
  lh_err err = lh_file_open_read(path, &fd);
  if (err) return err;
  char *buf = NULL;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    err = lh_errorf(LH_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    goto out;
  }
  if ((uint64_t)st.st_size > max_bytes) {
    err = lh_errorf(LH_ERR_LIMIT, "%s: %lld bytes, more than the limit of %zu", path,
                    (long long)st.st_size, max_bytes);
    goto out;
  }
  /* Read to the end rather than trusting the size: files in /proc say 0. */
  size_t limit = max_bytes < SIZE_MAX - 2 ? max_bytes + 1 : SIZE_MAX - 1; /* one byte over */
  size_t cap = (size_t)st.st_size + 2, n = 0;
  if (cap > limit + 1) cap = limit + 1;
  if (cap < 64) cap = 64 < limit + 1 ? 64 : limit + 1;
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
    ssize_t got = read(fd, buf + n, cap - 1 - n);
    if (got < 0) {
      if (errno == EINTR) continue;
      err = lh_errorf(LH_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
      goto out;
    }
    if (got == 0) break;
    n += (size_t)got;
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
  close(fd);
  return err;
}

lh_err lh_file_getline(FILE *f, size_t max, char **buf, size_t *cap, size_t *len) {
  *len = 0;
  size_t n = 0;
  lh_err err = LH_ERR_OK;
  flockfile(f);
  for (;;) {
    int c = getc_unlocked(f);
    if (c == EOF) {
      if (ferror(f)) err = lh_errorf(LH_ERR_IO, "read error: %s", strerror(errno));
      break;
    }
    if (n == max) {
      err = lh_errorf(LH_ERR_LIMIT, "line longer than %zu bytes", max);
      break;
    }
    if (n + 2 > *cap) { /* room for c and the NUL */
      size_t want = *cap ? 2 * *cap : 256, top = max < SIZE_MAX - 1 ? max + 1 : SIZE_MAX;
      if (want > top) want = top;
      if (want < n + 2) want = n + 2;
      char *p = realloc(*buf, want);
      if (!p) {
        err = lh_errorf(LH_ERR_NOMEM, "cannot allocate %zu bytes for a line", want);
        break;
      }
      *buf = p, *cap = want;
    }
    (*buf)[n++] = (char)c;
    if (c == '\n') break;
  }
  funlockfile(f);
  if (err) return err;
  if (*buf) (*buf)[n] = '\0';
  *len = n;
  return LH_ERR_OK;
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

/* ---------------------------------------------------------------- stale temporary files */

/* Whether name is PREFIX.tmp.PID.N exactly (prefix NULL: any non-empty NAME); *pid is PID. */
static int stale_name(const char *name, const char *prefix, long *pid) {
  size_t len = strlen(name);
  /* from the end: N digits, '.', PID digits, ".tmp." */
  size_t i = len;
  while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
    i--;
  if (i == len || i == 0 || name[i - 1] != '.') return 0;
  if (name[i] == '0' && i + 1 < len) return 0; /* "%lu" writes no leading zero */
  size_t pid_end = --i;
  while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
    i--;
  if (i == pid_end || pid_end - i > 9 || name[i] == '0' || i < 5 ||
      memcmp(name + i - 5, ".tmp.", 5) != 0)
    return 0;
  size_t name_len = i - 5;
  if (name_len == 0) return 0;
  if (prefix && (strlen(prefix) != name_len || memcmp(name, prefix, name_len) != 0)) return 0;
  long p = 0;
  for (size_t k = i; k < pid_end; k++)
    p = 10 * p + (name[k] - '0');
  if (p <= 0) return 0;
  *pid = p;
  return 1;
}

/* Removes the stale temporary files in dir named PREFIX.tmp.PID.N (prefix NULL: any NAME). */
static lh_err clean_stale(const char *dir, const char *prefix) {
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return lh_errorf(LH_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
  DIR *d = fdopendir(dfd);
  if (!d) {
    lh_err e = lh_errorf(LH_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    close(dfd);
    return e;
  }
  lh_err err = LH_ERR_OK;
  for (;;) {
    errno = 0;
    struct dirent *ent = readdir(d);
    if (!ent) {
      if (errno && !err) err = lh_errorf(LH_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
      break;
    }
    long pid = 0;
    if (!stale_name(ent->d_name, prefix, &pid)) continue;
    if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    struct stat sb;
    if (fstatat(dfd, ent->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (unlinkat(dfd, ent->d_name, 0) == 0) {
      lh_log(LH_LOG_DEBUG, "%s/%s: removed, a temporary file of process %ld, which is gone", dir,
             ent->d_name, pid);
    } else if (errno != ENOENT && !err) {
      err = lh_errorf(LH_ERR_IO, "%s/%s: cannot remove a stale temporary file: %s", dir,
                      ent->d_name, strerror(errno));
    }
  }
  closedir(d);
  return err;
}

lh_err lh_file_clean_stale_tmp(const char *dir) {
  if (!dir) return lh_errorf(LH_ERR_INVAL, "lh_file_clean_stale_tmp: NULL directory");
  return clean_stale(dir[0] ? dir : ".", NULL);
}

/* ---------------------------------------------------------------- output files */

#define OUT_BUF   (1u << 16)
#define MAX_LINKS 40

typedef enum { OUT_ATOMIC, OUT_IN_PLACE, OUT_FD } out_mode;

struct lh_file_out {
  out_mode mode;
  int fd;
  char *target; /* the file written (atomic: renamed over), for messages */
  char *tmp;    /* atomic: the temporary file, until renamed */
  lh_err err;   /* the first write error: later writes and the commit return it */
  size_t n;     /* bytes in buf */
  char buf[OUT_BUF];
};

/* What an output path resolves to. */
typedef struct {
  out_mode mode;
  char *target; /* malloc'd: the file to replace or open; NULL for OUT_FD */
  int fd;       /* OUT_FD */
} out_plan;

/* The descriptor a path names (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N,
 * /proc/PID/fd/N with this PID), or -1. */
static int named_fd(const char *p) {
  if (!strcmp(p, "/dev/stdout")) return 1;
  if (!strcmp(p, "/dev/stderr")) return 2;
  const char *rest = NULL;
  char own[64];
  snprintf(own, sizeof own, "/proc/%ld/fd/", (long)getpid());
  if (!strncmp(p, "/dev/fd/", 8))
    rest = p + 8;
  else if (!strncmp(p, "/proc/self/fd/", 14))
    rest = p + 14;
  else if (!strncmp(p, own, strlen(own)))
    rest = p + strlen(own);
  if (!rest || !*rest) return -1;
  long v = 0;
  for (const char *c = rest; *c; c++) {
    if (*c < '0' || *c > '9' || v > 1000000) return -1;
    v = 10 * v + (*c - '0');
  }
  return (int)v;
}

/* The directory part of path ("." when it has none). malloc'd. */
static char *dir_of(const char *path) {
  char *copy = lh_xstrdup(path);
  char *d = lh_xstrdup(dirname(copy));
  free(copy);
  return d;
}

/* A link's target, relative ones taken from the directory of the link. malloc'd or NULL. */
static char *link_target(const char *link) {
  char buf[4096];
  ssize_t n = readlink(link, buf, sizeof buf - 1);
  if (n < 0) return NULL;
  if ((size_t)n == sizeof buf - 1) {
    errno = ENAMETOOLONG;
    return NULL;
  }
  buf[n] = '\0';
  if (buf[0] == '/') return lh_xstrdup(buf);
  char *d = dir_of(link);
  size_t cap = strlen(d) + (size_t)n + 2;
  char *p = lh_xmalloc(cap);
  snprintf(p, cap, "%s/%s", d, buf);
  free(d);
  return p;
}

/* Decides how path is written (see base.h). */
static lh_err out_resolve(const char *path, out_plan *plan) {
  memset(plan, 0, sizeof *plan);
  plan->fd = -1;
  if (!path || !path[0]) return lh_errorf(LH_ERR_INVAL, "output file: empty path");
  char *cur = lh_xstrdup(path);
  for (int hops = 0;; hops++) {
    int fd = named_fd(cur);
    if (fd >= 0) {
      int fl = fcntl(fd, F_GETFL);
      free(cur);
      if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY)
        return lh_errorf(LH_ERR_IO, "%s: descriptor %d is not open for writing", path, fd);
      plan->mode = OUT_FD;
      plan->fd = fd;
      return LH_ERR_OK;
    }
    struct stat sb;
    if (lstat(cur, &sb) != 0) {
      if (errno == ENOENT) { /* a new file (a missing directory is reported when creating it) */
        plan->mode = OUT_ATOMIC;
        plan->target = cur;
        return LH_ERR_OK;
      }
      lh_err e = lh_errorf(LH_ERR_IO, "%s: cannot stat: %s", cur, strerror(errno));
      free(cur);
      return e;
    }
    if (S_ISLNK(sb.st_mode)) {
      if (hops >= MAX_LINKS) {
        free(cur);
        return lh_errorf(LH_ERR_IO, "%s: more than %d symbolic links to follow", path, MAX_LINKS);
      }
      char *next = link_target(cur);
      if (!next) {
        lh_err e = lh_errorf(LH_ERR_IO, "%s: cannot read the link: %s", cur, strerror(errno));
        free(cur);
        return e;
      }
      free(cur);
      cur = next;
      continue;
    }
    if (S_ISDIR(sb.st_mode)) {
      free(cur);
      return lh_errorf(LH_ERR_IO, "%s: is a directory, expected a file", path);
    }
    plan->mode = S_ISREG(sb.st_mode) ? OUT_ATOMIC : OUT_IN_PLACE;
    plan->target = cur;
    return LH_ERR_OK;
  }
}

lh_err lh_file_out_check(const char *path) {
  out_plan plan;
  lh_err e = out_resolve(path, &plan);
  if (e) return e;
  if (plan.mode == OUT_ATOMIC) {
    char *d = dir_of(plan.target);
    if (access(d, W_OK | X_OK) != 0)
      e = lh_errorf(LH_ERR_IO, "%s: cannot write to its directory %s: %s", path, d,
                    strerror(errno));
    free(d);
  } else if (plan.mode == OUT_IN_PLACE && access(plan.target, W_OK) != 0) {
    e = lh_errorf(LH_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
  }
  free(plan.target);
  return e;
}

lh_err lh_file_out_open(const char *path, lh_file_out **out) {
  *out = NULL;
  out_plan plan;
  lh_err err = out_resolve(path, &plan);
  if (err) return err;
  lh_file_out *o = lh_xcalloc(1, sizeof *o);
  o->mode = plan.mode;
  o->fd = -1;
  o->target = plan.target ? plan.target : lh_xstrdup(path);
  if (plan.mode == OUT_FD) {
    if (plan.fd == 1) fflush(stdout);
    if (plan.fd == 2) fflush(stderr);
    o->fd = plan.fd;
  } else if (plan.mode == OUT_IN_PLACE) {
    /* no O_CREAT, no O_TRUNC: the FIFO or device stays what it is */
    o->fd = open(o->target, O_WRONLY | O_CLOEXEC | O_NOCTTY);
    struct stat sb;
    if (o->fd < 0) {
      err = lh_errorf(LH_ERR_IO, "%s: cannot open for writing: %s", o->target, strerror(errno));
    } else if (fstat(o->fd, &sb) != 0) {
      err = lh_errorf(LH_ERR_IO, "%s: cannot stat: %s", o->target, strerror(errno));
    } else if (S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode)) { /* replaced since the lstat */
      err = lh_errorf(LH_ERR_IO, "%s: became %s while being opened; try again", o->target,
                      S_ISREG(sb.st_mode) ? "a regular file" : "a directory");
    }
  } else {
    char *d = dir_of(o->target), *base = lh_xstrdup(o->target);
    const char *b = strrchr(base, '/') ? strrchr(base, '/') + 1 : base;
    clean_stale(d, b); /* best effort: a leftover that cannot be removed does not stop a write */
    free(d);
    free(base);
    err = lh_file_tmp_create(o->target, &o->tmp, &o->fd);
  }
  if (err) {
    lh_file_out_free(o);
    return err;
  }
  *out = o;
  return LH_ERR_OK;
}

static lh_err out_put(lh_file_out *o, const char *p, size_t n) {
  const char *name = o->tmp ? o->tmp : o->target;
  while (n > 0) {
    ssize_t w = write(o->fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return lh_errorf(LH_ERR_IO, "%s: write failed: %s", name, strerror(errno));
    }
    if (w == 0) return lh_errorf(LH_ERR_IO, "%s: write failed: nothing written", name);
    p += w;
    n -= (size_t)w;
  }
  return LH_ERR_OK;
}

lh_err lh_file_out_write(lh_file_out *o, const void *data, size_t len) {
  if (!o) return lh_errorf(LH_ERR_INVAL, "lh_file_out_write: NULL output");
  if (o->err) return o->err;
  if (len <= OUT_BUF - o->n) {
    memcpy(o->buf + o->n, data, len);
    o->n += len;
    return LH_ERR_OK;
  }
  lh_err e = out_put(o, o->buf, o->n);
  o->n = 0;
  if (!e)
    e = len < OUT_BUF ? (memcpy(o->buf, data, len), o->n = len, LH_ERR_OK) : out_put(o, data, len);
  return o->err = e;
}

lh_err lh_file_out_commit(lh_file_out *o) {
  if (!o) return lh_errorf(LH_ERR_INVAL, "lh_file_out_commit: NULL output");
  if (o->err) return o->err;
  lh_err e = out_put(o, o->buf, o->n);
  o->n = 0;
  if (e) return o->err = e;
  if (o->mode == OUT_FD) {
    o->fd = -1; /* not ours to close */
    return LH_ERR_OK;
  }
  if (o->mode == OUT_ATOMIC && fsync(o->fd) != 0)
    return o->err = lh_errorf(LH_ERR_IO, "%s: fsync failed: %s", o->tmp, strerror(errno));
  int rc = close(o->fd);
  o->fd = -1;
  if (rc != 0)
    return o->err = lh_errorf(LH_ERR_IO, "%s: close failed: %s", o->tmp ? o->tmp : o->target,
                              strerror(errno));
  if (o->mode == OUT_ATOMIC) {
    if ((e = lh_file_commit(o->tmp, o->target))) return o->err = e;
    free(o->tmp);
    o->tmp = NULL; /* renamed: nothing to remove */
  }
  return LH_ERR_OK;
}

void lh_file_out_free(lh_file_out *o) {
  if (!o) return;
  if (o->fd >= 0 && o->mode != OUT_FD) close(o->fd);
  if (o->tmp) unlink(o->tmp);
  free(o->tmp);
  free(o->target);
  free(o);
}

lh_err lh_file_write_atomic(const char *path, const void *data, size_t len) {
  lh_file_out *o = NULL;
  lh_err err = lh_file_out_open(path, &o);
  if (!err) err = lh_file_out_write(o, data, len);
  if (!err) err = lh_file_out_commit(o);
  lh_file_out_free(o);
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

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
static void phase_sleep(_Atomic unsigned *phase, unsigned seen) {
  syscall(SYS_futex, (unsigned *)phase, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}
static void phase_wake(_Atomic unsigned *phase) {
  syscall(SYS_futex, (unsigned *)phase, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}
#else
static void phase_sleep(_Atomic unsigned *phase, unsigned seen) {
  (void)phase;
  (void)seen;
  sched_yield();
}
static void phase_wake(_Atomic unsigned *phase) {
  (void)phase;
}
#endif

static inline void spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* The spin budget in nanoseconds, shared by every barrier of the process: -1 until read from
 * LH_SPIN_US; fixed when that is set, else adapted between SPIN_MIN_NS and SPIN_MAX_NS. */
#define SPIN_MAX_NS 100000
#define SPIN_MIN_NS 2000
static _Atomic int spin_ns = -1;
static atomic_bool spin_fixed;

static int spin_budget(void) {
  int ns = atomic_load_explicit(&spin_ns, memory_order_relaxed);
  if (ns >= 0) return ns;
  const char *e = getenv("LH_SPIN_US");
  char *end = NULL;
  long us = e && *e ? strtol(e, &end, 10) : -1;
  if (e && *e && (*end || us < 0 || us > 1000000)) {
    lh_log(LH_LOG_WARN, "LH_SPIN_US=%s: expected microseconds from 0 to 1000000; adapting", e);
    us = -1;
  }
  if (us >= 0) atomic_store(&spin_fixed, true);
  ns = us >= 0 ? (int)(us * 1000) : SPIN_MAX_NS / 2;
  atomic_store_explicit(&spin_ns, ns, memory_order_relaxed);
  return ns;
}

/* a wait that ended while spinning grows the budget by 1/16; one that slept halves it (racy
 * updates lose a step now and then, which only delays the adaptation) */
static void spin_adapt(int ns, bool slept) {
  if (atomic_load_explicit(&spin_fixed, memory_order_relaxed)) return;
  int next = slept ? ns / 2 : ns + ns / 16 + 100;
  next = next < SPIN_MIN_NS ? SPIN_MIN_NS : next > SPIN_MAX_NS ? SPIN_MAX_NS : next;
  if (next != ns) atomic_store_explicit(&spin_ns, next, memory_order_relaxed);
}

/* The last thread to arrive resets the count and moves the phase on; the others wait for the
 * phase to move. A sleeper counts itself in `sleepers` before it checks the phase one last time
 * and the last arrival reads `sleepers` after moving the phase (all sequentially consistent), so
 * either the sleeper sees the new phase or the last arrival sees the sleeper and wakes it. */
void lh_barrier_wait(lh_barrier *b, int n) {
  if (n <= 1) return;
  unsigned seen = atomic_load(&b->phase);
  if (atomic_fetch_add(&b->arrived, 1) == (unsigned)n - 1) {
    atomic_store(&b->arrived, 0);
    atomic_fetch_add(&b->phase, 1);
    if (atomic_load(&b->sleepers)) phase_wake(&b->phase);
    return;
  }
  int budget = spin_budget();
  double until = -1;
  for (unsigned i = 0; budget > 0; i++) {
    if (atomic_load_explicit(&b->phase, memory_order_acquire) != seen) {
      spin_adapt(budget, false);
      return;
    }
    spin_pause();
    if (i % 64 == 0) { /* a clock read (~20 ns) every 64 pauses */
      double now = lh_time_now();
      if (until < 0)
        until = now + budget * 1e-9;
      else if (now > until)
        break;
    }
  }
  spin_adapt(budget, true);
  atomic_fetch_add(&b->sleepers, 1);
  while (atomic_load(&b->phase) == seen)
    phase_sleep(&b->phase, seen);
  atomic_fetch_sub(&b->sleepers, 1);
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

bool lh_path_same(const char *a, const char *b) {
  struct stat sa, sb;
  if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return strcmp(a, b) == 0;
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
