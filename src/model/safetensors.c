/* safetensors reader and writer (Hugging Face format: 8-byte little-endian header length, JSON
 * header, data section). Every header field is checked against limits and against the file
 * before anything is allocated from it; bad input returns an error naming the tensor, never
 * aborts. Files are read with read/pread, never mapped, so a file cut short while it is read is
 * an error ("truncated: ..."), never SIGBUS. Files are written to a temporary name, fsynced and
 * renamed (lh_file_out); images can also be built in and parsed from memory. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/model.h"
#include "longhaul/tensor.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* Tensor names in messages are clipped so one long name cannot hide the rest of the message. */
#define NAME_FMT "%.200s"

static const char *const dtype_names[LH_DTYPE__COUNT] = {"F32", "BF16", "F16", "I32", "I64", "U8"};
static const size_t dtype_sizes[LH_DTYPE__COUNT] = {4, 2, 2, 4, 8, 1};

/* safetensors dtypes that exist in the format but that longhaul does not read. */
static const char *const other_dtypes[] = {"F64", "F8_E4M3", "F8_E5M2", "I8",  "I16",
                                           "U16", "U32",     "U64",     "BOOL"};

static int dtype_from_name(const char *s) {
  for (int i = 0; i < LH_DTYPE__COUNT; i++)
    if (strcmp(s, dtype_names[i]) == 0) return i;
  return -1;
}

static int is_other_dtype(const char *s) {
  for (size_t i = 0; i < sizeof other_dtypes / sizeof other_dtypes[0]; i++)
    if (strcmp(s, other_dtypes[i]) == 0) return 1;
  return 0;
}

/* Formats a shape as "[a, b, c]" into buf (always NUL-terminated). */
static void shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
  size_t p = 0;
  p += (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && p < cap; i++)
    p += (size_t)snprintf(buf + p, cap - p, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (p < cap) snprintf(buf + p, cap - p, "]");
}

/* numel * elem_size, or 0 with *ok = 0 on overflow. */
static size_t checked_nbytes(const int64_t *shape, int ndim, size_t elem, int *ok) {
  size_t n = elem;
  *ok = 1;
  for (int i = 0; i < ndim; i++) {
    uint64_t d = (uint64_t)shape[i];
    if (d != 0 && n > SIZE_MAX / d) {
      *ok = 0;
      return 0;
    }
    n *= (size_t)d;
  }
  return n;
}

/* Raw offsets kept while parsing, for the overlap check. */
typedef struct {
  uint64_t begin, end;
  int idx;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return x->idx - y->idx;
}

/* The tensors array is followed, in the same allocation, by n ints: indices of the tensors in
 * name order, so that find() is a binary search. */
static int *name_index(const lh_safetensors *st) {
  return (int *)(void *)(st->tensors + st->n);
}

static _Thread_local const lh_st_tensor *sort_base; /* qsort has no context argument */
static int name_idx_cmp(const void *a, const void *b) {
  return strcmp(sort_base[*(const int *)a].name, sort_base[*(const int *)b].name);
}

static void free_parsed(lh_safetensors *st) {
  if (!st) return;
  if (st->tensors)
    for (int i = 0; i < st->n; i++)
      free(st->tensors[i].name);
  free(st->tensors);
  free(st->metadata_json);
  if (st->meta_kv)
    for (int i = 0; i < 2 * st->n_meta; i++)
      free(st->meta_kv[i]);
  free(st->meta_kv);
  free(st->owned);
  if (st->fd >= 0) close(st->fd);
  free(st->path);
  free(st);
}

/* Reads a non-negative JSON integer into *out; returns 0 when it is not one. */
static int get_nonneg_int(const json_t *v, int64_t *out) {
  if (!json_is_integer(v)) return 0;
  json_int_t x = json_integer_value(v);
  if (x < 0) return 0;
  *out = (int64_t)x;
  return 1;
}

/* Checks one tensor entry of the header and fills t (except name and data). */
static lh_err parse_entry(const char *what, const char *name, const json_t *v, lh_st_tensor *t,
                          uint64_t *begin, uint64_t *end) {
  if (!json_is_object(v))
    return lh_errorf(LH_ERR_FORMAT, "%s: tensor " NAME_FMT ": expected an object, found %s", what,
                     name, lh_json_type_name(v));
  const json_t *jd = json_object_get(v, "dtype");
  const json_t *js = json_object_get(v, "shape");
  const json_t *jo = json_object_get(v, "data_offsets");
  if (!jd || !js || !jo)
    return lh_errorf(LH_ERR_FORMAT, "%s: tensor " NAME_FMT ": missing field %s", what, name,
                     !jd   ? "dtype"
                     : !js ? "shape"
                           : "data_offsets");
  if (!json_is_string(jd))
    return lh_errorf(LH_ERR_FORMAT, "%s: tensor " NAME_FMT ": dtype: expected a string, found %s",
                     what, name, lh_json_type_name(jd));
  const char *ds = json_string_value(jd);
  int dt = dtype_from_name(ds);
  if (dt < 0) {
    if (is_other_dtype(ds))
      return lh_errorf(LH_ERR_UNSUPPORTED,
                       "%s: tensor " NAME_FMT ": dtype %s is not supported (F32, BF16, F16, I32, "
                       "I64, U8 are)",
                       what, name, ds);
    return lh_errorf(LH_ERR_FORMAT, "%s: tensor " NAME_FMT ": unknown dtype \"%.40s\"", what, name,
                     ds);
  }
  t->dtype = (lh_dtype)dt;

  if (!json_is_array(js))
    return lh_errorf(LH_ERR_FORMAT, "%s: tensor " NAME_FMT ": shape: expected an array, found %s",
                     what, name, lh_json_type_name(js));
  size_t nd = json_array_size(js);
  if (nd > LH_ST_MAX_DIMS)
    return lh_errorf(LH_ERR_LIMIT,
                     "%s: tensor " NAME_FMT ": %zu dimensions, more than the limit "
                     "of %d",
                     what, name, nd, LH_ST_MAX_DIMS);
  t->ndim = (int)nd;
  for (size_t i = 0; i < nd; i++) {
    const json_t *e = json_array_get(js, i);
    if (!get_nonneg_int(e, &t->shape[i])) {
      if (json_is_integer(e))
        return lh_errorf(LH_ERR_FORMAT, "%s: tensor " NAME_FMT ": shape[%zu] is %lld, negative",
                         what, name, i, (long long)json_integer_value(e));
      return lh_errorf(LH_ERR_FORMAT,
                       "%s: tensor " NAME_FMT ": shape[%zu]: expected an integer, found %s", what,
                       name, i, lh_json_type_name(e));
    }
  }

  int64_t b = 0, e = 0;
  if (!json_is_array(jo) || json_array_size(jo) != 2 ||
      !get_nonneg_int(json_array_get(jo, 0), &b) || !get_nonneg_int(json_array_get(jo, 1), &e))
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: tensor " NAME_FMT ": data_offsets: expected two non-negative integers "
                     "[begin, end]",
                     what, name);
  char sh[256];
  shape_str(sh, sizeof sh, t->shape, t->ndim);
  if (b > e)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: tensor " NAME_FMT ": data_offsets [%lld, %lld]: begin > end", what, name,
                     (long long)b, (long long)e);
  int ok;
  size_t need = checked_nbytes(t->shape, t->ndim, dtype_sizes[dt], &ok);
  if (!ok)
    return lh_errorf(LH_ERR_FORMAT, "%s: tensor " NAME_FMT ": dtype %s shape %s overflows the size",
                     what, name, ds, sh);
  if (need != (uint64_t)(e - b))
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: tensor " NAME_FMT ": data_offsets [%lld, %lld] but dtype %s shape %s "
                     "needs %zu bytes",
                     what, name, (long long)b, (long long)e, ds, sh, need);
  t->nbytes = need;
  *begin = (uint64_t)b;
  *end = (uint64_t)e;
  return LH_ERR_OK;
}

/* Checks the 8-byte header length at b8 against the limit and against `len`, the bytes of the
 * whole image or file; sets *hlen. */
static lh_err check_hlen(const char *what, const uint8_t *b8, uint64_t len, uint64_t *hlen) {
  if (len < 8)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: %llu bytes, too short for the 8-byte header length of a safetensors "
                     "file",
                     what, (unsigned long long)len);
  uint64_t h = 0;
  for (int i = 7; i >= 0; i--)
    h = (h << 8) | b8[i];
  if (h > LH_ST_MAX_HEADER)
    return lh_errorf(LH_ERR_LIMIT, "%s: header of %llu bytes, more than the limit of %u", what,
                     (unsigned long long)h, LH_ST_MAX_HEADER);
  if (h > len - 8)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: header length %llu but only %llu bytes follow it (truncated file?)", what,
                     (unsigned long long)h, (unsigned long long)(len - 8));
  if (h < 2)
    return lh_errorf(LH_ERR_FORMAT, "%s: header of %llu bytes cannot hold a JSON object", what,
                     (unsigned long long)h);
  *hlen = h;
  return LH_ERR_OK;
}

/* Parses the JSON header hdr[0..hlen) of an image whose data section holds data_len bytes:
 * the tensors (data NULL, offset set), the metadata, the name index; checks that no two tensors
 * overlap and that the data section holds every one. */
static lh_err parse_header(const char *what, const uint8_t *hdr, size_t hlen, uint64_t data_len,
                           lh_safetensors **out) {
  *out = NULL;
  /* a tensor's entry needs 12 brackets and separators with a 2-dimensional shape, 18 with 8 */
  lh_err err = lh_json_check_cost((const char *)hdr, hlen, 3 * (size_t)LH_ST_MAX_TENSORS + 2,
                                  24 * (size_t)LH_ST_MAX_TENSORS, what);
  if (err) return err;
  lh_safetensors *st = NULL;
  span *spans = NULL;
  json_error_t jerr;
  json_t *root = json_loadb((const char *)hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root && json_error_code(&jerr) == json_error_out_of_memory) goto nomem;
  if (!root) {
    err = lh_errorf(LH_ERR_FORMAT, "%s: header is not valid JSON: %s (byte %d of the header)", what,
                    jerr.text, jerr.position);
    goto out;
  }
  if (!json_is_object(root)) {
    err = lh_errorf(LH_ERR_FORMAT, "%s: header: expected a JSON object, found %s", what,
                    lh_json_type_name(root));
    goto out;
  }
  const json_t *meta = json_object_get(root, "__metadata__");
  size_t count = json_object_size(root) - (meta ? 1 : 0);
  if (count > LH_ST_MAX_TENSORS) {
    err = lh_errorf(LH_ERR_LIMIT, "%s: %zu tensors, more than the limit of %d", what, count,
                    LH_ST_MAX_TENSORS);
    goto out;
  }

  st = calloc(1, sizeof *st);
  if (!st) goto nomem;
  st->fd = -1;
  st->path = strdup(what);
  /* tensors, then the name index (n ints); at least one byte so that calloc succeeds. */
  st->tensors = calloc(1, count * (sizeof(lh_st_tensor) + sizeof(int)) + 1);
  spans = calloc(count + 1, sizeof *spans);
  if (!st->path || !st->tensors || !spans) goto nomem;

  if (meta) {
    if (!json_is_object(meta)) {
      err = lh_errorf(LH_ERR_FORMAT, "%s: __metadata__: expected an object, found %s", what,
                      lh_json_type_name(meta));
      goto out;
    }
    size_t nm = json_object_size(meta);
    st->meta_kv = calloc(2 * nm + 1, sizeof *st->meta_kv);
    if (!st->meta_kv) goto nomem;
    const char *k;
    const json_t *mv;
    json_object_foreach((json_t *)meta, k, mv) {
      if (!json_is_string(mv)) {
        err = lh_errorf(LH_ERR_FORMAT,
                        "%s: __metadata__: key " NAME_FMT ": expected a string, "
                        "found %s",
                        what, k, lh_json_type_name(mv));
        goto out;
      }
      int i = st->n_meta;
      st->meta_kv[2 * i] = strdup(k);
      st->meta_kv[2 * i + 1] = strdup(json_string_value(mv));
      st->n_meta = i + 1; /* freed on error from here on */
      if (!st->meta_kv[2 * i] || !st->meta_kv[2 * i + 1]) goto nomem;
    }
    st->metadata_json = json_dumps(meta, JSON_COMPACT);
    if (!st->metadata_json) goto nomem;
  }

  const char *key;
  const json_t *val;
  int n = 0;
  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) continue;
    lh_st_tensor *t = &st->tensors[n];
    if (key[0] == '\0') {
      err = lh_errorf(LH_ERR_FORMAT, "%s: tensor with an empty name", what);
      goto out;
    }
    err = parse_entry(what, key, val, t, &spans[n].begin, &spans[n].end);
    if (err) goto out;
    t->name = strdup(key);
    if (!t->name) goto nomem;
    t->offset = spans[n].begin;
    spans[n].idx = n;
    n++;
    st->n = n; /* names allocated so far are freed on error */
  }

  /* The data section must hold every tensor: the one that ends last says how much it needs. */
  int last = -1;
  for (int i = 0; i < n; i++)
    if (last < 0 || spans[i].end > spans[last].end) last = i;
  st->data_need = last >= 0 ? spans[last].end : 0;
  if (st->data_need > data_len) {
    err =
        lh_errorf(LH_ERR_FORMAT,
                  "%s: truncated: expected %llu bytes of tensor data, found %llu (tensor " NAME_FMT
                  ": data_offsets [%llu, %llu] outside the data section of %llu bytes)",
                  what, (unsigned long long)st->data_need, (unsigned long long)data_len,
                  st->tensors[last].name, (unsigned long long)spans[last].begin,
                  (unsigned long long)spans[last].end, (unsigned long long)data_len);
    goto out;
  }
  /* No two tensors may share bytes: sorted by begin, each must end before the next begins. */
  qsort(spans, (size_t)n, sizeof *spans, span_cmp);
  for (int i = 1; i < n; i++) {
    if (spans[i].begin < spans[i - 1].end) {
      err = lh_errorf(LH_ERR_FORMAT,
                      "%s: tensor " NAME_FMT ": data_offsets [%llu, %llu] overlap tensor " NAME_FMT
                      " at [%llu, %llu]",
                      what, st->tensors[spans[i].idx].name, (unsigned long long)spans[i].begin,
                      (unsigned long long)spans[i].end, st->tensors[spans[i - 1].idx].name,
                      (unsigned long long)spans[i - 1].begin, (unsigned long long)spans[i - 1].end);
      goto out;
    }
  }

  int *idx = name_index(st);
  for (int i = 0; i < n; i++)
    idx[i] = i;
  sort_base = st->tensors;
  qsort(idx, (size_t)n, sizeof *idx, name_idx_cmp);
  sort_base = NULL;
  goto out;

nomem:
  err = lh_errorf(LH_ERR_NOMEM, "%s: out of memory while parsing the header", what);
out:
  free(spans);
  json_decref(root);
  if (err) {
    free_parsed(st);
    return err;
  }
  *out = st;
  return LH_ERR_OK;
}

/* Points every tensor's data into the data section at data. */
static void point_data(lh_safetensors *st, const uint8_t *data) {
  for (int i = 0; i < st->n; i++)
    st->tensors[i].data = data + st->tensors[i].offset;
}

lh_err lh_safetensors_parse(const uint8_t *buf, size_t len, const char *what,
                            lh_safetensors **out) {
  if (!what) what = "safetensors";
  if (!out || (!buf && len)) return lh_errorf(LH_ERR_INVAL, "%s: no buffer or output", what);
  *out = NULL;
  uint64_t hlen = 0;
  lh_err err = check_hlen(what, buf, len, &hlen);
  if (err) return err;
  lh_safetensors *st = NULL;
  if ((err = parse_header(what, buf + 8, (size_t)hlen, len - 8 - (size_t)hlen, &st))) return err;
  st->data_start = 8 + hlen;
  point_data(st, buf + 8 + hlen);
  *out = st;
  return LH_ERR_OK;
}

lh_err lh_safetensors_open_buffer(const void *buf, size_t len, const char *what,
                                  lh_safetensors **out) {
  if (!what) what = "safetensors buffer";
  if (!out || (!buf && len)) return lh_errorf(LH_ERR_INVAL, "%s: no buffer or output", what);
  *out = NULL;
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %zu bytes", what, len);
  if (len) memcpy(copy, buf, len);
  lh_err err = lh_safetensors_parse(copy, len, what, out);
  if (err) {
    free(copy);
    return err;
  }
  (*out)->owned = copy;
  return LH_ERR_OK;
}

/* Reads up to n bytes at offset off; returns the count (short only at the end of the file), or
 * -1 with errno set. */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    size_t want = n - got < ((size_t)1 << 30) ? n - got : ((size_t)1 << 30);
    ssize_t r = pread(fd, (uint8_t *)buf + got, want, (off_t)(off + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* Opens and parses a file's header; with !lazy also reads the data section into memory. */
static lh_err open_file(const char *path, int lazy, lh_safetensors **out) {
  if (!path || !out) return lh_errorf(LH_ERR_INVAL, "lh_safetensors_open: NULL argument");
  *out = NULL;
  int fd = -1;
  lh_err err = lh_file_open_read(path, &fd);
  if (err) return err;
  struct stat sb;
  uint8_t *hdr = NULL, *data = NULL;
  lh_safetensors *st = NULL;
  if (fstat(fd, &sb) != 0) {
    err = lh_errorf(LH_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    goto out;
  }
  if (sb.st_size == 0) {
    err = lh_errorf(LH_ERR_FORMAT, "%s: empty file, not a safetensors file", path);
    goto out;
  }
  uint64_t size = (uint64_t)sb.st_size, hlen = 0;
  uint8_t b8[8] = {0};
  ssize_t got = pread_full(fd, b8, 8, 0);
  if (got < 0) {
    err = lh_errorf(LH_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    goto out;
  }
  if (got < 8) size = (uint64_t)got; /* shorter than 8 bytes, or cut short since the fstat */
  if ((err = check_hlen(path, b8, size, &hlen))) goto out;
  if (!(hdr = malloc((size_t)hlen))) {
    err = lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %llu bytes for the header", path,
                    (unsigned long long)hlen);
    goto out;
  }
  if ((got = pread_full(fd, hdr, (size_t)hlen, 8)) < 0) {
    err = lh_errorf(LH_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    goto out;
  }
  if ((uint64_t)got < hlen) {
    err =
        lh_errorf(LH_ERR_FORMAT, "%s: truncated: header length %llu but only %llu bytes follow it",
                  path, (unsigned long long)hlen, (unsigned long long)got);
    goto out;
  }
  if ((err = parse_header(path, hdr, (size_t)hlen, size - 8 - hlen, &st))) goto out;
  st->data_start = 8 + hlen;
  if (lazy) {
    st->fd = fd;
    fd = -1;
  } else {
    size_t need = (size_t)st->data_need;
    if (!(data = malloc(need ? need : 1))) { /* a byte at least: zero-size tensors point there */
      err = lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %zu bytes of tensor data", path, need);
      goto out;
    }
    if (need > 0) {
      if ((got = pread_full(fd, data, need, st->data_start)) < 0) {
        err = lh_errorf(LH_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        goto out;
      }
      if ((size_t)got < need) {
        err =
            lh_errorf(LH_ERR_FORMAT, "%s: truncated: expected %zu bytes of tensor data, found %zu",
                      path, need, (size_t)got);
        goto out;
      }
    }
    point_data(st, data);
    st->owned = data;
    data = NULL;
  }
  *out = st;
  st = NULL;
out:
  free_parsed(st);
  free(hdr);
  free(data);
  if (fd >= 0) close(fd);
  return err;
}

lh_err lh_safetensors_open(const char *path, lh_safetensors **out) {
  return open_file(path, 0, out);
}

lh_err lh_safetensors_open_lazy(const char *path, lh_safetensors **out) {
  return open_file(path, 1, out);
}

const char *lh_safetensors_meta(const lh_safetensors *st, const char *key) {
  if (!st || !key) return NULL;
  for (int i = 0; i < st->n_meta; i++)
    if (strcmp(st->meta_kv[2 * i], key) == 0) return st->meta_kv[2 * i + 1];
  return NULL;
}

lh_err lh_safetensors_read(const lh_safetensors *st, const lh_st_tensor *t, size_t off, void *dst,
                           size_t n) {
  const char *what = st && st->path ? st->path : "safetensors";
  if (!st || !t || (!dst && n))
    return lh_errorf(LH_ERR_INVAL, "%s: lh_safetensors_read: NULL argument", what);
  if (off > t->nbytes || n > t->nbytes - off)
    return lh_errorf(LH_ERR_INVAL,
                     "%s: tensor " NAME_FMT ": bytes [%zu, %zu + %zu) asked, it has %zu", what,
                     t->name, off, off, n, t->nbytes);
  if (n == 0) return LH_ERR_OK;
  if (t->data) {
    memcpy(dst, t->data + off, n);
    return LH_ERR_OK;
  }
  if (st->fd < 0)
    return lh_errorf(LH_ERR_INVAL, "%s: tensor " NAME_FMT ": no data to read", what, t->name);
  uint64_t at = st->data_start + t->offset + off;
  ssize_t got = pread_full(st->fd, dst, n, at);
  if (got < 0)
    return lh_errorf(LH_ERR_IO, "%s: tensor " NAME_FMT ": cannot read: %s", what, t->name,
                     strerror(errno));
  if ((size_t)got < n)
    return lh_errorf(LH_ERR_FORMAT,
                     "%s: truncated: expected %llu bytes of tensor data, found %llu (while "
                     "reading tensor " NAME_FMT ")",
                     what, (unsigned long long)st->data_need,
                     (unsigned long long)(t->offset + off + (size_t)got), t->name);
  return LH_ERR_OK;
}

void lh_safetensors_close(lh_safetensors *st) {
  free_parsed(st);
}

const lh_st_tensor *lh_safetensors_find(const lh_safetensors *st, const char *name) {
  if (!st || !name) return NULL;
  const int *idx = name_index(st);
  int lo = 0, hi = st->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    const lh_st_tensor *t = &st->tensors[idx[mid]];
    int c = strcmp(name, t->name);
    if (c == 0) return t;
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return NULL;
}

/* IEEE half to float, exact for every input (subnormals, infinities, NaN payloads). */
static float f32_from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    /* subnormal: shift the mantissa up until its leading one becomes the implicit bit */
    uint32_t e = 113;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      e--;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* Converts n 16-bit values (BF16 or F16) at src, which may be unaligned, to fp32. */
static void f32_from_16(lh_dtype dt, float *dst, const uint8_t *src, size_t n) {
  if (dt == LH_DTYPE_BF16 && ((uintptr_t)src & 1u) == 0) {
    lh_f32_from_bf16_n(dst, (const uint16_t *)(const void *)src, n);
    return;
  }
  uint16_t tmp[1024];
  for (size_t i = 0; i < n; i += 1024) {
    size_t k = n - i < 1024 ? n - i : 1024;
    memcpy(tmp, src + 2 * i, 2 * k);
    if (dt == LH_DTYPE_BF16) {
      lh_f32_from_bf16_n(dst + i, tmp, k);
    } else {
      for (size_t j = 0; j < k; j++)
        dst[i + j] = f32_from_f16(tmp[j]);
    }
  }
}

lh_err lh_safetensors_read_f32_range(const lh_safetensors *st, const lh_st_tensor *t, size_t first,
                                     float *dst, size_t n) {
  const char *what = st && st->path ? st->path : "safetensors";
  if (!st || !t || (!dst && n)) return lh_errorf(LH_ERR_INVAL, "%s: read_f32: NULL argument", what);
  if (t->dtype != LH_DTYPE_F32 && t->dtype != LH_DTYPE_BF16 && t->dtype != LH_DTYPE_F16)
    return lh_errorf(LH_ERR_UNSUPPORTED,
                     "%s: tensor " NAME_FMT ": dtype %s cannot be read as float", what, t->name,
                     (unsigned)t->dtype < LH_DTYPE__COUNT ? dtype_names[t->dtype] : "?");
  size_t esize = dtype_sizes[t->dtype], numel = t->nbytes / esize;
  if (first > numel || n > numel - first)
    return lh_errorf(LH_ERR_MISMATCH,
                     "%s: tensor " NAME_FMT ": has %zu elements, caller asks for [%zu, %zu + %zu)",
                     what, t->name, numel, first, first, n);
  if (n == 0) return LH_ERR_OK;
  if (t->dtype == LH_DTYPE_F32) return lh_safetensors_read(st, t, 4 * first, dst, 4 * n);
  if (t->data) {
    f32_from_16(t->dtype, dst, t->data + 2 * first, n);
    return LH_ERR_OK;
  }
  /* From the file: the 2n bytes go into the upper half of dst, then are widened front to back
   * in chunks. Chunk [i, i + k) is copied out before dst[i, i + k) is written, which reaches
   * byte 4(i + k) of dst, never past byte 2n + 2(i + k) where the next chunk's source starts
   * (i + k <= n): no extra buffer the size of the tensor. */
  uint8_t *raw = (uint8_t *)dst + 2 * n;
  lh_err e = lh_safetensors_read(st, t, 2 * first, raw, 2 * n);
  if (e) return e;
  uint16_t tmp[1024];
  for (size_t i = 0; i < n; i += 1024) { /* serial: chunks this small are not worth threads */
    size_t k = n - i < 1024 ? n - i : 1024;
    memcpy(tmp, raw + 2 * i, 2 * k);
    if (t->dtype == LH_DTYPE_BF16)
      for (size_t j = 0; j < k; j++)
        dst[i + j] = lh_f32_from_bf16(tmp[j]);
    else
      for (size_t j = 0; j < k; j++)
        dst[i + j] = f32_from_f16(tmp[j]);
  }
  return LH_ERR_OK;
}

lh_err lh_safetensors_read_f32(const lh_safetensors *st, const lh_st_tensor *t, float *dst,
                               size_t n) {
  const char *what = st && st->path ? st->path : "safetensors";
  if (!t || (!dst && n)) return lh_errorf(LH_ERR_INVAL, "%s: read_f32: NULL argument", what);
  int ok;
  size_t numel = checked_nbytes(t->shape, t->ndim, 1, &ok);
  if (!ok || numel != n)
    return lh_errorf(LH_ERR_MISMATCH,
                     "%s: tensor " NAME_FMT ": has %zu elements, caller expects %zu", what, t->name,
                     numel, n);
  return lh_safetensors_read_f32_range(st, t, 0, dst, n);
}

/* Builds the JSON header for entries (checked) and metadata pairs (NULL: {"format":"pt"}),
 * padded with spaces to a multiple of 8 bytes. Returns a malloc'd string; *total receives the
 * data section size. */
static lh_err build_header(const char *path, const lh_st_entry *entries, int n,
                           const char *const *meta_kv, int n_meta, char **out, size_t *hlen,
                           size_t *total) {
  lh_err err = LH_ERR_OK;
  json_t *root = json_object();
  json_t *meta = json_pack("{s:s}", "format", "pt");
  char *text = NULL;
  if (!root || !meta || json_object_set_new(root, "__metadata__", meta)) {
    json_decref(meta);
    goto nomem;
  }
  for (int i = 0; i < n_meta; i++) {
    const char *k = meta_kv[2 * i], *v = meta_kv[2 * i + 1];
    if (!k || !v) {
      err = lh_errorf(LH_ERR_INVAL, "%s: metadata pair %d: NULL %s", path, i, k ? "value" : "key");
      goto out;
    }
    for (int j = 0; j < i; j++)
      if (strcmp(meta_kv[2 * j], k) == 0) {
        err = lh_errorf(LH_ERR_INVAL, "%s: metadata key \"" NAME_FMT "\" given twice", path, k);
        goto out;
      }
    json_t *jv = json_string(v), *jk = json_string(k); /* NULL when not UTF-8 */
    json_decref(jk);
    if (!jv || !jk) {
      json_decref(jv);
      err = lh_errorf(LH_ERR_INVAL, "%s: metadata key \"" NAME_FMT "\": key or value is not UTF-8",
                      path, k);
      goto out;
    }
    if (json_object_set_new(meta, k, jv)) goto nomem;
  }
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    const lh_st_entry *e = &entries[i];
    if (!e->name || !e->name[0] || strcmp(e->name, "__metadata__") == 0) {
      err = lh_errorf(LH_ERR_INVAL, "%s: entry %d: missing or reserved tensor name", path, i);
      goto out;
    }
    if ((unsigned)e->dtype >= LH_DTYPE__COUNT) {
      err = lh_errorf(LH_ERR_INVAL, "%s: tensor " NAME_FMT ": unknown dtype %d", path, e->name,
                      (int)e->dtype);
      goto out;
    }
    if (e->ndim < 0 || e->ndim > LH_ST_MAX_DIMS) {
      err = lh_errorf(LH_ERR_INVAL, "%s: tensor " NAME_FMT ": %d dimensions (limit %d)", path,
                      e->name, e->ndim, LH_ST_MAX_DIMS);
      goto out;
    }
    for (int d = 0; d < e->ndim; d++)
      if (e->shape[d] < 0) {
        err = lh_errorf(LH_ERR_INVAL, "%s: tensor " NAME_FMT ": shape[%d] is negative", path,
                        e->name, d);
        goto out;
      }
    if (json_object_get(root, e->name)) {
      err = lh_errorf(LH_ERR_INVAL, "%s: tensor " NAME_FMT ": name given twice", path, e->name);
      goto out;
    }
    int ok;
    size_t nb = checked_nbytes(e->shape, e->ndim, dtype_sizes[e->dtype], &ok);
    if (!ok || off + nb < off) {
      err = lh_errorf(LH_ERR_INVAL, "%s: tensor " NAME_FMT ": size overflows", path, e->name);
      goto out;
    }
    if (nb && !e->data) {
      err = lh_errorf(LH_ERR_INVAL, "%s: tensor " NAME_FMT ": no data", path, e->name);
      goto out;
    }
    json_t *shape = json_array();
    json_t *t = json_object();
    if (!shape || !t) {
      json_decref(shape);
      json_decref(t);
      goto nomem;
    }
    int bad = json_object_set_new(t, "dtype", json_string(dtype_names[e->dtype]));
    for (int d = 0; d < e->ndim; d++)
      bad |= json_array_append_new(shape, json_integer((json_int_t)e->shape[d]));
    bad |= json_object_set_new(t, "shape", shape);
    bad |= json_object_set_new(t, "data_offsets",
                               json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + nb)));
    bad |= json_object_set_new(root, e->name, t);
    if (bad) goto nomem;
    off += nb;
  }
  text = json_dumps(root, JSON_COMPACT);
  if (!text) goto nomem;
  size_t len = strlen(text);
  size_t padded = (len + 7) & ~(size_t)7;
  if (padded > LH_ST_MAX_HEADER) { /* the reader would refuse the file */
    err = lh_errorf(LH_ERR_LIMIT, "%s: header of %zu bytes, more than the limit of %u", path,
                    padded, LH_ST_MAX_HEADER);
    goto out;
  }
  char *p = realloc(text, padded + 1);
  if (!p) goto nomem;
  text = p;
  memset(text + len, ' ', padded - len);
  text[padded] = '\0';
  *out = text;
  text = NULL;
  *hlen = padded;
  *total = off;
  goto out;
nomem:
  err = lh_errorf(LH_ERR_NOMEM, "%s: out of memory while building the header", path);
out:
  free(text);
  json_decref(root);
  return err;
}

/* The 8-byte little-endian header length. */
static void put_len(uint8_t b[8], size_t hlen) {
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
}

static size_t entry_nbytes(const lh_st_entry *e) {
  int ok;
  return checked_nbytes(e->shape, e->ndim, dtype_sizes[e->dtype], &ok); /* checked in the header */
}

static lh_err check_write_args(const char *what, const lh_st_entry *entries, int n,
                               const char *const *meta_kv, int n_meta) {
  if (n < 0 || (n > 0 && !entries) || n_meta < 0 || (n_meta > 0 && !meta_kv))
    return lh_errorf(LH_ERR_INVAL, "%s: bad arguments", what);
  if (n > LH_ST_MAX_TENSORS)
    return lh_errorf(LH_ERR_LIMIT, "%s: %d tensors, more than the limit of %d", what, n,
                     LH_ST_MAX_TENSORS);
  return LH_ERR_OK;
}

lh_err lh_safetensors_write_meta(const char *path, const lh_st_entry *entries, int n,
                                 const char *const *meta_kv, int n_meta) {
  if (!path) return lh_errorf(LH_ERR_INVAL, "lh_safetensors_write: NULL path");
  lh_err err = check_write_args(path, entries, n, meta_kv, n_meta);
  if (err) return err;
  char *header = NULL;
  size_t hlen = 0, total = 0;
  if ((err = build_header(path, entries, n, meta_kv, n_meta, &header, &hlen, &total))) return err;
  /* Streamed rather than assembled in memory (a model can be gigabytes), as
   * lh_file_write_atomic writes: temporary file, fsync, rename (or in place, see base.h). */
  lh_file_out *o = NULL;
  uint8_t lenbuf[8];
  put_len(lenbuf, hlen);
  if (!(err = lh_file_out_open(path, &o))) {
    err = lh_file_out_write(o, lenbuf, 8);
    if (!err) err = lh_file_out_write(o, header, hlen);
    for (int i = 0; i < n && !err; i++) {
      size_t nb = entry_nbytes(&entries[i]);
      if (nb) err = lh_file_out_write(o, entries[i].data, nb);
    }
    if (!err) err = lh_file_out_commit(o);
  }
  lh_file_out_free(o);
  free(header);
  return err;
}

lh_err lh_safetensors_write(const char *path, const lh_st_entry *entries, int n) {
  return lh_safetensors_write_meta(path, entries, n, NULL, 0);
}

lh_err lh_safetensors_write_buffer(const lh_st_entry *entries, int n, const char *const *meta_kv,
                                   int n_meta, char **out, size_t *len) {
  const char *what = "safetensors buffer";
  if (!out || !len) return lh_errorf(LH_ERR_INVAL, "%s: NULL output", what);
  *out = NULL;
  *len = 0;
  lh_err err = check_write_args(what, entries, n, meta_kv, n_meta);
  if (err) return err;
  char *header = NULL;
  size_t hlen = 0, total = 0;
  if ((err = build_header(what, entries, n, meta_kv, n_meta, &header, &hlen, &total))) return err;
  size_t size = 8 + hlen + total;
  char *buf = size >= total ? malloc(size) : NULL;
  if (!buf) {
    free(header);
    return lh_errorf(LH_ERR_NOMEM, "%s: cannot allocate %zu bytes", what, size);
  }
  put_len((uint8_t *)buf, hlen);
  memcpy(buf + 8, header, hlen);
  size_t at = 8 + hlen;
  for (int i = 0; i < n; i++) {
    size_t nb = entry_nbytes(&entries[i]);
    if (nb) memcpy(buf + at, entries[i].data, nb);
    at += nb;
  }
  free(header);
  *out = buf;
  *len = size;
  return LH_ERR_OK;
}
