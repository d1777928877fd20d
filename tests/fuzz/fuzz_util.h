/* Helpers shared by the fuzz targets: an invariant check that aborts (so libFuzzer reports the
 * input) and a per-process scratch file on tmpfs for round-trip checks. */
#ifndef LONGHAUL_FUZZ_UTIL_H
#define LONGHAUL_FUZZ_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s: invariant failed: %s (line %d)\n", __FILE__, #cond, __LINE__);          \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

/* /dev/shm/lh_fuzz_<tag>_<pid><suffix>, or NULL (the check is skipped) without /dev/shm. */
static inline const char *fuzz_scratch_path(const char *tag, const char *suffix) {
  static char path[96];
  static int init;
  if (!init) {
    struct stat sb;
    init = 1;
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode))
      snprintf(path, sizeof path, "/dev/shm/lh_fuzz_%s_%d%s", tag, (int)getpid(), suffix);
  }
  return path[0] ? path : NULL;
}

#endif
