/*
 * Internal HDF5 helpers shared by the trace, co-activation and placement
 * formats (nl_trace.c, nl_coact_fmt.c, nl_placement_fmt.c) and by the
 * stand-alone Zstandard filter plugin (h5zstd_plugin.c). Not installed.
 *
 * Every helper returns 0 or a negative nl_err code and records a diagnostic
 * that names the file (`file`, as the user gave it) and the object path.
 * HDF5's own error printing is switched off by nl_h5_init(): libraries never
 * print. The HDF5 library used here is the serial build, which is not thread
 * safe: callers use one file from one thread at a time.
 */
#ifndef NL_H5_H
#define NL_H5_H

#include <hdf5.h>

#include "nl_formats.h"

/* HDF5 registered filter id of Zstandard (hdf5plugin, HDF Group filter list). */
#define NL_H5Z_FILTER_ZSTD 32015

/* The filter class registered by nl_h5_init() and returned by the plugin. */
extern const H5Z_class2_t nl_h5z_zstd_class;

/*
 * One-time setup: turns off HDF5's automatic error printing and registers the
 * Zstandard filter. Safe to call many times.
 */
int nl_h5_init(void);

/*
 * Converts the current HDF5 error stack into an NL_E_HDF5 diagnostic
 * "'<file>': <what>: <innermost HDF5 message>", clears the stack and returns
 * the code (NL_E_TRUNCATED when HDF5 reported a truncated file, NL_E_COMPRESS
 * when our Zstandard filter failed to decode a chunk).
 */
int nl_h5_fail(const char *file, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Opens an existing file read-only; NL_E_MAGIC when it is not HDF5. */
int nl_h5_open(hid_t *out, const char *file);
/* Creates (truncates) a file for writing. */
int nl_h5_create(hid_t *out, const char *file);

/* Element types of the formats. */
enum nl_h5_type {
	NL_H5_U32 = 0,
	NL_H5_U64 = 1,
	NL_H5_F64 = 2,
};
const char *nl_h5_type_name(enum nl_h5_type t);

/*
 * Creates a chunked dataset compressed per opts. rank 1 or 2. When
 * extensible, dimension 0 is unlimited (for appending). chunk0 is the chunk
 * length along dimension 0 (clamped to >= 1); dimension 1 is never split.
 */
int nl_h5_dset_create(hid_t *out, hid_t loc, const char *file, const char *name,
		      enum nl_h5_type type, int rank, const uint64_t *dims,
		      bool extensible, uint64_t chunk0, const struct nl_h5_opts *opts);

/* Creates and writes a whole dataset in one go (chunked and compressed). */
int nl_h5_write_full(hid_t loc, const char *file, const char *name, enum nl_h5_type type,
		     int rank, const uint64_t *dims, uint64_t chunk0,
		     const struct nl_h5_opts *opts, const void *data);

/*
 * Appends n elements (rank 1) or n rows (rank 2, row length `row`) to an
 * extensible dataset whose current length is *len; updates *len.
 */
int nl_h5_append(hid_t dset, const char *file, const char *name, enum nl_h5_type type,
		 uint64_t *len, uint64_t row, const void *data, uint64_t n);

/*
 * Opens dataset `name` under loc and checks its element type and shape.
 * expect_dims[i] == NL_H5_ANY accepts any length on that axis; the found
 * dimensions are stored in dims_out (may be NULL). Errors: NL_E_MISSING,
 * NL_E_TYPE, NL_E_SHAPE, each naming file, dataset, found, expected and fix.
 */
#define NL_H5_ANY UINT64_MAX
int nl_h5_dset_open(hid_t *out, hid_t loc, const char *file, const char *name,
		    enum nl_h5_type type, int rank, const uint64_t *expect_dims,
		    uint64_t *dims_out, const char *fix);
/* Reads the whole dataset into buf (elements of type `type`). */
int nl_h5_dset_read(hid_t dset, const char *file, const char *name, enum nl_h5_type type,
		    void *buf);
/* nl_h5_dset_open + malloc + read + close; *out freed by the caller. */
int nl_h5_read_alloc(hid_t loc, const char *file, const char *name, enum nl_h5_type type,
		     int rank, const uint64_t *expect_dims, void **out, const char *fix);

/*
 * Attributes on a file/group/dataset. Strings are fixed-length,
 * NUL-terminated UTF-8; variable-length strings are refused (NL_E_TYPE)
 * without reading them (HDF5's global heap reader is not safe on damaged files).
 */
int nl_h5_attr_put_str(hid_t obj, const char *file, const char *name, const char *value);
int nl_h5_attr_put_u64(hid_t obj, const char *file, const char *name, uint64_t value);
int nl_h5_attr_put_u32(hid_t obj, const char *file, const char *name, uint32_t value);
int nl_h5_attr_put_f64(hid_t obj, const char *file, const char *name, double value);
/*
 * Readers: NL_E_MISSING when absent, NL_E_TYPE when of the wrong kind
 * (strings must be fixed-length strings, integers unsigned integers, doubles floats),
 * NL_E_SHAPE when not a scalar, NL_E_FORMAT when a string does not fit.
 * `where` names the object in diagnostics ("/" or "layer_003").
 */
int nl_h5_attr_get_str(hid_t obj, const char *file, const char *where, const char *name,
		       char *buf, size_t size);
int nl_h5_attr_get_u64(hid_t obj, const char *file, const char *where, const char *name,
		       uint64_t *value);
int nl_h5_attr_get_u32(hid_t obj, const char *file, const char *where, const char *name,
		       uint32_t *value);
int nl_h5_attr_get_f64(hid_t obj, const char *file, const char *where, const char *name,
		       double *value);
/* 1 when present, 0 when absent, a negative code (NL_E_HDF5) when HDF5 fails. */
int nl_h5_attr_exists(hid_t obj, const char *file, const char *where, const char *name);
int nl_h5_link_exists(hid_t loc, const char *file, const char *name);
/* Creates group `name` under loc (without modification times). */
int nl_h5_group_create(hid_t *out, hid_t loc, const char *file, const char *name);
/* Opens group `name` under loc: NL_E_MISSING when absent, NL_E_TYPE when not a group. */
int nl_h5_group_open(hid_t *out, hid_t loc, const char *file, const char *name, const char *fix);

/* Group name of a layer: "layer_%03u". */
void nl_h5_layer_name(char *buf, size_t size, uint32_t layer);

/*
 * Common root header of the three formats: attribute `format` (the kind),
 * `version_major`, `version_minor`, and the model identity.
 */
int nl_h5_put_header(hid_t file_id, const char *file, const char *format_name,
		     uint32_t major, uint32_t minor, const struct nl_model_id *model);
/*
 * Checks `format` == format_name (NL_E_MAGIC), version_major == major
 * (NL_E_VERSION when newer or older; any minor is accepted) and reads the
 * model identity (n_layers, n_neurons in range: NL_E_FORMAT).
 */
int nl_h5_get_header(hid_t file_id, const char *file, const char *format_name,
		     uint32_t major, struct nl_model_id *model, uint32_t *minor_out);
/* Checks the model identity a writer was given (NL_E_INVAL). */
int nl_h5_check_model(const struct nl_model_id *model, const char *file);

/*
 * Root attributes `layer_first` and `layer_count` of the per-layer formats
 * (co-activation, placement): checks 1 <= count and first + count <= n_layers.
 * `code` is NL_E_INVAL for a writer's input, NL_E_FORMAT for a file; fix (may
 * be NULL) is appended to the diagnostic.
 */
int nl_h5_check_layer_range(const char *file, uint32_t n_layers, uint32_t first, uint32_t count,
			    int code, const char *fix);
/*
 * Checks that the groups of layers first..first+count-1 exist (links only, the
 * data stay unread): NL_E_MISSING naming the first absent group.
 */
int nl_h5_check_layer_groups(hid_t file_id, const char *file, uint32_t first, uint32_t count,
			     const char *fix);

/*
 * Checks a layer number given to a writer or a reader of a per-layer file
 * holding layers first..first+count-1 (NL_E_INVAL naming the range). A
 * writer passes its written[count] flags to refuse a layer written before;
 * a reader passes NULL.
 */
int nl_h5_check_layer_arg(const char *file, uint32_t first, uint32_t count, uint32_t layer,
			  const bool *written);
/* NL_E_INVAL naming the first layer of first..first+count-1 not written. */
int nl_h5_check_all_written(const char *file, uint32_t first, uint32_t count,
			    const bool *written);
/*
 * Copies path into *path_copy (owned by the caller, free() it, even on
 * failure), opens the file read-only and checks its root header
 * (nl_h5_open, nl_h5_get_header). *file_id is -1 unless the file was opened.
 */
int nl_h5_open_header(hid_t *file_id, char **path_copy, const char *path,
		      const char *format_name, uint32_t major, struct nl_model_id *model,
		      uint32_t *minor_out);

/*
 * Writers' output: the data go to "<path>.tmp", renamed onto path only when
 * complete, so no half-written file ever stands under the final name.
 * nl_h5_tmp_create() sets *path_copy to a copy of path and *tmp to
 * "<path>.tmp" (owned by the caller, free() them, even on failure) and
 * creates the temporary file in *file_id (-1 on failure; nothing to remove).
 */
int nl_h5_tmp_create(hid_t *file_id, char **path_copy, char **tmp, const char *path);
/*
 * Closes (flushes) *file_id and renames tmp onto path (nl_commit_tmp). On
 * failure the temporary file is removed. *file_id is -1 afterwards.
 */
int nl_h5_tmp_commit(hid_t *file_id, const char *tmp, const char *path);
/* Closes *file_id when open (sets it to -1) and removes tmp (may be NULL). */
void nl_h5_tmp_discard(hid_t *file_id, const char *tmp);

/* Closes any HDF5 id (file, group, dataset, ...) when >= 0; returns -1. */
hid_t nl_h5_close(hid_t id);

/* strdup that returns NULL on NULL */
char *nl_h5_strdup(const char *s);

#endif
