/* longhaul safetensors: the Hugging Face tensor file format, read and written (part of the model
 * module, src/model/safetensors.c). Readers check every length and offset of a header before
 * anything is allocated and never trust the file: truncation, overlaps and bad dtypes are errors
 * naming the file and the tensor. Ownership: lh_safetensors_close frees a handle and accepts
 * NULL; tensor data of an opened file belongs to the handle. Thread safety: a handle may be read
 * by several threads at once; nothing here keeps global state. */
#ifndef LONGHAUL_SAFETENSORS_H
#define LONGHAUL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/base.h"

typedef enum {
  LH_DTYPE_F32,
  LH_DTYPE_BF16,
  LH_DTYPE_F16,
  LH_DTYPE_I32,
  LH_DTYPE_I64,
  LH_DTYPE_U8,
  LH_DTYPE__COUNT
} lh_dtype;

#define LH_ST_MAX_DIMS   8
#define LH_ST_MAX_HEADER (100u << 20) /* bytes of JSON header, as Hugging Face's reader */
/* Tensors in one file. The largest Hugging Face checkpoints hold about 10^5 in all, spread over
 * shards. The header's JSON may hold at most LH_ST_MAX_TENSORS * 24 separators (, and :) and
 * brackets, 3 * LH_ST_MAX_TENSORS + 2 of them opening an object or array: a tensor needs 12 with
 * a 2-dimensional shape, 18 with 8. So parsing a header costs at most a few hundred MB, whatever
 * its text holds (the JSON tree takes ~50 bytes a value and ~200 an object). */
#define LH_ST_MAX_TENSORS 200000

typedef struct lh_st_tensor {
  char *name;
  lh_dtype dtype;
  int ndim;
  int64_t shape[LH_ST_MAX_DIMS];
  /* The tensor's nbytes bytes in memory: in the caller's buffer (lh_safetensors_parse) or in
   * memory the lh_safetensors owns (lh_safetensors_open, lh_safetensors_open_buffer), valid
   * until it is closed. NULL for a file opened with lh_safetensors_open_lazy: read it with
   * lh_safetensors_read or lh_safetensors_read_f32(_range). */
  const uint8_t *data;
  size_t nbytes;
  uint64_t offset; /* where its bytes begin in the data section (data_offsets[0]) */
} lh_st_tensor;

typedef struct lh_safetensors {
  int n;
  lh_st_tensor *tensors;
  char *metadata_json; /* "__metadata__" object re-serialised, or NULL */
  int n_meta;          /* pairs in __metadata__ */
  char **meta_kv;      /* (2 * n_meta) its keys and values, alternately, in header order */
  /* private */
  uint8_t *owned;      /* the image or data section the result owns, or NULL */
  int fd;              /* the open file of lh_safetensors_open_lazy, else -1 */
  uint64_t data_start; /* bytes before the data section: 8 + the header's */
  uint64_t data_need;  /* bytes of the data section the tensors take (the largest end) */
  char *path;
} lh_safetensors;

/* Readers. Each checks the header length against LH_ST_MAX_HEADER and the image, the JSON (its
 * cost bounded first, see LH_ST_MAX_TENSORS), dtypes, shapes, __metadata__ (string values
 * only), that offsets match dtype*shape and do not overlap, and that the data section holds
 * every tensor: one that is cut short is LH_ERR_FORMAT "WHAT: truncated: expected N bytes of
 * tensor data, found M (...)". `what` names the source in every message.
 *
 * lh_safetensors_parse reads an image held in memory without copying it (buf must outlive the
 * result). lh_safetensors_open_buffer copies the image first: the result owns its data. */
lh_err lh_safetensors_parse(const uint8_t *buf, size_t len, const char *what, lh_safetensors **out);
lh_err lh_safetensors_open_buffer(const void *buf, size_t len, const char *what,
                                  lh_safetensors **out);
/* Files are opened with lh_file_open_read (a FIFO or a device is refused, never waited on) and
 * read with pread, never mapped: a file truncated while it is read gives the "truncated" error
 * above, never SIGBUS. lh_safetensors_open reads the header and then the whole data section
 * into memory the result owns (tensors' data point there). lh_safetensors_open_lazy reads only
 * the header and keeps the file open; tensors' data is NULL and each read goes to the file, so
 * loading a model takes no memory beyond its destination (lh_model_load, lh_model_load_bf16).
 * Reads of one lh_safetensors may run on several threads at once. */
lh_err lh_safetensors_open(const char *path, lh_safetensors **out);
lh_err lh_safetensors_open_lazy(const char *path, lh_safetensors **out);
void lh_safetensors_close(lh_safetensors *st); /* accepts NULL */
const lh_st_tensor *lh_safetensors_find(const lh_safetensors *st, const char *name);
/* The value of __metadata__ key `key`, or NULL when absent. Valid until st is closed. */
const char *lh_safetensors_meta(const lh_safetensors *st, const char *key);
/* Copies bytes [off, off + n) of tensor t (of st) to dst, from memory or from the file. */
lh_err lh_safetensors_read(const lh_safetensors *st, const lh_st_tensor *t, size_t off, void *dst,
                           size_t n);
/* Converts a F32/BF16/F16 tensor to fp32; `n` must equal its element count. */
lh_err lh_safetensors_read_f32(const lh_safetensors *st, const lh_st_tensor *t, float *dst,
                               size_t n);
/* Converts elements [first, first + n) of a F32/BF16/F16 tensor to fp32. */
lh_err lh_safetensors_read_f32_range(const lh_safetensors *st, const lh_st_tensor *t, size_t first,
                                     float *dst, size_t n);

typedef struct lh_st_entry {
  const char *name;
  lh_dtype dtype;
  int ndim;
  int64_t shape[LH_ST_MAX_DIMS];
  const void *data; /* raw bytes in `dtype` */
} lh_st_entry;
/* model.safetensors.index.json: which shard holds each tensor. */
typedef struct lh_st_index {
  int n_files;
  char **files; /* (n_files) distinct shard file names of weight_map, in first-seen order */
  int n;
  char **names; /* (n) tensor names of weight_map, sorted by strcmp */
  int *file;    /* (n) names[i] lives in files[file[i]] */
} lh_st_index;
/* Parses model.safetensors.index.json text. Every shard must be a plain file name (no '/', not
 * "." or ".."); at most 4096 distinct shards. *out is one malloc'd block holding the struct, its
 * arrays and strings: free it with free(). */
lh_err lh_safetensors_index_parse(const char *json, size_t len, const char *what,
                                  lh_st_index **out);
/* The index into ix->files of the shard weight_map names for tensor `name`, or -1 if it does
 * not list it. */
int lh_safetensors_index_find(const lh_st_index *ix, const char *name);
/* Writers. meta_kv holds n_meta key/value pairs of UTF-8 strings (2 * n_meta pointers: key,
 * value, key, value, ...) that go into the header's __metadata__ in that order, e.g.
 * {"format", "longhaul.trainer_state", "version", "2"} with n_meta 2. __metadata__ always starts
 * with "format": "pt" (what transformers expects of a model file) unless a pair replaces it;
 * n_meta 0 (meta_kv may be NULL) gives {"format":"pt"} alone. A NULL, duplicate or non-UTF-8
 * key or value is LH_ERR_INVAL.
 * lh_safetensors_write(_meta) streams a file as lh_file_write_atomic writes one (temporary
 * file, fsync, rename; a symbolic link's target; a FIFO or device in place; see base.h).
 * lh_safetensors_write_buffer builds the same bytes in memory: *out is malloc'd (free() it),
 * *len its size. */
lh_err lh_safetensors_write(const char *path, const lh_st_entry *entries, int n);
lh_err lh_safetensors_write_meta(const char *path, const lh_st_entry *entries, int n,
                                 const char *const *meta_kv, int n_meta);
lh_err lh_safetensors_write_buffer(const lh_st_entry *entries, int n, const char *const *meta_kv,
                                   int n_meta, char **out, size_t *len);

#endif
