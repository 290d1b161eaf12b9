/*
 * HDF5 plumbing shared by the trace, co-activation and placement formats:
 * the Zstandard filter (HDF5 registered filter 32015), compression options,
 * checked dataset and attribute access, HDF5 error conversion, the common
 * root header, and the small helpers declared in nl_formats.h (temporary
 * file commit, CSR and placement validation, meta/layer frees).
 */
#include "nl_h5.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>

/* ---- Zstandard filter ---- */

/*
 * Largest chunk the filter will decode. HDF5 1.10 chunks are below 4 GiB;
 * the bound stops a corrupt frame header from asking for more.
 */
#define NL_H5Z_MAX_CHUNK ((unsigned long long)UINT32_MAX)

/* Why the last decode on this thread failed, for nl_h5_fail(). */
static _Thread_local char zstd_failure[160];

/*
 * The HDF5 filter callback, wire compatible with hdf5plugin's zstd filter
 * (and the original HDF5Plugin-Zstandard): a chunk is one raw Zstandard frame
 * with its content size in the frame header; cd_values[0], when present, is
 * the compression level. We also set the frame checksum flag, which every
 * conforming decoder (hdf5plugin's included) verifies, so a damaged chunk is
 * detected instead of decoded into wrong numbers.
 */
static size_t nl_h5z_zstd(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[],
			  size_t nbytes, size_t *buf_size, void **buf)
{
	void *out = NULL;
	size_t ret;

	if (flags & H5Z_FLAG_REVERSE) {
		unsigned long long content = ZSTD_getFrameContentSize(*buf, nbytes);

		if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN ||
		    content == 0 || content > NL_H5Z_MAX_CHUNK) {
			snprintf(zstd_failure, sizeof(zstd_failure),
				 "zstd chunk of %zu bytes has no valid frame header", nbytes);
			return 0;
		}
		out = H5allocate_memory((size_t)content, 0);
		if (!out) {
			snprintf(zstd_failure, sizeof(zstd_failure),
				 "out of memory decoding a %llu-byte zstd chunk", content);
			return 0;
		}
		ret = ZSTD_decompress(out, (size_t)content, *buf, nbytes);
		if (ZSTD_isError(ret) || ret != content) {
			snprintf(zstd_failure, sizeof(zstd_failure), "zstd chunk does not decode: %s",
				 ZSTD_isError(ret) ? ZSTD_getErrorName(ret) : "size differs from header");
			H5free_memory(out);
			return 0;
		}
		H5free_memory(*buf);
		*buf = out;
		*buf_size = (size_t)content;
		return ret;
	} else {
		int level = cd_nelmts > 0 ? (int)cd_values[0] : ZSTD_CLEVEL_DEFAULT;
		size_t bound = ZSTD_compressBound(nbytes);
		ZSTD_CCtx *cctx;

		if (level < 1)
			level = 1;
		if (level > ZSTD_maxCLevel())
			level = ZSTD_maxCLevel();
		cctx = ZSTD_createCCtx();
		out = H5allocate_memory(bound, 0);
		if (!cctx || !out)
			goto fail;
		ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
		ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
		ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
		ret = ZSTD_compress2(cctx, out, bound, *buf, nbytes);
		if (ZSTD_isError(ret))
			goto fail;
		ZSTD_freeCCtx(cctx);
		H5free_memory(*buf);
		*buf = out;
		*buf_size = bound;
		return ret;
fail:
		ZSTD_freeCCtx(cctx);
		if (out)
			H5free_memory(out);
		return 0;
	}
}

const H5Z_class2_t nl_h5z_zstd_class = {
	.version = H5Z_CLASS_T_VERS,
	.id = (H5Z_filter_t)NL_H5Z_FILTER_ZSTD,
	.encoder_present = 1,
	.decoder_present = 1,
	.name = "Zstandard",
	.can_apply = NULL,
	.set_local = NULL,
	.filter = nl_h5z_zstd,
};

static pthread_once_t h5_once = PTHREAD_ONCE_INIT;
static int h5_init_err;

static void h5_init_once(void)
{
	/* Libraries never print: HDF5 errors are turned into diagnostics. */
	H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
	if (H5Zregister(&nl_h5z_zstd_class) < 0)
		h5_init_err = NL_E_HDF5;
}

int nl_h5_init(void)
{
	pthread_once(&h5_once, h5_init_once);
	/* The auto-print setting is per error stack; keep it off on every thread. */
	H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
	if (h5_init_err)
		return nl_diag(h5_init_err, "HDF5: cannot register the Zstandard filter (id %d)",
			       NL_H5Z_FILTER_ZSTD);
	return 0;
}

/* ---- errors ---- */

struct h5_walk {
	char desc[512];
	bool truncated;
	bool filter;
};

static herr_t h5_walk_cb(unsigned n, const H5E_error2_t *err, void *data)
{
	struct h5_walk *walk = data;

	(void)n;
	/* Walking downward, the last entry is the innermost, most specific one. */
	if (err->desc && err->desc[0])
		snprintf(walk->desc, sizeof(walk->desc), "%s", err->desc);
	if (err->min_num == H5E_TRUNCATED)
		walk->truncated = true;
	if (err->maj_num == H5E_PLINE || err->min_num == H5E_CANTFILTER)
		walk->filter = true;
	return 0;
}

int nl_h5_fail(const char *file, const char *fmt, ...)
{
	struct h5_walk walk = { .desc = "", .truncated = false, .filter = false };
	char what[512];
	int err = NL_E_HDF5;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, h5_walk_cb, &walk);
	H5Eclear2(H5E_DEFAULT);
	if (walk.truncated) {
		err = NL_E_TRUNCATED;
		nl_diag(err, "'%s': %s: file is truncated (HDF5: %s); the file is incomplete, "
			"re-create it", file, what, walk.desc);
	} else if (walk.filter && zstd_failure[0]) {
		err = NL_E_COMPRESS;
		nl_diag(err, "'%s': %s: %s; the file is damaged, re-create it", file, what,
			zstd_failure);
	} else {
		nl_diag(err, "'%s': %s (HDF5: %s)", file, what,
			walk.desc[0] ? walk.desc : "no detail");
	}
	zstd_failure[0] = '\0';
	return err;
}

hid_t nl_h5_close(hid_t id)
{
	if (id < 0)
		return -1;
	switch (H5Iget_type(id)) {
	case H5I_FILE: H5Fclose(id); break;
	case H5I_GROUP: H5Gclose(id); break;
	case H5I_DATASET: H5Dclose(id); break;
	case H5I_DATASPACE: H5Sclose(id); break;
	case H5I_DATATYPE: H5Tclose(id); break;
	case H5I_ATTR: H5Aclose(id); break;
	case H5I_GENPROP_LST: H5Pclose(id); break;
	default: break;
	}
	return -1;
}

char *nl_h5_strdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* ---- files ---- */

static hid_t h5_fapl(void)
{
	hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);

	/* Closing the file closes every object still open in it. */
	if (fapl >= 0)
		H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
	return fapl;
}

int nl_h5_open(hid_t *out, const char *file)
{
	hid_t fapl = -1, fid;
	htri_t is;
	int err, fd;

	*out = -1;
	err = nl_h5_init();
	if (err)
		return err;
	fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		return nl_diag(err, "'%s': cannot open: %s", file, strerror(-err));
	}
	close(fd);
	is = H5Fis_hdf5(file);
	if (is == 0)
		return nl_diag(NL_E_MAGIC, "'%s': not an HDF5 file (no HDF5 signature found); "
			       "expected a file written by the neuralink tools", file);
	if (is < 0)
		return nl_h5_fail(file, "cannot probe the file");
	fapl = h5_fapl();
	fid = H5Fopen(file, H5F_ACC_RDONLY, fapl);
	/* Read the error stack before any other HDF5 call clears it. */
	err = fid < 0 ? nl_h5_fail(file, "cannot open the HDF5 file") : 0;
	H5Pclose(fapl);
	if (err)
		return err;
	*out = fid;
	return 0;
}

int nl_h5_create(hid_t *out, const char *file)
{
	hid_t fapl, fcpl, fid;
	int err;

	*out = -1;
	err = nl_h5_init();
	if (err)
		return err;
	fapl = h5_fapl();
	/*
	 * The HDF5 1.10 file format, pinned: its chunk indexes (single chunk,
	 * extensible array) keep small files small and appends cheap, and any
	 * HDF5 >= 1.10 reads it (h5py, hdf5plugin, h5dump). Pinning the upper
	 * bound keeps newer HDF5 releases from writing newer structures.
	 */
	if (fapl >= 0)
		H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
	fcpl = H5Pcreate(H5P_FILE_CREATE);
	/* No modification times (also on the root group): reproducible files. */
	if (fcpl >= 0)
		H5Pset_obj_track_times(fcpl, 0);
	fid = H5Fcreate(file, H5F_ACC_TRUNC, fcpl, fapl);
	err = fid < 0 ? nl_h5_fail(file, "cannot create the HDF5 file") : 0;
	nl_h5_close(fcpl);
	H5Pclose(fapl);
	if (err)
		return err;
	*out = fid;
	return 0;
}

/* ---- options ---- */

int nl_h5_opts_parse(struct nl_h5_opts *opts, const char *spec)
{
	const char *colon;
	size_t name_len;
	long level = 0;

	if (!opts || !spec)
		return nl_diag(NL_E_INVAL, "compression: no value given; "
			       "expected zstd[:LEVEL], deflate[:LEVEL] or none");
	colon = strchr(spec, ':');
	name_len = colon ? (size_t)(colon - spec) : strlen(spec);
	if (colon) {
		char *end;

		errno = 0;
		level = strtol(colon + 1, &end, 10);
		if (colon[1] == '\0' || *end != '\0' || errno)
			return nl_diag(NL_E_INVAL, "compression '%s': level '%s' is not a number; "
				       "expected e.g. zstd:19 or deflate:6", spec, colon + 1);
	}
	if (name_len == 4 && !strncmp(spec, "zstd", 4)) {
		if (level < 0 || level > ZSTD_maxCLevel())
			return nl_diag(NL_E_INVAL, "compression '%s': zstd level %ld out of range, "
				       "expected 1..%d (0 = default %d)", spec, level,
				       ZSTD_maxCLevel(), ZSTD_CLEVEL_DEFAULT);
		opts->compress = NL_COMPRESS_ZSTD;
	} else if (name_len == 7 && !strncmp(spec, "deflate", 7)) {
		if (level < 0 || level > 9)
			return nl_diag(NL_E_INVAL, "compression '%s': deflate level %ld out of range, "
				       "expected 1..9 (0 = default 6)", spec, level);
		opts->compress = NL_COMPRESS_DEFLATE;
	} else if (name_len == 4 && !strncmp(spec, "none", 4)) {
		if (colon)
			return nl_diag(NL_E_INVAL, "compression '%s': 'none' takes no level", spec);
		opts->compress = NL_COMPRESS_NONE;
	} else {
		return nl_diag(NL_E_INVAL, "compression '%s' unknown; expected zstd[:LEVEL], "
			       "deflate[:LEVEL] or none", spec);
	}
	opts->level = (int)level;
	return 0;
}

/* ---- types ---- */

static hid_t file_type(enum nl_h5_type t)
{
	switch (t) {
	case NL_H5_U32: return H5T_STD_U32LE;
	case NL_H5_U64: return H5T_STD_U64LE;
	case NL_H5_F64: return H5T_IEEE_F64LE;
	}
	return -1;
}

static hid_t mem_type(enum nl_h5_type t)
{
	switch (t) {
	case NL_H5_U32: return H5T_NATIVE_UINT32;
	case NL_H5_U64: return H5T_NATIVE_UINT64;
	case NL_H5_F64: return H5T_NATIVE_DOUBLE;
	}
	return -1;
}

static size_t type_size(enum nl_h5_type t)
{
	return t == NL_H5_U32 ? 4 : 8;
}

const char *nl_h5_type_name(enum nl_h5_type t)
{
	switch (t) {
	case NL_H5_U32: return "uint32";
	case NL_H5_U64: return "uint64";
	case NL_H5_F64: return "float64";
	}
	return "?";
}

/* Describes an HDF5 type in numpy terms ("int64", "float32", "string"). */
static void describe_type(hid_t t, char *buf, size_t size)
{
	size_t bytes = H5Tget_size(t);

	switch (H5Tget_class(t)) {
	case H5T_INTEGER:
		snprintf(buf, size, "%sint%zu", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", bytes * 8);
		break;
	case H5T_FLOAT:
		snprintf(buf, size, "float%zu", bytes * 8);
		break;
	case H5T_STRING:
		snprintf(buf, size, "string");
		break;
	case H5T_COMPOUND:
		snprintf(buf, size, "compound");
		break;
	default:
		snprintf(buf, size, "HDF5 class %d", (int)H5Tget_class(t));
		break;
	}
}

static bool type_matches(hid_t t, enum nl_h5_type want)
{
	H5T_class_t cls = H5Tget_class(t);
	size_t bytes = H5Tget_size(t);

	if (want == NL_H5_F64)
		return cls == H5T_FLOAT && bytes == 8;
	return cls == H5T_INTEGER && H5Tget_sign(t) == H5T_SGN_NONE && bytes == type_size(want);
}

static void describe_dims(char *buf, size_t size, int rank, const uint64_t *dims)
{
	size_t used = 0;

	used += snprintf(buf + used, size - used, "[");
	for (int i = 0; i < rank && used < size; i++) {
		if (dims[i] == NL_H5_ANY)
			used += snprintf(buf + used, size - used, "%s*", i ? ", " : "");
		else
			used += snprintf(buf + used, size - used, "%s%llu", i ? ", " : "",
					 (unsigned long long)dims[i]);
	}
	if (used < size)
		snprintf(buf + used, size - used, "]");
}

/* ---- datasets ---- */

int nl_h5_dset_create(hid_t *out, hid_t loc, const char *file, const char *name,
		      enum nl_h5_type type, int rank, const uint64_t *dims,
		      bool extensible, uint64_t chunk0, const struct nl_h5_opts *opts)
{
	hsize_t cur[2], max[2], chunk[2];
	uint64_t row = rank == 2 ? dims[1] : 1;
	uint64_t max_chunk_elems;
	hid_t space = -1, dcpl = -1, dset;
	int err = 0;

	*out = -1;
	if (rank < 1 || rank > 2 || (rank == 2 && dims[1] == 0))
		return nl_diag(NL_E_INVAL, "'%s': dataset '%s': unsupported shape", file, name);
	/* A fixed dimension of 0 cannot be chunked; an unlimited one can. */
	if (dims[0] == 0)
		extensible = true;
	if (!extensible && chunk0 > dims[0])
		chunk0 = dims[0];
	/* HDF5 chunks must stay below 4 GiB. */
	max_chunk_elems = ((uint64_t)1 << 30) / type_size(type) / row;
	if (chunk0 > max_chunk_elems)
		chunk0 = max_chunk_elems;
	if (chunk0 < 1)
		chunk0 = 1;
	for (int i = 0; i < rank; i++) {
		cur[i] = dims[i];
		max[i] = dims[i];
		chunk[i] = dims[i];
	}
	if (extensible)
		max[0] = H5S_UNLIMITED;
	chunk[0] = chunk0;
	space = H5Screate_simple(rank, cur, max);
	dcpl = H5Pcreate(H5P_DATASET_CREATE);
	/* No modification times: the same data gives the same bytes. */
	if (space < 0 || dcpl < 0 || H5Pset_obj_track_times(dcpl, 0) < 0 ||
	    H5Pset_chunk(dcpl, rank, chunk) < 0) {
		err = nl_h5_fail(file, "dataset '%s': cannot set up its layout", name);
		goto out;
	}
	if (opts && opts->compress != NL_COMPRESS_NONE) {
		/* Byte shuffle first: ids and offsets compress much better by byte plane. */
		if (H5Pset_shuffle(dcpl) < 0) {
			err = nl_h5_fail(file, "dataset '%s': cannot add the shuffle filter", name);
			goto out;
		}
		if (opts->compress == NL_COMPRESS_ZSTD) {
			unsigned int level = opts->level > 0 ? (unsigned)opts->level
							     : (unsigned)ZSTD_CLEVEL_DEFAULT;

			if (H5Pset_filter(dcpl, NL_H5Z_FILTER_ZSTD, H5Z_FLAG_MANDATORY, 1, &level) < 0) {
				err = nl_h5_fail(file, "dataset '%s': cannot add the zstd filter", name);
				goto out;
			}
		} else if (H5Pset_deflate(dcpl, opts->level > 0 ? (unsigned)opts->level : 6) < 0) {
			err = nl_h5_fail(file, "dataset '%s': cannot add the deflate filter", name);
			goto out;
		}
	}
	dset = H5Dcreate2(loc, name, file_type(type), space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
	if (dset < 0) {
		err = nl_h5_fail(file, "cannot create dataset '%s'", name);
		goto out;
	}
	*out = dset;
out:
	nl_h5_close(dcpl);
	nl_h5_close(space);
	return err;
}

int nl_h5_write_full(hid_t loc, const char *file, const char *name, enum nl_h5_type type,
		     int rank, const uint64_t *dims, uint64_t chunk0,
		     const struct nl_h5_opts *opts, const void *data)
{
	hid_t dset;
	int err;

	err = nl_h5_dset_create(&dset, loc, file, name, type, rank, dims, false, chunk0, opts);
	if (err)
		return err;
	if (dims[0] > 0 && H5Dwrite(dset, mem_type(type), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
		err = nl_h5_fail(file, "cannot write dataset '%s'", name);
	if (H5Dclose(dset) < 0 && !err)
		err = nl_h5_fail(file, "cannot close dataset '%s'", name);
	return err;
}

int nl_h5_append(hid_t dset, const char *file, const char *name, enum nl_h5_type type,
		 uint64_t *len, uint64_t row, const void *data, uint64_t n)
{
	int rank = row > 1 ? 2 : 1;
	hsize_t dims[2] = { *len + n, row }, start[2] = { *len, 0 }, count[2] = { n, row };
	hid_t fspace = -1, mspace = -1;
	int err = 0;

	if (n == 0)
		return 0;
	if (H5Dset_extent(dset, dims) < 0) {
		err = nl_h5_fail(file, "dataset '%s': cannot grow to %llu entries", name,
				 (unsigned long long)dims[0]);
		goto out;
	}
	fspace = H5Dget_space(dset);
	mspace = H5Screate_simple(rank, count, NULL);
	if (fspace < 0 || mspace < 0 ||
	    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
	    H5Dwrite(dset, mem_type(type), mspace, fspace, H5P_DEFAULT, data) < 0) {
		err = nl_h5_fail(file, "dataset '%s': cannot append %llu entries", name,
				 (unsigned long long)n);
		goto out;
	}
	*len += n;
out:
	nl_h5_close(mspace);
	nl_h5_close(fspace);
	return err;
}

int nl_h5_link_exists(hid_t loc, const char *file, const char *name)
{
	htri_t exists = H5Lexists(loc, name, H5P_DEFAULT);

	if (exists < 0)
		return nl_h5_fail(file, "cannot look up '%s'", name);
	return exists > 0;
}

int nl_h5_dset_open(hid_t *out, hid_t loc, const char *file, const char *name,
		    enum nl_h5_type type, int rank, const uint64_t *expect_dims,
		    uint64_t *dims_out, const char *fix)
{
	char found[64], want[64];
	hsize_t dims[H5S_MAX_RANK];
	hid_t dset = -1, dtype = -1, space = -1;
	H5O_info_t info;
	int err = 0, found_rank;

	*out = -1;
	err = nl_h5_link_exists(loc, file, name);
	if (err < 0)
		return err;
	if (!err)
		return nl_diag(NL_E_MISSING, "'%s': dataset '%s' is missing; %s", file, name, fix);
	err = 0;
	if (H5Oget_info_by_name(loc, name, &info, H5P_DEFAULT) < 0)
		return nl_h5_fail(file, "cannot inspect '%s'", name);
	if (info.type != H5O_TYPE_DATASET)
		return nl_diag(NL_E_TYPE, "'%s': '%s' is not a dataset; %s", file, name, fix);
	dset = H5Dopen2(loc, name, H5P_DEFAULT);
	if (dset < 0)
		return nl_h5_fail(file, "cannot open dataset '%s'", name);
	dtype = H5Dget_type(dset);
	space = H5Dget_space(dset);
	if (dtype < 0 || space < 0) {
		err = nl_h5_fail(file, "cannot inspect dataset '%s'", name);
		goto out;
	}
	if (!type_matches(dtype, type)) {
		describe_type(dtype, found, sizeof(found));
		err = nl_diag(NL_E_TYPE, "'%s': dataset '%s' has element type %s, expected %s; %s",
			      file, name, found, nl_h5_type_name(type), fix);
		goto out;
	}
	found_rank = H5Sget_simple_extent_ndims(space);
	if (found_rank < 0 || H5Sget_simple_extent_type(space) != H5S_SIMPLE) {
		err = nl_diag(NL_E_SHAPE, "'%s': dataset '%s' is a scalar or empty dataspace, "
			      "expected a %d-D array; %s", file, name, rank, fix);
		goto out;
	}
	H5Sget_simple_extent_dims(space, dims, NULL);
	{
		bool ok = found_rank == rank;
		uint64_t found_dims[H5S_MAX_RANK];

		for (int i = 0; i < found_rank; i++) {
			found_dims[i] = dims[i];
			if (ok && expect_dims[i] != NL_H5_ANY && expect_dims[i] != dims[i])
				ok = false;
		}
		if (!ok) {
			describe_dims(found, sizeof(found), found_rank, found_dims);
			describe_dims(want, sizeof(want), rank, expect_dims);
			err = nl_diag(NL_E_SHAPE, "'%s': dataset '%s' has shape %s, expected %s; %s",
				      file, name, found, want, fix);
			goto out;
		}
		if (dims_out)
			for (int i = 0; i < rank; i++)
				dims_out[i] = found_dims[i];
	}
	*out = dset;
	dset = -1;
out:
	nl_h5_close(space);
	nl_h5_close(dtype);
	nl_h5_close(dset);
	return err;
}

int nl_h5_dset_read(hid_t dset, const char *file, const char *name, enum nl_h5_type type,
		    void *buf)
{
	if (H5Dread(dset, mem_type(type), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
		return nl_h5_fail(file, "cannot read dataset '%s'", name);
	return 0;
}

int nl_h5_read_alloc(hid_t loc, const char *file, const char *name, enum nl_h5_type type,
		     int rank, const uint64_t *expect_dims, void **out, const char *fix)
{
	uint64_t dims[2] = { 0, 1 }, elems, bytes;
	void *buf = NULL;
	hid_t dset;
	int err;

	*out = NULL;
	err = nl_h5_dset_open(&dset, loc, file, name, type, rank, expect_dims, dims, fix);
	if (err)
		return err;
	if (__builtin_mul_overflow(dims[0], rank == 2 ? dims[1] : 1, &elems) ||
	    __builtin_mul_overflow(elems, (uint64_t)type_size(type), &bytes) || bytes > SIZE_MAX) {
		err = nl_diag(NL_E_FORMAT, "'%s': dataset '%s' is too large to read", file, name);
		goto out;
	}
	buf = malloc(bytes ? bytes : 1);
	if (!buf) {
		err = nl_diag(-ENOMEM, "'%s': dataset '%s': cannot allocate %llu bytes", file, name,
			      (unsigned long long)bytes);
		goto out;
	}
	if (elems)
		err = nl_h5_dset_read(dset, file, name, type, buf);
	if (err) {
		free(buf);
		goto out;
	}
	*out = buf;
out:
	H5Dclose(dset);
	return err;
}

/* ---- attributes ---- */

static int attr_put(hid_t obj, const char *file, const char *name, hid_t ftype, hid_t mtype,
		    const void *value)
{
	hid_t space, attr;
	int err = 0;

	space = H5Screate(H5S_SCALAR);
	if (space < 0)
		return nl_h5_fail(file, "attribute '%s': cannot create a dataspace", name);
	if (H5Aexists(obj, name) > 0)
		H5Adelete(obj, name);
	attr = H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
	if (attr < 0 || H5Awrite(attr, mtype, value) < 0)
		err = nl_h5_fail(file, "cannot write attribute '%s'", name);
	nl_h5_close(attr);
	H5Sclose(space);
	return err;
}

/*
 * Strings are fixed-length (strlen + 1, NUL-terminated, UTF-8): they live in
 * the attribute itself, not in a global heap collection, which keeps small
 * files small and keeps HDF5 away from its heap-reading code on damaged files.
 */
int nl_h5_attr_put_str(hid_t obj, const char *file, const char *name, const char *value)
{
	hid_t type = H5Tcopy(H5T_C_S1);
	int err;

	if (type < 0 || H5Tset_size(type, strlen(value) + 1) < 0 ||
	    H5Tset_strpad(type, H5T_STR_NULLTERM) < 0 ||
	    H5Tset_cset(type, H5T_CSET_UTF8) < 0) {
		nl_h5_close(type);
		return nl_h5_fail(file, "attribute '%s': cannot make a string type", name);
	}
	err = attr_put(obj, file, name, type, type, value);
	H5Tclose(type);
	return err;
}

int nl_h5_attr_put_u64(hid_t obj, const char *file, const char *name, uint64_t value)
{
	return attr_put(obj, file, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

int nl_h5_attr_put_u32(hid_t obj, const char *file, const char *name, uint32_t value)
{
	return attr_put(obj, file, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &value);
}

int nl_h5_attr_put_f64(hid_t obj, const char *file, const char *name, double value)
{
	return attr_put(obj, file, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

int nl_h5_attr_exists(hid_t obj, const char *file, const char *where, const char *name)
{
	htri_t exists = H5Aexists(obj, name);

	if (exists < 0)
		return nl_h5_fail(file, "cannot look up attribute '%s' of '%s'", name, where);
	return exists > 0;
}

/*
 * Opens a scalar attribute and returns it with its type; `kind` names what
 * was expected for the diagnostic.
 */
static int attr_open(hid_t obj, const char *file, const char *where, const char *name,
		     H5T_class_t want, const char *kind, hid_t *attr_out, hid_t *type_out)
{
	hid_t attr = -1, type = -1, space = -1;
	char found[64];
	int err = 0;

	*attr_out = -1;
	*type_out = -1;
	err = nl_h5_attr_exists(obj, file, where, name);
	if (err < 0)
		return err;
	if (!err)
		return nl_diag(NL_E_MISSING, "'%s': attribute '%s' of '%s' is missing; "
			       "the file was not written by a compatible writer, re-create it",
			       file, name, where);
	err = 0;
	attr = H5Aopen(obj, name, H5P_DEFAULT);
	if (attr < 0)
		return nl_h5_fail(file, "cannot open attribute '%s' of '%s'", name, where);
	type = H5Aget_type(attr);
	space = H5Aget_space(attr);
	if (type < 0 || space < 0) {
		err = nl_h5_fail(file, "cannot inspect attribute '%s' of '%s'", name, where);
		goto out;
	}
	if (H5Tget_class(type) != want ||
	    (want == H5T_INTEGER && H5Tget_sign(type) != H5T_SGN_NONE)) {
		describe_type(type, found, sizeof(found));
		err = nl_diag(NL_E_TYPE, "'%s': attribute '%s' of '%s' is %s, expected %s; "
			      "re-create the file", file, name, where, found, kind);
		goto out;
	}
	if (H5Sget_simple_extent_npoints(space) != 1) {
		err = nl_diag(NL_E_SHAPE, "'%s': attribute '%s' of '%s' has %lld values, "
			      "expected a scalar; re-create the file", file, name, where,
			      (long long)H5Sget_simple_extent_npoints(space));
		goto out;
	}
	*attr_out = attr;
	*type_out = type;
	attr = -1;
	type = -1;
out:
	nl_h5_close(space);
	nl_h5_close(type);
	nl_h5_close(attr);
	return err;
}

int nl_h5_attr_get_str(hid_t obj, const char *file, const char *where, const char *name,
		       char *buf, size_t size)
{
	hid_t attr, type, mtype = -1;
	size_t fixed, len;
	char *tmp = NULL;
	int err;

	err = attr_open(obj, file, where, name, H5T_STRING, "a string", &attr, &type);
	if (err)
		return err;
	/*
	 * Variable-length strings live in a global heap, and HDF5 1.10 reads heap
	 * objects without checking their sizes: a damaged file crashes the
	 * library. Refuse them without reading; our writers use fixed-length.
	 */
	if (H5Tis_variable_str(type) != 0) {
		err = nl_diag(NL_E_TYPE, "'%s': attribute '%s' of '%s' is a variable-length string, "
			      "expected a fixed-length string (h5py: numpy.bytes_); re-create the file",
			      file, name, where);
		goto out;
	}
	fixed = H5Tget_size(type);
	if (fixed == 0 || fixed > 65536) {
		err = nl_diag(NL_E_FORMAT, "'%s': attribute '%s' of '%s' is a string of %zu bytes, "
			      "expected at most %zu; re-create the file", file, name, where, fixed,
			      size - 1);
		goto out;
	}
	tmp = calloc(1, fixed + 1);
	mtype = H5Tcopy(H5T_C_S1);
	if (!tmp || mtype < 0) {
		err = nl_diag(-ENOMEM, "'%s': attribute '%s': out of memory", file, name);
		goto out;
	}
	H5Tset_size(mtype, fixed + 1);
	H5Tset_strpad(mtype, H5T_STR_NULLTERM);
	H5Tset_cset(mtype, H5Tget_cset(type));
	if (H5Aread(attr, mtype, tmp) < 0) {
		err = nl_h5_fail(file, "cannot read attribute '%s' of '%s'", name, where);
		goto out;
	}
	len = strlen(tmp);
	if (len >= size) {
		err = nl_diag(NL_E_FORMAT, "'%s': attribute '%s' of '%s' is %zu bytes long, at most "
			      "%zu allowed; re-create the file", file, name, where, len, size - 1);
		goto out;
	}
	memcpy(buf, tmp, len + 1);
out:
	free(tmp);
	nl_h5_close(mtype);
	H5Tclose(type);
	H5Aclose(attr);
	return err;
}

int nl_h5_attr_get_u64(hid_t obj, const char *file, const char *where, const char *name,
		       uint64_t *value)
{
	hid_t attr, type;
	int err;

	err = attr_open(obj, file, where, name, H5T_INTEGER, "an unsigned integer", &attr, &type);
	if (err)
		return err;
	if (H5Aread(attr, H5T_NATIVE_UINT64, value) < 0)
		err = nl_h5_fail(file, "cannot read attribute '%s' of '%s'", name, where);
	H5Tclose(type);
	H5Aclose(attr);
	return err;
}

int nl_h5_attr_get_u32(hid_t obj, const char *file, const char *where, const char *name,
		       uint32_t *value)
{
	uint64_t wide;
	int err;

	err = nl_h5_attr_get_u64(obj, file, where, name, &wide);
	if (err)
		return err;
	if (wide > UINT32_MAX)
		return nl_diag(NL_E_FORMAT, "'%s': attribute '%s' of '%s' is %llu, expected at most "
			       "%u; re-create the file", file, name, where,
			       (unsigned long long)wide, UINT32_MAX);
	*value = (uint32_t)wide;
	return 0;
}

int nl_h5_attr_get_f64(hid_t obj, const char *file, const char *where, const char *name,
		       double *value)
{
	hid_t attr, type;
	int err;

	err = attr_open(obj, file, where, name, H5T_FLOAT, "a float", &attr, &type);
	if (err)
		return err;
	if (H5Aread(attr, H5T_NATIVE_DOUBLE, value) < 0)
		err = nl_h5_fail(file, "cannot read attribute '%s' of '%s'", name, where);
	H5Tclose(type);
	H5Aclose(attr);
	return err;
}

void nl_h5_layer_name(char *buf, size_t size, uint32_t layer)
{
	snprintf(buf, size, "layer_%03u", layer);
}

int nl_h5_group_create(hid_t *out, hid_t loc, const char *file, const char *name)
{
	hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE), group;
	int err = 0;

	if (gcpl >= 0)
		H5Pset_obj_track_times(gcpl, 0);
	group = H5Gcreate2(loc, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
	if (group < 0)
		err = nl_h5_fail(file, "cannot create group '%s'", name);
	nl_h5_close(gcpl);
	*out = group;
	return err;
}

int nl_h5_group_open(hid_t *out, hid_t loc, const char *file, const char *name, const char *fix)
{
	H5O_info_t info;
	hid_t group;
	int err;

	*out = -1;
	err = nl_h5_link_exists(loc, file, name);
	if (err < 0)
		return err;
	if (!err)
		return nl_diag(NL_E_MISSING, "'%s': group '%s' is missing; %s", file, name, fix);
	if (H5Oget_info_by_name(loc, name, &info, H5P_DEFAULT) < 0)
		return nl_h5_fail(file, "cannot inspect '%s'", name);
	if (info.type != H5O_TYPE_GROUP)
		return nl_diag(NL_E_TYPE, "'%s': '%s' is not a group; %s", file, name, fix);
	group = H5Gopen2(loc, name, H5P_DEFAULT);
	if (group < 0)
		return nl_h5_fail(file, "cannot open group '%s'", name);
	*out = group;
	return 0;
}

/* ---- common root header ---- */

int nl_h5_check_model(const struct nl_model_id *model, const char *file)
{
	if (!model || model->n_layers == 0 || model->n_layers > NL_MAX_LAYERS ||
	    model->n_neurons == 0 || model->d_model == 0)
		return nl_diag(NL_E_INVAL, "'%s': model identity needs 1..%d layers and non-zero "
			       "n_neurons and d_model (got %u layers, %u neurons, d_model %u)",
			       file, NL_MAX_LAYERS, model ? model->n_layers : 0,
			       model ? model->n_neurons : 0, model ? model->d_model : 0);
	if (memchr(model->name, '\0', sizeof(model->name)) == NULL)
		return nl_diag(NL_E_INVAL, "'%s': model name is not NUL-terminated", file);
	return 0;
}

int nl_h5_put_header(hid_t file_id, const char *file, const char *format_name,
		     uint32_t major, uint32_t minor, const struct nl_model_id *model)
{
	int err;

	err = nl_h5_attr_put_str(file_id, file, "format", format_name);
	if (!err)
		err = nl_h5_attr_put_u32(file_id, file, "version_major", major);
	if (!err)
		err = nl_h5_attr_put_u32(file_id, file, "version_minor", minor);
	if (!err)
		err = nl_h5_attr_put_str(file_id, file, "model_name", model->name);
	if (!err)
		err = nl_h5_attr_put_u32(file_id, file, "n_layers", model->n_layers);
	if (!err)
		err = nl_h5_attr_put_u32(file_id, file, "d_model", model->d_model);
	if (!err)
		err = nl_h5_attr_put_u32(file_id, file, "n_neurons", model->n_neurons);
	return err;
}

int nl_h5_get_header(hid_t file_id, const char *file, const char *format_name,
		     uint32_t major, struct nl_model_id *model, uint32_t *minor_out)
{
	char found[64];
	uint32_t found_major, found_minor;
	int err;

	err = nl_h5_attr_exists(file_id, file, "/", "format");
	if (err < 0)
		return err;
	if (!err)
		return nl_diag(NL_E_MAGIC, "'%s': HDF5 file has no root attribute 'format', "
			       "expected format '%s'; this is not a neuralink file", file, format_name);
	err = nl_h5_attr_get_str(file_id, file, "/", "format", found, sizeof(found));
	if (err == NL_E_FORMAT || err == NL_E_TYPE || err == NL_E_SHAPE)
		return nl_diag(NL_E_MAGIC, "'%s': root attribute 'format' is not a short string, "
			       "expected '%s'; this is not a %s file", file, format_name, format_name);
	if (err)
		return err;
	if (strcmp(found, format_name))
		return nl_diag(NL_E_MAGIC, "'%s': root attribute 'format' is '%s', expected '%s'; "
			       "pass a %s file", file, found, format_name, format_name);
	err = nl_h5_attr_get_u32(file_id, file, "/", "version_major", &found_major);
	if (!err)
		err = nl_h5_attr_get_u32(file_id, file, "/", "version_minor", &found_minor);
	if (err)
		return err;
	if (found_major != major)
		return nl_diag(NL_E_VERSION, "'%s': %s format version %u.%u, this reader knows "
			       "major version %u; %s", file, format_name, found_major, found_minor,
			       major, found_major > major ? "upgrade the neuralink tools"
							  : "re-create the file with these tools");
	if (minor_out)
		*minor_out = found_minor;
	memset(model, 0, sizeof(*model));
	err = nl_h5_attr_get_str(file_id, file, "/", "model_name", model->name, sizeof(model->name));
	if (!err)
		err = nl_h5_attr_get_u32(file_id, file, "/", "n_layers", &model->n_layers);
	if (!err)
		err = nl_h5_attr_get_u32(file_id, file, "/", "d_model", &model->d_model);
	if (!err)
		err = nl_h5_attr_get_u32(file_id, file, "/", "n_neurons", &model->n_neurons);
	if (err)
		return err;
	if (model->n_layers == 0 || model->n_layers > NL_MAX_LAYERS)
		return nl_diag(NL_E_FORMAT, "'%s': root attribute 'n_layers' is %u, expected "
			       "1..%d; re-create the file", file, model->n_layers, NL_MAX_LAYERS);
	if (model->n_neurons == 0)
		return nl_diag(NL_E_FORMAT, "'%s': root attribute 'n_neurons' is 0, expected at "
			       "least 1; re-create the file", file);
	if (model->d_model == 0)
		return nl_diag(NL_E_FORMAT, "'%s': root attribute 'd_model' is 0, expected at "
			       "least 1; re-create the file", file);
	return 0;
}

/* ---- per-layer files (co-activation, placement) ---- */

int nl_h5_check_layer_range(const char *file, uint32_t n_layers, uint32_t first, uint32_t count,
			    int code, const char *fix)
{
	if (count == 0 || first >= n_layers || count > n_layers - first)
		return nl_diag(code, "'%s': layer range layer_first=%u layer_count=%u does not fit "
			       "n_layers=%u%s%s", file, first, count, n_layers, fix ? "; " : "",
			       fix ? fix : "");
	return 0;
}

int nl_h5_check_layer_groups(hid_t file_id, const char *file, uint32_t first, uint32_t count,
			     const char *fix)
{
	for (uint32_t i = 0; i < count; i++) {
		char group_name[32];
		int err;

		nl_h5_layer_name(group_name, sizeof(group_name), first + i);
		err = nl_h5_link_exists(file_id, file, group_name);
		if (err < 0)
			return err;
		if (!err)
			return nl_diag(NL_E_MISSING, "'%s': group '%s' is missing (layers %u..%u "
				       "declared); %s", file, group_name, first, first + count - 1,
				       fix);
	}
	return 0;
}

int nl_h5_check_layer_arg(const char *file, uint32_t first, uint32_t count, uint32_t layer,
			  const bool *written)
{
	if (layer < first || layer - first >= count)
		return nl_diag(NL_E_INVAL, "'%s': layer %u outside the file's range %u..%u", file,
			       layer, first, first + count - 1);
	if (written && written[layer - first])
		return nl_diag(NL_E_INVAL, "'%s': layer %u written twice", file, layer);
	return 0;
}

int nl_h5_check_all_written(const char *file, uint32_t first, uint32_t count,
			    const bool *written)
{
	for (uint32_t i = 0; i < count; i++) {
		if (!written[i])
			return nl_diag(NL_E_INVAL, "'%s': layer %u was never written", file,
				       first + i);
	}
	return 0;
}

int nl_h5_open_header(hid_t *file_id, char **path_copy, const char *path,
		      const char *format_name, uint32_t major, struct nl_model_id *model,
		      uint32_t *minor_out)
{
	int err;

	*file_id = -1;
	*path_copy = strdup(path);
	if (!*path_copy)
		return nl_diag(-ENOMEM, "'%s': out of memory", path);
	err = nl_h5_open(file_id, path);
	if (!err)
		err = nl_h5_get_header(*file_id, path, format_name, major, model, minor_out);
	return err;
}

/* ---- writers' temporary files ---- */

int nl_h5_tmp_create(hid_t *file_id, char **path_copy, char **tmp, const char *path)
{
	size_t tmp_size = strlen(path) + 5;
	int err;

	*file_id = -1;
	*path_copy = strdup(path);
	*tmp = malloc(tmp_size);
	if (!*path_copy || !*tmp)
		return nl_diag(-ENOMEM, "'%s': out of memory", path);
	err = nl_tmp_path(*tmp, tmp_size, path);
	if (!err)
		err = nl_h5_create(file_id, *tmp);
	return err;
}

int nl_h5_tmp_commit(hid_t *file_id, const char *tmp, const char *path)
{
	herr_t closed = H5Fclose(*file_id);
	int err;

	*file_id = -1;
	if (closed < 0)
		err = nl_h5_fail(path, "cannot close (flush) the file");
	else
		err = nl_commit_tmp(tmp, path);
	if (err)
		unlink(tmp);
	return err;
}

void nl_h5_tmp_discard(hid_t *file_id, const char *tmp)
{
	*file_id = nl_h5_close(*file_id);
	if (tmp)
		unlink(tmp);
}

/* ---- nl_formats.h helpers ---- */

int nl_tmp_path(char *buf, size_t size, const char *path)
{
	int n = snprintf(buf, size, "%s.tmp", path);

	if (n < 0 || (size_t)n >= size)
		return nl_diag(-ENAMETOOLONG, "'%s': path too long for its temporary name", path);
	return 0;
}

int nl_commit_tmp(const char *tmp, const char *path)
{
	char dir[4096];
	const char *slash;
	int fd, err = 0;

	fd = open(tmp, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		return nl_diag(err, "'%s': cannot open to sync: %s", tmp, strerror(-err));
	}
	if (fsync(fd) < 0) {
		err = -errno;
		close(fd);
		return nl_diag(err, "'%s': fsync failed: %s", tmp, strerror(-err));
	}
	close(fd);
	if (rename(tmp, path) < 0) {
		err = -errno;
		return nl_diag(err, "'%s': cannot rename to '%s': %s", tmp, path, strerror(-err));
	}
	slash = strrchr(path, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == path)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		return nl_diag(err, "'%s': cannot open directory to sync: %s", dir, strerror(-err));
	}
	/* Some file systems refuse fsync on directories; the rename is done by then. */
	if (fsync(fd) < 0 && errno != EINVAL && errno != EROFS) {
		err = -errno;
		nl_diag(err, "'%s': directory fsync failed: %s", dir, strerror(-err));
	}
	close(fd);
	return err;
}

void nl_csr_free(struct nl_csr *csr)
{
	if (!csr)
		return;
	free(csr->indptr);
	free(csr->indices);
	memset(csr, 0, sizeof(*csr));
}

int nl_csr_validate(const struct nl_csr *csr, const char *what)
{
	const uint64_t *indptr = csr->indptr;
	uint64_t nnz;

	if (!indptr)
		return nl_diag(NL_E_INVAL, "%s: CSR has no indptr array", what);
	if (indptr[0] != 0)
		return nl_diag(NL_E_FORMAT, "%s: indptr[0] is %llu, expected 0; re-run nl-profile",
			       what, (unsigned long long)indptr[0]);
	nnz = indptr[csr->n_tokens];
	if (nnz && !csr->indices)
		return nl_diag(NL_E_INVAL, "%s: CSR has %llu entries but no indices array", what,
			       (unsigned long long)nnz);
	/* Offsets first, so a broken indptr is reported as such. */
	for (uint64_t t = 0; t < csr->n_tokens; t++) {
		uint64_t begin = indptr[t], end = indptr[t + 1];

		if (end < begin)
			return nl_diag(NL_E_FORMAT, "%s: indptr decreases at token %llu (%llu then "
				       "%llu), expected non-decreasing offsets; re-run nl-profile",
				       what, (unsigned long long)t, (unsigned long long)begin,
				       (unsigned long long)end);
		if (end > nnz)
			return nl_diag(NL_E_FORMAT, "%s: indptr[%llu] is %llu, beyond the %llu "
				       "indices; re-run nl-profile", what, (unsigned long long)t + 1,
				       (unsigned long long)end, (unsigned long long)nnz);
		if (end - begin > csr->n_neurons)
			return nl_diag(NL_E_FORMAT, "%s: token %llu has %llu active neurons, more than "
				       "the %u of the layer; re-run nl-profile", what,
				       (unsigned long long)t, (unsigned long long)(end - begin),
				       csr->n_neurons);
	}
	for (uint64_t t = 0; t < csr->n_tokens; t++) {
		uint64_t begin = indptr[t], end = indptr[t + 1];

		for (uint64_t i = begin; i < end; i++) {
			uint32_t id = csr->indices[i];

			if (id >= csr->n_neurons)
				return nl_diag(NL_E_FORMAT, "%s: token %llu: neuron id %u at indices[%llu] "
					       "is out of range, expected < %u; re-run nl-profile",
					       what, (unsigned long long)t, id, (unsigned long long)i,
					       csr->n_neurons);
			if (i > begin && id <= csr->indices[i - 1])
				return nl_diag(NL_E_FORMAT, "%s: token %llu: neuron ids not strictly "
					       "increasing at indices[%llu] (%u after %u); re-run "
					       "nl-profile", what, (unsigned long long)t,
					       (unsigned long long)i, id, csr->indices[i - 1]);
		}
	}
	return 0;
}

static const char *const sparsity_names[] = {
	[NL_SPARSITY_RELU] = "relu",
	[NL_SPARSITY_THRESHOLD] = "threshold",
	[NL_SPARSITY_TOPK] = "topk",
	[NL_SPARSITY_IMPORTED] = "imported",
};

const char *nl_sparsity_name(enum nl_sparsity s)
{
	if ((unsigned)s < sizeof(sparsity_names) / sizeof(sparsity_names[0]))
		return sparsity_names[s];
	return "unknown";
}

int nl_sparsity_parse(enum nl_sparsity *s, const char *name)
{
	for (unsigned i = 0; i < sizeof(sparsity_names) / sizeof(sparsity_names[0]); i++) {
		if (name && !strcmp(name, sparsity_names[i])) {
			*s = (enum nl_sparsity)i;
			return 0;
		}
	}
	return nl_diag(NL_E_INVAL, "sparsity rule '%s' unknown; expected relu, threshold, topk "
		       "or imported", name ? name : "(null)");
}

void nl_trace_meta_free(struct nl_trace_meta *meta)
{
	if (!meta)
		return;
	free(meta->density);
	free(meta->threshold);
	meta->density = NULL;
	meta->threshold = NULL;
}

void nl_coact_layer_free(struct nl_coact_layer *layer)
{
	if (!layer)
		return;
	free(layer->count);
	free(layer->pairs);
	free(layer->topk_ids);
	free(layer->topk_counts);
	memset(layer, 0, sizeof(*layer));
}

void nl_placement_layer_free(struct nl_placement_layer *layer)
{
	if (!layer)
		return;
	free(layer->perm);
	free(layer->inv);
	memset(layer, 0, sizeof(*layer));
}

int nl_placement_validate(const struct nl_placement_layer *layer, const char *what)
{
	uint32_t n = layer->n_neurons;
	uint32_t *position;
	int err = 0;

	if (!layer->perm || !layer->inv || n == 0)
		return nl_diag(NL_E_INVAL, "%s: placement has no perm/inv arrays or no neurons", what);
	position = malloc((size_t)n * sizeof(*position));
	if (!position)
		return nl_diag(-ENOMEM, "%s: out of memory", what);
	memset(position, 0xff, (size_t)n * sizeof(*position));
	for (uint32_t p = 0; p < n; p++) {
		uint32_t id = layer->perm[p];

		if (id >= n) {
			err = nl_diag(NL_E_FORMAT, "%s: perm[%u] is %u, expected a neuron id < %u; "
				      "re-run nl-place", what, p, id, n);
			goto out;
		}
		if (position[id] != UINT32_MAX) {
			err = nl_diag(NL_E_FORMAT, "%s: perm is not a permutation: neuron %u is at "
				      "positions %u and %u; re-run nl-place", what, id, position[id], p);
			goto out;
		}
		position[id] = p;
	}
	for (uint32_t id = 0; id < n; id++) {
		if (layer->inv[id] != position[id]) {
			err = nl_diag(NL_E_FORMAT, "%s: inv[%u] is %u, expected %u (inv must be the "
				      "inverse of perm); re-run nl-place", what, id, layer->inv[id],
				      position[id]);
			goto out;
		}
	}
out:
	free(position);
	return err;
}
