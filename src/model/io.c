/* Model directories in the Hugging Face layout: config.json (with generation_config.json's eos
 * list when present) plus model.safetensors, or shards with model.safetensors.index.json, whose
 * weight_map names the one shard each tensor is read from.
 * Loading checks every expected tensor's presence, dtype and shape against the config before the
 * parameter slab is allocated, then reads each tensor from its file into the slab (no copy of
 * the file is held) and checks every weight is finite; saving writes both files atomically. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/model.h"
#include "longhaul/tensor.h"

/* Defined in config.c: config.json with torch_dtype naming the weights' dtype. */
lh_err lh__config_save_dtype(const char *path, const lh_config *c, const char *torch_dtype);

#define MAX_INDEX_BYTES (64u << 20)
/* objects and arrays, and brackets and separators in all, in an index: parsing one costs at
 * most ~200 MB whatever it holds (lh_json_check_cost); 2M tensors fit */
#define MAX_INDEX_OPEN   (1u << 10)
#define MAX_INDEX_TOKENS (1u << 22)
#define MAX_GEN_BYTES    (1u << 20)
#define MAX_SHARDS       4096

static char *join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  size_t k = a;
  if (a == 0 || dir[a - 1] != '/') p[k++] = '/';
  memcpy(p + k, name, b + 1);
  return p;
}

static void shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
  size_t p = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && p < cap; i++)
    p += (size_t)snprintf(buf + p, cap - p, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (p < cap) snprintf(buf + p, cap - p, "]");
}

static int file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* The weight files of a model: one, or the shards of an index. */
typedef struct {
  int n;
  lh_safetensors **st;
  lh_st_index *index; /* NULL for a single file; else st[i] is index->files[i] */
  char *label;        /* names the source in "missing tensor" messages */
} weights;

static void weights_close(weights *w) {
  for (int i = 0; i < w->n; i++)
    lh_safetensors_close(w->st[i]);
  free(w->st);
  free(w->index);
  free(w->label);
  memset(w, 0, sizeof *w);
}

static lh_err open_single(const char *path, weights *w) {
  w->st = calloc(1, sizeof *w->st);
  w->label = strdup(path);
  if (!w->st || !w->label) return lh_errorf(LH_ERR_NOMEM, "%s: out of memory", path);
  lh_err e = lh_safetensors_open_lazy(path, &w->st[0]);
  if (!e) w->n = 1;
  return e;
}

/* One weight_map entry while the index is parsed: strings point into the JSON tree. */
typedef struct {
  const char *name, *file;
  int fid; /* index of `file` among the distinct shard names, in first-seen order */
} index_ent;

static int cmp_ent_name(const void *a, const void *b) {
  return strcmp(((const index_ent *)a)->name, ((const index_ent *)b)->name);
}

/* Copies the parsed index into one block: the struct, files, names, file ids, then strings.
 * `ent` is sorted by name; `bytes` counts every string with its terminator. */
static lh_err index_block(const char *what, const char *const *files, int nf, const index_ent *ent,
                          int n, size_t bytes, lh_st_index **out) {
  size_t head =
      sizeof(lh_st_index) + ((size_t)nf + (size_t)n) * sizeof(char *) + (size_t)n * sizeof(int);
  lh_st_index *ix = malloc(head + bytes);
  if (!ix) return lh_errorf(LH_ERR_NOMEM, "%s: out of memory", what);
  ix->n_files = nf;
  ix->files = (char **)(ix + 1);
  ix->n = n;
  ix->names = ix->files + nf;
  ix->file = (int *)(ix->names + n);
  char *str = (char *)(ix->file + n);
  for (int i = 0; i < nf; i++) {
    size_t l = strlen(files[i]) + 1;
    ix->files[i] = memcpy(str, files[i], l);
    str += l;
  }
  for (int i = 0; i < n; i++) {
    size_t l = strlen(ent[i].name) + 1;
    ix->names[i] = memcpy(str, ent[i].name, l);
    ix->file[i] = ent[i].fid;
    str += l;
  }
  *out = ix;
  return LH_ERR_OK;
}

static int cmp_ent_file(const void *a, const void *b) {
  const index_ent *x = *(const index_ent *const *)a, *y = *(const index_ent *const *)b;
  int c = strcmp(x->file, y->file);
  return c ? c : (x > y) - (x < y); /* ties in weight_map order */
}

/* Numbers the distinct shard names of ent[0..n) (in weight_map order) in first-seen order,
 * setting each ent's fid and files[fid]. Sorting by name groups equal names, so this costs
 * O(n log n) however many shards there are. On success *files is malloc'd; *bytes grows by
 * each distinct name with its terminator. */
static lh_err number_files(const char *what, index_ent *ent, int n, const char ***files, int *nf,
                           size_t *bytes) {
  *files = NULL;
  *nf = 0;
  index_ent **by = malloc((n ? (size_t)n : 1) * sizeof *by);
  if (!by) return lh_errorf(LH_ERR_NOMEM, "%s: out of memory", what);
  for (int i = 0; i < n; i++)
    by[i] = &ent[i];
  qsort(by, (size_t)n, sizeof *by, cmp_ent_file);
  /* the head of each run of one name is where weight_map first names it */
  int runs = 0;
  for (int i = 0; i < n; i++) {
    int head = i == 0 || strcmp(by[i]->file, by[i - 1]->file) != 0;
    by[i]->fid = head ? -1 : -2;
    runs += head;
  }
  lh_err e = LH_ERR_OK;
  const char **f = NULL;
  if (runs > MAX_SHARDS) {
    e = lh_errorf(LH_ERR_LIMIT, "%s: more than %d shards", what, MAX_SHARDS);
    goto out;
  }
  if (!(f = malloc((runs ? (size_t)runs : 1) * sizeof *f))) {
    e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", what);
    goto out;
  }
  int k = 0;
  for (int i = 0; i < n; i++)
    if (ent[i].fid == -1) {
      ent[i].fid = k;
      f[k++] = ent[i].file;
      *bytes += strlen(ent[i].file) + 1;
    }
  for (int i = 1; i < n; i++)
    if (by[i]->fid == -2) by[i]->fid = by[i - 1]->fid;
  *files = f;
  *nf = runs;
out:
  free(by);
  return e;
}

lh_err lh_safetensors_index_parse(const char *json, size_t len, const char *what,
                                  lh_st_index **out) {
  *out = NULL;
  /* weight_map holds two brackets and separators per tensor; the rest is a few objects */
  lh_err cost = lh_json_check_cost(json, len, MAX_INDEX_OPEN, MAX_INDEX_TOKENS, what);
  if (cost) return cost;
  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root && json_error_code(&jerr) == json_error_out_of_memory)
    return lh_errorf(LH_ERR_NOMEM, "%s: out of memory while parsing", what);
  if (!root)
    return lh_errorf(LH_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", what, jerr.text,
                     jerr.line, jerr.column);
  lh_err e = LH_ERR_OK;
  const json_t *map = json_object_get(root, "weight_map");
  const char *key;
  const json_t *val;
  const char **files = NULL;
  index_ent *ent = NULL;
  int nf = 0, n = 0;
  size_t bytes = 0;
  if (!json_is_object(map)) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: field weight_map: expected an object, found %s", what,
                  lh_json_type_name(map));
    goto out;
  }
  /* the JSON text holds every entry, so their number is bounded by len */
  size_t n_map = json_object_size(map);
  if (n_map > INT_MAX) {
    e = lh_errorf(LH_ERR_LIMIT, "%s: weight_map: more than %d entries", what, INT_MAX);
    goto out;
  }
  ent = malloc((n_map ? n_map : 1) * sizeof *ent);
  if (!ent) {
    e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", what);
    goto out;
  }
  json_object_foreach((json_t *)map, key, val) {
    if (!json_is_string(val)) {
      e = lh_errorf(LH_ERR_FORMAT, "%s: weight_map: tensor %.200s: expected a file name, found %s",
                    what, key, lh_json_type_name(val));
      goto out;
    }
    const char *f = json_string_value(val);
    if (!f[0] || strchr(f, '/') || strcmp(f, ".") == 0 || strcmp(f, "..") == 0) {
      e = lh_errorf(LH_ERR_FORMAT,
                    "%s: weight_map: tensor %.200s: shard \"%.200s\" is not a file name in the "
                    "model directory",
                    what, key, f);
      goto out;
    }
    ent[n++] = (index_ent){key, f, -1};
    bytes += strlen(key) + 1;
  }
  if ((e = number_files(what, ent, n, &files, &nf, &bytes))) goto out;
  if (nf == 0) {
    e = lh_errorf(LH_ERR_FORMAT, "%s: weight_map names no shard", what);
    goto out;
  }
  qsort(ent, (size_t)n, sizeof *ent, cmp_ent_name);
  e = index_block(what, files, nf, ent, n, bytes, out);
out:
  free(files);
  free(ent);
  json_decref(root);
  return e;
}

int lh_safetensors_index_find(const lh_st_index *ix, const char *name) {
  if (!ix || !name) return -1;
  int lo = 0, hi = ix->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(name, ix->names[mid]);
    if (c == 0) return ix->file[mid];
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return -1;
}

/* Opens every distinct shard named in the index's weight_map. */
static lh_err open_sharded(const char *dir, const char *index_path, weights *w) {
  char *buf = NULL;
  size_t len = 0;
  lh_err e = lh_file_read(index_path, MAX_INDEX_BYTES, &buf, &len);
  if (e) return e;
  e = lh_safetensors_index_parse(buf, len, index_path, &w->index);
  free(buf);
  if (e) return e;
  int nf = w->index->n_files;
  w->label = strdup(index_path);
  w->st = calloc((size_t)nf, sizeof *w->st);
  if (!w->label || !w->st) e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", index_path);
  for (int i = 0; i < nf && !e; i++) {
    char *p = join(dir, w->index->files[i]);
    if (!p) {
      e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", index_path);
      break;
    }
    e = lh_safetensors_open_lazy(p, &w->st[i]);
    free(p);
    if (!e) w->n = i + 1;
  }
  return e;
}

/* Finds tensor `name` where the weights say it is: the single file, or the shard that the
 * index's weight_map names for it (a copy in another shard is never read). An absent tensor
 * is an error naming the file or index; `want`, config.json's shape, goes into the message. */
static lh_err find_tensor(const weights *w, const char *name, const char *want,
                          const lh_st_tensor **t, const lh_safetensors **owner) {
  int s = 0;
  if (w->index && (s = lh_safetensors_index_find(w->index, name)) < 0)
    return lh_errorf(LH_ERR_NOTFOUND,
                     "%s: tensor %s is not listed in weight_map (config.json expects shape %s)",
                     w->label, name, want);
  *owner = w->st[s];
  if ((*t = lh_safetensors_find(w->st[s], name))) return LH_ERR_OK;
  if (w->index)
    return lh_errorf(LH_ERR_NOTFOUND,
                     "%s: tensor %s: weight_map names shard %s, which does not hold it "
                     "(config.json expects shape %s)",
                     w->label, name, w->index->files[s], want);
  return lh_errorf(LH_ERR_NOTFOUND, "%s: tensor %s is missing (config.json expects shape %s)",
                   w->label, name, want);
}

static int cmp_str_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Logs tensors in the files that the model does not use (other than a tied lm_head), which
 * usually means config.json and the weights disagree; and, for an index, tensors in a shard
 * that weight_map does not name for them, which are never read (Hugging Face ignores them too). */
static void warn_unused(const char *dir, const weights *w, const lh_tensor_info *info, int n,
                        bool tied) {
  const char **names = malloc((size_t)n * sizeof *names);
  if (!names) return;
  for (int i = 0; i < n; i++)
    names[i] = info[i].name;
  qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
  long unused = 0, elsewhere = 0;
  const char *first = NULL, *first_elsewhere = NULL;
  int first_shard = 0;
  for (int s = 0; s < w->n; s++)
    for (int i = 0; i < w->st[s]->n; i++) {
      const char *nm = w->st[s]->tensors[i].name;
      if (w->index && lh_safetensors_index_find(w->index, nm) != s) {
        if (!first_elsewhere) first_elsewhere = nm, first_shard = s;
        elsewhere++;
        continue;
      }
      if (tied && strcmp(nm, "lm_head.weight") == 0) continue;
      if (bsearch(&nm, names, (size_t)n, sizeof *names, cmp_str_ptr)) continue;
      if (!first) first = nm;
      unused++;
    }
  if (unused)
    lh_log(LH_LOG_WARN, "%s: %ld tensors in the weights are not used by the model (first: %.200s)",
           dir, unused, first);
  if (elsewhere)
    lh_log(LH_LOG_WARN,
           "%s: %ld tensors are ignored: their shard is not the one weight_map names for them "
           "(first: %.200s in %s)",
           w->label, elsewhere, first_elsewhere, w->index->files[first_shard]);
  free(names);
}

/* The index of the first value of x[0..n) that is NaN or infinite, or n. Tests the exponent bits
 * (all ones), in blocks whose test vectorises: a full pass costs about a memory read. */
static size_t first_nonfinite_f32(const float *x, size_t n) {
  for (size_t i = 0; i < n; i += 4096) {
    size_t k = n - i < 4096 ? n - i : 4096;
    uint32_t bad = 0;
    for (size_t j = 0; j < k; j++) {
      uint32_t b;
      memcpy(&b, &x[i + j], 4);
      bad |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
    }
    if (bad)
      for (size_t j = 0; j < k; j++)
        if (!isfinite(x[i + j])) return i + j;
  }
  return n;
}

static size_t first_nonfinite_bf16(const uint16_t *x, size_t n) {
  for (size_t i = 0; i < n; i += 4096) {
    size_t k = n - i < 4096 ? n - i : 4096;
    unsigned bad = 0;
    for (size_t j = 0; j < k; j++)
      bad |= (unsigned)((x[i + j] & 0x7f80u) == 0x7f80u);
    if (bad)
      for (size_t j = 0; j < k; j++)
        if ((x[i + j] & 0x7f80u) == 0x7f80u) return i + j;
  }
  return n;
}

static const char *nonfinite_name(float v) {
  return isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

/* "FILE: tensor NAME: element I is nan" for a weight that is not a finite number: a NaN or
 * infinite weight turns every output NaN (generation samples uniformly, training writes NaN). */
static lh_err nonfinite_error(const lh_safetensors *owner, const char *name, size_t i, float v) {
  return lh_errorf(LH_ERR_FORMAT, "%s: tensor %s: element %zu is %s", owner->path, name, i,
                   nonfinite_name(v));
}

/* Where each tensor of the model is read from. */
typedef struct {
  const lh_st_tensor *t;
  const lh_safetensors *st;
} source;

/* Loads DIR into a new slab of fp32 (an lh_model, *out) or, with bf16_slab, of bf16 values
 * (*bf16_slab, its config in *bf16_cfg): F32 tensors are rounded, BF16 ones copied. With neither
 * out nor bf16_slab, only checks DIR and sets *bf16_cfg (lh_model_check). */
static lh_err load_dir(const char *dir, lh_model **out, uint16_t **bf16_slab, lh_config *bf16_cfg) {
  lh_err e = LH_ERR_OK;
  uint16_t *slab16 = NULL;
  weights w = {0};
  lh_tensor_info *info = NULL;
  source *src = NULL;
  lh_model *m = NULL;
  char *cfg_path = join(dir, "config.json");
  char *st_path = join(dir, "model.safetensors");
  char *idx_path = join(dir, "model.safetensors.index.json");
  char *gen_path = join(dir, "generation_config.json");
  char *gen_text = NULL;
  if (!cfg_path || !st_path || !idx_path || !gen_path) {
    e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", dir);
    goto out;
  }
  lh_config cfg;
  if ((e = lh_config_load(cfg_path, &cfg))) goto out;
  if (file_exists(gen_path)) {
    size_t gen_len = 0;
    if ((e = lh_file_read(gen_path, MAX_GEN_BYTES, &gen_text, &gen_len))) goto out;
    if ((e = lh_config_parse_generation(gen_text, gen_len, gen_path, &cfg))) goto out;
  }
  if (file_exists(st_path) || !file_exists(idx_path))
    e = open_single(st_path, &w);
  else
    e = open_sharded(dir, idx_path, &w);
  if (e) goto out;

  int n = lh_model_tensors(&cfg, NULL, 0);
  info = calloc((size_t)n, sizeof *info);
  src = calloc((size_t)n, sizeof *src);
  if (!info || !src) {
    e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", dir);
    goto out;
  }
  lh_model_tensors(&cfg, info, n);

  /* Everything is checked before the slab is allocated, so a config that promises more than
   * the files hold is refused without reserving memory for it. lh_model_check stops here. */
  for (int i = 0; i < n; i++) {
    char want[96], have[256];
    shape_str(want, sizeof want, info[i].shape, info[i].ndim);
    if ((e = find_tensor(&w, info[i].name, want, &src[i].t, &src[i].st))) goto out;
    const lh_safetensors *owner = src[i].st;
    const lh_st_tensor *t = src[i].t;
    if (t->dtype != LH_DTYPE_F32 && t->dtype != LH_DTYPE_BF16 && t->dtype != LH_DTYPE_F16) {
      e = lh_errorf(LH_ERR_UNSUPPORTED, "%s: tensor %s: dtype is not F32, BF16 or F16", owner->path,
                    info[i].name);
      goto out;
    }
    int same = t->ndim == info[i].ndim;
    for (int d = 0; same && d < t->ndim; d++)
      same = t->shape[d] == info[i].shape[d];
    if (!same) {
      shape_str(have, sizeof have, t->shape, t->ndim);
      e = lh_errorf(LH_ERR_MISMATCH, "%s: tensor %s: shape %s, config.json says %s", owner->path,
                    info[i].name, have, want);
      goto out;
    }
  }

  if (!out && !bf16_slab) { /* lh_model_check */
    *bf16_cfg = cfg;
    goto out;
  }
  if (bf16_slab) {
    size_t n_params = lh_config_n_params(&cfg);
    char what[4200];
    snprintf(what, sizeof what, "%s: bf16 weights of %zu parameters", dir, n_params);
    if (!(slab16 = lh_try_malloc_huge(lh_size_mul(n_params, sizeof *slab16), what))) {
      e = LH_ERR_NOMEM;
      goto out;
    }
    /* F32 and F16 tensors are converted in parts through this buffer, so nothing the size of a
     * tensor is allocated (a 150k x 4k embedding would need 2.4 GB as fp32) */
    enum { PART = 1 << 16 };
    float *part_f32 = NULL;
    for (int i = 0; i < n; i++) {
      const lh_safetensors *owner = src[i].st;
      const lh_st_tensor *t = src[i].t;
      uint16_t *dst = slab16 + info[i].offset;
      size_t numel = info[i].numel;
      if (t->dtype == LH_DTYPE_BF16) { /* the bits as published: no round trip */
        if ((e = lh_safetensors_read(owner, t, 0, dst, numel * sizeof *dst))) goto out_bf16;
        size_t bad = first_nonfinite_bf16(dst, numel);
        if (bad < numel) {
          e = nonfinite_error(owner, info[i].name, bad, lh_f32_from_bf16(dst[bad]));
          goto out_bf16;
        }
        continue;
      }
      if (!part_f32 && !(part_f32 = malloc(PART * sizeof *part_f32))) {
        e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", dir);
        goto out_bf16;
      }
      for (size_t j = 0; j < numel; j += PART) {
        size_t k = numel - j < PART ? numel - j : PART;
        if ((e = lh_safetensors_read_f32_range(owner, t, j, part_f32, k))) goto out_bf16;
        size_t bad = first_nonfinite_f32(part_f32, k);
        if (bad < k) {
          e = nonfinite_error(owner, info[i].name, j + bad, part_f32[bad]);
          goto out_bf16;
        }
        lh_bf16_from_f32_n(dst + j, part_f32, k);
        if ((bad = first_nonfinite_bf16(dst + j, k)) < k) { /* finite, but past bf16's range */
          e = lh_errorf(LH_ERR_FORMAT,
                        "%s: tensor %s: element %zu is %g, which rounds to %s in bf16", owner->path,
                        info[i].name, j + bad, (double)part_f32[bad],
                        nonfinite_name(lh_f32_from_bf16(dst[j + bad])));
          goto out_bf16;
        }
      }
    }
  out_bf16:
    free(part_f32);
    if (e) goto out;
    warn_unused(dir, &w, info, n, cfg.tie_embeddings);
    *bf16_slab = slab16;
    *bf16_cfg = cfg;
    slab16 = NULL;
    goto out;
  }
  if ((e = lh_model_create(&cfg, &m))) goto out;
  for (int i = 0; i < n; i++) {
    const lh_safetensors *owner = src[i].st;
    const lh_st_tensor *t = src[i].t;
    float *dst = m->params + info[i].offset;
    if ((e = lh_safetensors_read_f32(owner, t, dst, info[i].numel))) goto out;
    size_t bad = first_nonfinite_f32(dst, info[i].numel);
    if (bad < info[i].numel) {
      e = nonfinite_error(owner, info[i].name, bad, dst[bad]);
      goto out;
    }
  }
  warn_unused(dir, &w, info, n, cfg.tie_embeddings);
  *out = m;
  m = NULL;
out:
  free(slab16);
  lh_model_free(m);
  free(src);
  free(info);
  weights_close(&w);
  free(cfg_path);
  free(st_path);
  free(idx_path);
  free(gen_path);
  free(gen_text);
  return e;
}

lh_err lh_model_load(const char *dir, lh_model **out) {
  if (!dir || !out) return lh_errorf(LH_ERR_INVAL, "lh_model_load: NULL argument");
  *out = NULL;
  return load_dir(dir, out, NULL, NULL);
}

lh_err lh_model_load_bf16(const char *dir, lh_config *cfg, uint16_t **slab) {
  if (!dir || !cfg || !slab) return lh_errorf(LH_ERR_INVAL, "lh_model_load_bf16: NULL argument");
  *slab = NULL;
  return load_dir(dir, NULL, slab, cfg);
}

lh_err lh_model_check(const char *dir, lh_config *cfg) {
  if (!dir || !cfg) return lh_errorf(LH_ERR_INVAL, "lh_model_check: NULL argument");
  return load_dir(dir, NULL, NULL, cfg);
}

lh_err lh_model_save(const lh_model *m, const char *dir, lh_save_dtype dtype) {
  if (!m || !dir || !dir[0]) return lh_errorf(LH_ERR_INVAL, "lh_model_save: NULL argument");
  if (dtype != LH_SAVE_F32 && dtype != LH_SAVE_BF16)
    return lh_errorf(LH_ERR_INVAL, "%s: unknown save dtype %d", dir, (int)dtype);
  lh_err e = lh_config_validate(&m->cfg);
  if (e) return e;
  if ((e = lh_mkdir_p(dir))) return e;
  lh_tensor_info *info = NULL;
  lh_st_entry *ent = NULL;
  uint16_t *bf = NULL;
  char *cfg_path = join(dir, "config.json");
  char *st_path = join(dir, "model.safetensors");
  int n = lh_model_tensors(&m->cfg, NULL, 0);
  info = calloc((size_t)n, sizeof *info);
  ent = calloc((size_t)n, sizeof *ent);
  if (dtype == LH_SAVE_BF16) bf = malloc(m->n_params * sizeof *bf);
  if (!cfg_path || !st_path || !info || !ent || (dtype == LH_SAVE_BF16 && !bf)) {
    e = lh_errorf(LH_ERR_NOMEM, "%s: out of memory", dir);
    goto out;
  }
  lh_model_tensors(&m->cfg, info, n);
  if (bf) lh_bf16_from_f32_n(bf, m->params, m->n_params);
  for (int i = 0; i < n; i++) {
    ent[i].name = info[i].name;
    ent[i].dtype = bf ? LH_DTYPE_BF16 : LH_DTYPE_F32;
    ent[i].ndim = info[i].ndim;
    for (int d = 0; d < info[i].ndim; d++)
      ent[i].shape[d] = info[i].shape[d];
    ent[i].data =
        bf ? (const void *)(bf + info[i].offset) : (const void *)(m->params + info[i].offset);
  }
  /* each file is replaced atomically; weights first, so a fresh directory never holds a
   * config.json without its weights */
  if ((e = lh_safetensors_write(st_path, ent, n))) goto out;
  e = lh__config_save_dtype(cfg_path, &m->cfg, bf ? "bfloat16" : "float32");
out:
  free(bf);
  free(ent);
  free(info);
  free(cfg_path);
  free(st_path);
  return e;
}

/* Writes DIR/NAME atomically, or removes it when data is NULL. */
static lh_err put_or_remove(const char *dir, const char *name, const char *data, size_t len) {
  char *p = lh_path_join(dir, name);
  lh_err e = LH_ERR_OK;
  if (data)
    e = lh_file_write_atomic(p, data, len);
  else if (unlink(p) != 0 && errno != ENOENT)
    e = lh_errorf(LH_ERR_IO, "%s: cannot remove: %s", p, strerror(errno));
  free(p);
  return e;
}

lh_err lh_model_dir_save(const lh_model *m, const char *dir, lh_save_dtype dtype,
                         const lh_model_files *files) {
  static const lh_model_files none = {0};
  if (!files) files = &none;
  lh_err e;
  /* stale files first, so no moment of the write pairs new weights with an old eos list */
  if ((e = lh_mkdir_p(dir)) ||
      (e = put_or_remove(dir, "generation_config.json", files->generation_config,
                         files->generation_len)) ||
      (e = put_or_remove(dir, "model.safetensors.index.json", NULL, 0)) ||
      (e = lh_model_save(m, dir, dtype)))
    return e;
  return put_or_remove(dir, "tokenizer.json", files->tokenizer_json, files->tokenizer_len);
}

lh_err lh_model_dir_save_bf16(const lh_config *cfg, const uint16_t *slab, const char *dir,
                              const lh_model_files *files) {
  return lh_model_dir_save_bf16_shards(cfg, slab, dir, files, 0);
}

/* Writes the shards of ent[0..n) (each at most shard_bytes, a larger tensor alone) as
 * model-0000k-of-0000n.safetensors, then model.safetensors.index.json. */
static lh_err save_shards(const char *dir, const lh_st_entry *ent, int n, size_t shard_bytes) {
  int *shard = lh_xcalloc((size_t)n, sizeof *shard);
  size_t used = 0, total = 0;
  int n_shards = 1;
  for (int i = 0; i < n; i++) {
    size_t b = 2;
    for (int d = 0; d < ent[i].ndim; d++)
      b *= (size_t)ent[i].shape[d];
    if (used > 0 && used + b > shard_bytes) {
      n_shards++;
      used = 0;
    }
    used += b;
    total += b;
    shard[i] = n_shards - 1;
  }
  lh_err e = LH_ERR_OK;
  json_t *map = json_object();
  char name[64];
  for (int k = 0, first = 0; k < n_shards && !e; k++) {
    int last = first;
    while (last < n && shard[last] == k)
      last++;
    snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
    char *path = lh_path_join(dir, name);
    e = lh_safetensors_write(path, ent + first, last - first);
    free(path);
    for (int i = first; i < last; i++)
      json_object_set_new(map, ent[i].name, json_string(name));
    first = last;
  }
  if (!e) {
    json_t *root =
        json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
    char *text = json_dumps(root, JSON_INDENT(2));
    char *p = lh_path_join(dir, "model.safetensors.index.json");
    e = lh_file_write_atomic(p, text, strlen(text));
    free(p);
    free(text);
    json_decref(root);
  } else {
    json_decref(map);
  }
  free(shard);
  return e;
}

lh_err lh_model_dir_save_bf16_shards(const lh_config *cfg, const uint16_t *slab, const char *dir,
                                     const lh_model_files *files, size_t shard_bytes) {
  static const lh_model_files none = {0};
  if (!files) files = &none;
  size_t bytes = 2 * lh_config_n_params(cfg);
  bool sharded = shard_bytes > 0 && bytes > shard_bytes;
  lh_err e = lh_config_validate(cfg);
  /* whichever layout is not written is removed, so the loader never picks a stale one */
  if (e || (e = lh_mkdir_p(dir)) ||
      (e = put_or_remove(dir, "generation_config.json", files->generation_config,
                         files->generation_len)) ||
      (e = put_or_remove(dir, sharded ? "model.safetensors" : "model.safetensors.index.json", NULL,
                         0)))
    return e;
  int n = lh_model_tensors(cfg, NULL, 0);
  lh_tensor_info *info = lh_xcalloc((size_t)n, sizeof *info);
  lh_st_entry *ent = lh_xcalloc((size_t)n, sizeof *ent);
  lh_model_tensors(cfg, info, n);
  for (int i = 0; i < n; i++) {
    ent[i].name = info[i].name;
    ent[i].dtype = LH_DTYPE_BF16;
    ent[i].ndim = info[i].ndim;
    for (int d = 0; d < info[i].ndim; d++)
      ent[i].shape[d] = info[i].shape[d];
    ent[i].data = slab + info[i].offset;
  }
  char *st_path = lh_path_join(dir, "model.safetensors"),
       *cfg_path = lh_path_join(dir, "config.json");
  /* weights first, so a fresh directory never holds a config.json without its weights */
  e = sharded ? save_shards(dir, ent, n, shard_bytes) : lh_safetensors_write(st_path, ent, n);
  if (!e) e = lh__config_save_dtype(cfg_path, cfg, "bfloat16");
  free(st_path);
  free(cfg_path);
  free(ent);
  free(info);
  if (!e) e = put_or_remove(dir, "tokenizer.json", files->tokenizer_json, files->tokenizer_len);
  return e;
}

/* tokenizer.json and generation_config.json at most (tokenizer.h's LH_TOKENIZER_MAX_FILE) */
#define FILES_MAX_TOKENIZER (64u << 20)

lh_err lh_model_files_read(const char *dir, lh_model_files *files) {
  memset(files, 0, sizeof *files);
  char *tok = lh_path_join(dir, "tokenizer.json"),
       *gen = lh_path_join(dir, "generation_config.json");
  char *t = NULL, *g = NULL;
  lh_err e = LH_ERR_OK;
  if (file_exists(tok)) e = lh_file_read(tok, FILES_MAX_TOKENIZER, &t, &files->tokenizer_len);
  if (!e && file_exists(gen)) e = lh_file_read(gen, MAX_GEN_BYTES, &g, &files->generation_len);
  files->tokenizer_json = t;
  files->generation_config = g;
  if (e) lh_model_files_free(files);
  free(tok);
  free(gen);
  return e;
}

void lh_model_files_free(lh_model_files *files) {
  if (!files) return;
  free((char *)files->tokenizer_json);
  free((char *)files->generation_config);
  memset(files, 0, sizeof *files);
}
