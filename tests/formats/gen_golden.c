/*
 * Generator of the HDF5 golden files:
 *   tests/golden/ok/hdf5/       one small valid file of each kind (must keep reading)
 *   tests/golden/reject/hdf5/   files that each break one rule of the specs,
 *                               listed with the error they must produce in MANIFEST
 *
 * Build and run (not part of the test suite; the outputs are committed):
 *   ninja -C build tests/formats/gen_golden && build/tests/formats/gen_golden tests/golden
 *
 * Every reject file starts as a valid file written by the library and is then
 * damaged in exactly one place with the raw HDF5 API (or byte edits).
 */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "golden_data.h"
#include "nl_formats.h"

static char ok_dir[512], reject_dir[512];
static FILE *manifest;

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "gen_golden: ");
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (%s)\n", nl_diag_msg());
	exit(1);
}

static void check(int err, const char *what)
{
	if (err)
		die("%s failed: %s", what, nl_strerror(err));
}

/* ---- valid base files ---- */

static void write_traces(const char *path, const char *compress)
{
	struct nl_trace_meta meta;
	struct nl_trace_writer *w;
	struct nl_h5_opts opts;
	uint32_t ids[GD_LAYERS][GD_NEURONS], n_active[GD_LAYERS];
	const uint32_t *rows[GD_LAYERS];

	check(nl_h5_opts_parse(&opts, compress), "opts");
	gd_trace_meta(&meta);
	check(nl_trace_create(&w, path, &meta, &opts), "nl_trace_create");
	for (uint64_t t = 0; t < GD_TOKENS; t++) {
		for (uint32_t l = 0; l < GD_LAYERS; l++) {
			n_active[l] = gd_token(l, t, ids[l]);
			rows[l] = ids[l];
		}
		check(nl_trace_append(w, rows, n_active, gd_sample_id(t)), "nl_trace_append");
	}
	check(nl_trace_finish(w, gd_threshold), "nl_trace_finish");
}

static void write_coact_ranked(const char *path, const char *compress, enum nl_coact_rank rank)
{
	struct nl_coact_meta meta = { .layer_first = 0, .layer_count = GD_LAYERS,
				      .n_tokens = GD_TOKENS, .has_pairs = true, .k = GD_K,
				      .rank = rank };
	struct nl_coact_writer *w;
	struct nl_h5_opts opts;

	check(nl_h5_opts_parse(&opts, compress), "opts");
	gd_model(&meta.model);
	strcpy(meta.dataset, "golden-text");
	check(nl_coact_create(&w, path, &meta, &opts), "nl_coact_create");
	for (uint32_t l = 0; l < GD_LAYERS; l++) {
		struct nl_csr csr;
		struct nl_coact_layer stats;

		if (gd_csr(l, &csr) || gd_coact_from_csr_ranked(&csr, GD_K, true, rank, &stats))
			die("out of memory");
		check(nl_coact_write_layer(w, l, &stats), "nl_coact_write_layer");
		nl_coact_layer_free(&stats);
		nl_csr_free(&csr);
	}
	check(nl_coact_finish(w), "nl_coact_finish");
}

static void write_coact(const char *path, const char *compress)
{
	write_coact_ranked(path, compress, NL_COACT_RANK_COUNT);
}

static void write_placement(const char *path, const char *compress)
{
	struct nl_placement_meta meta = { .layer_first = 0, .layer_count = GD_LAYERS };
	struct nl_placement_writer *w;
	struct nl_h5_opts opts;

	check(nl_h5_opts_parse(&opts, compress), "opts");
	gd_model(&meta.model);
	strcpy(meta.dataset, "golden-text");
	check(nl_placement_create(&w, path, &meta, &opts), "nl_placement_create");
	for (uint32_t l = 0; l < GD_LAYERS; l++) {
		struct nl_placement_layer p;

		if (gd_placement(l, &p))
			die("out of memory");
		check(nl_placement_write_layer(w, l, &p), "nl_placement_write_layer");
		nl_placement_layer_free(&p);
	}
	check(nl_placement_finish(w), "nl_placement_finish");
}

/* ---- raw HDF5 edits ---- */

static hid_t h5_open_rw(const char *path)
{
	hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);

	if (f < 0)
		die("cannot open %s", path);
	return f;
}

static void attr_replace(hid_t obj, const char *name, hid_t type, const void *value)
{
	hid_t space = H5Screate(H5S_SCALAR), attr;

	if (H5Aexists(obj, name) > 0)
		H5Adelete(obj, name);
	attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
	if (attr < 0 || H5Awrite(attr, type, value) < 0)
		die("cannot write attribute %s", name);
	H5Aclose(attr);
	H5Sclose(space);
}

/* A fixed-length string attribute, as the library writes them. */
static void attr_str(hid_t f, const char *obj_path, const char *name, const char *value)
{
	hid_t obj = H5Oopen(f, obj_path, H5P_DEFAULT), type = H5Tcopy(H5T_C_S1);

	H5Tset_size(type, strlen(value) + 1);
	H5Tset_cset(type, H5T_CSET_UTF8);
	attr_replace(obj, name, type, value);
	H5Tclose(type);
	H5Oclose(obj);
}

/* A variable-length string attribute (what h5py writes by default). */
static void attr_vlen_str(hid_t f, const char *obj_path, const char *name, const char *value)
{
	hid_t obj = H5Oopen(f, obj_path, H5P_DEFAULT), type = H5Tcopy(H5T_C_S1);

	H5Tset_size(type, H5T_VARIABLE);
	H5Tset_cset(type, H5T_CSET_UTF8);
	attr_replace(obj, name, type, &value);
	H5Tclose(type);
	H5Oclose(obj);
}

static void attr_u32(hid_t f, const char *obj_path, const char *name, uint32_t value)
{
	hid_t obj = H5Oopen(f, obj_path, H5P_DEFAULT);

	attr_replace(obj, name, H5T_STD_U32LE, &value);
	H5Oclose(obj);
}

static void attr_i32(hid_t f, const char *obj_path, const char *name, int32_t value)
{
	hid_t obj = H5Oopen(f, obj_path, H5P_DEFAULT);

	attr_replace(obj, name, H5T_STD_I32LE, &value);
	H5Oclose(obj);
}

static void attr_f64(hid_t f, const char *obj_path, const char *name, double value)
{
	hid_t obj = H5Oopen(f, obj_path, H5P_DEFAULT);

	attr_replace(obj, name, H5T_IEEE_F64LE, &value);
	H5Oclose(obj);
}

static void attr_u32_array(hid_t f, const char *obj_path, const char *name)
{
	hsize_t dims[1] = { 2 };
	uint32_t values[2] = { 2, 2 };
	hid_t obj = H5Oopen(f, obj_path, H5P_DEFAULT), space = H5Screate_simple(1, dims, NULL), attr;

	H5Adelete(obj, name);
	attr = H5Acreate2(obj, name, H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT);
	H5Awrite(attr, H5T_NATIVE_UINT32, values);
	H5Aclose(attr);
	H5Sclose(space);
	H5Oclose(obj);
}

static void attr_delete(hid_t f, const char *obj_path, const char *name)
{
	if (H5Adelete_by_name(f, obj_path, name, H5P_DEFAULT) < 0)
		die("cannot delete attribute %s of %s", name, obj_path);
}

/* A group creation property list without modification times (reproducible files). */
static hid_t untimed_group(void)
{
	static hid_t gcpl = -1;

	if (gcpl < 0) {
		gcpl = H5Pcreate(H5P_GROUP_CREATE);
		H5Pset_obj_track_times(gcpl, 0);
	}
	return gcpl;
}

static void link_delete(hid_t f, const char *path)
{
	if (H5Ldelete(f, path, H5P_DEFAULT) < 0)
		die("cannot delete %s", path);
}

/* Replaces dataset `path` by a contiguous one of file type `type`, filled with 0..n-1. */
static void dset_replace(hid_t f, const char *path, hid_t type, int rank, hsize_t d0, hsize_t d1)
{
	hsize_t dims[2] = { d0, d1 };
	size_t n = d0 * (rank == 2 ? d1 : 1);
	double *values = calloc(n ? n : 1, sizeof(double));
	hid_t space, dset, dcpl;

	for (size_t i = 0; i < n; i++)
		values[i] = (double)(i % GD_NEURONS);
	if (H5Lexists(f, path, H5P_DEFAULT) > 0)
		link_delete(f, path);
	space = H5Screate_simple(rank, dims, NULL);
	dcpl = H5Pcreate(H5P_DATASET_CREATE);
	H5Pset_obj_track_times(dcpl, 0);
	dset = H5Dcreate2(f, path, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
	H5Pclose(dcpl);
	if (dset < 0 || (n && H5Dwrite(dset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT,
				       values) < 0))
		die("cannot replace %s", path);
	H5Dclose(dset);
	H5Sclose(space);
	free(values);
}

/* Reads a whole dataset as u64, lets `edit` change it, writes it back. */
static void dset_edit(hid_t f, const char *path, void (*edit)(uint64_t *v, size_t n))
{
	hid_t dset = H5Dopen2(f, path, H5P_DEFAULT), space = H5Dget_space(dset);
	size_t n = (size_t)H5Sget_simple_extent_npoints(space);
	uint64_t *v = calloc(n ? n : 1, sizeof(uint64_t));

	if (dset < 0 || H5Dread(dset, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0)
		die("cannot read %s", path);
	edit(v, n);
	if (H5Dwrite(dset, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0)
		die("cannot write %s", path);
	free(v);
	H5Sclose(space);
	H5Dclose(dset);
}

static void edit_first_is_1(uint64_t *v, size_t n) { (void)n; v[0] = 1; }
static void edit_first_out_of_range(uint64_t *v, size_t n) { (void)n; v[0] = GD_NEURONS; }
static void edit_first_self(uint64_t *v, size_t n) { (void)n; v[0] = 0; }
static void edit_swap_01(uint64_t *v, size_t n) { uint64_t t = v[0]; (void)n; v[0] = v[1]; v[1] = t; }
static void edit_dup_01(uint64_t *v, size_t n) { (void)n; v[1] = v[0]; }
static void edit_last_minus_1(uint64_t *v, size_t n) { v[n - 1] -= 1; }
static void edit_first_plus_tokens(uint64_t *v, size_t n) { (void)n; v[0] = GD_TOKENS + 1; }
static void edit_first_minus_1(uint64_t *v, size_t n) { (void)n; v[0] -= 1; }
static void edit_slot3_unused(uint64_t *v, size_t n) { (void)n; v[3] = UINT32_MAX; }
/* indptr: make entry 10 larger than entry 11, keeping it within nnz */
static void edit_decrease(uint64_t *v, size_t n) { (void)n; v[10] = v[11] + 1; }

/* ---- byte edits ---- */

static void truncate_half(const char *path)
{
	struct stat st;

	if (stat(path, &st) || truncate(path, st.st_size / 2))
		die("cannot truncate %s", path);
}

/* Flips one byte in the middle of the first stored chunk of dataset `dset_path`. */
static void corrupt_chunk(const char *path, const char *dset_path)
{
	hsize_t offset[1] = { 0 }, size;
	haddr_t addr;
	unsigned mask;
	hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), dset, space;
	unsigned char byte;
	int fd;

	dset = H5Dopen2(f, dset_path, H5P_DEFAULT);
	space = H5Dget_space(dset);
	if (H5Dget_chunk_info(dset, space, 0, offset, &mask, &addr, &size) < 0)
		die("no chunk info for %s", dset_path);
	H5Sclose(space);
	H5Dclose(dset);
	H5Fclose(f);
	fd = open(path, O_RDWR);
	if (fd < 0 || pread(fd, &byte, 1, (off_t)(addr + size / 2)) != 1)
		die("cannot read chunk byte");
	byte ^= 0x5a;
	if (pwrite(fd, &byte, 1, (off_t)(addr + size / 2)) != 1)
		die("cannot write chunk byte");
	close(fd);
}

/* ---- the corpus ---- */

enum kind { TRACES, COACT, PLACEMENT, COACT_NORM };
static const char *const kind_name[] = { "traces", "coact", "placement", "coact" };

/* Writes a fresh valid base file of `kind` as reject/<name> and returns its path. */
static const char *base(enum kind kind, const char *name)
{
	static char path[1024];

	snprintf(path, sizeof(path), "%s/%s", reject_dir, name);
	switch (kind) {
	case TRACES: write_traces(path, "none"); break;
	case COACT: write_coact(path, "none"); break;
	case PLACEMENT: write_placement(path, "none"); break;
	case COACT_NORM: write_coact_ranked(path, "none", NL_COACT_RANK_NORM); break;
	}
	return path;
}

static void listed(enum kind kind, const char *name, const char *code, const char *rule)
{
	fprintf(manifest, "%-32s %-10s %-15s # %s\n", name, kind_name[kind], code, rule);
}

#define EDIT(kind, name, code, rule, body)                      \
	do {                                                    \
		hid_t f = h5_open_rw(base(kind, name));         \
		body;                                           \
		H5Fclose(f);                                    \
		listed(kind, name, code, rule);                 \
	} while (0)

static void gen_common(enum kind k, const char *p)
{
	char name[64], path[1024];
	const char *other = k == TRACES ? "neuralink-coact" : "neuralink-traces";
	FILE *f;

	snprintf(name, sizeof(name), "%s_not_hdf5.h5", p);
	snprintf(path, sizeof(path), "%s/%s", reject_dir, name);
	f = fopen(path, "w");
	if (!f)
		die("cannot write %s", path);
	fputs("this is not an HDF5 file, it only has the extension\n", f);
	fclose(f);
	listed(k, name, "NL_E_MAGIC", "not an HDF5 file");

	snprintf(name, sizeof(name), "%s_truncated.h5", p);
	truncate_half(base(k, name));
	listed(k, name, "NL_E_TRUNCATED", "file cut to half its length");

	snprintf(name, sizeof(name), "%s_format_name.h5", p);
	EDIT(k, name, "NL_E_MAGIC", "root 'format' names another kind", attr_str(f, "/", "format", other));
	snprintf(name, sizeof(name), "%s_no_format.h5", p);
	EDIT(k, name, "NL_E_MAGIC", "root 'format' absent", attr_delete(f, "/", "format"));
	snprintf(name, sizeof(name), "%s_major_newer.h5", p);
	EDIT(k, name, "NL_E_VERSION", "version_major 2", attr_u32(f, "/", "version_major", 2));
	snprintf(name, sizeof(name), "%s_major_zero.h5", p);
	EDIT(k, name, "NL_E_VERSION", "version_major 0", attr_u32(f, "/", "version_major", 0));
	snprintf(name, sizeof(name), "%s_no_version_minor.h5", p);
	EDIT(k, name, "NL_E_MISSING", "version_minor absent", attr_delete(f, "/", "version_minor"));
	snprintf(name, sizeof(name), "%s_n_layers_zero.h5", p);
	EDIT(k, name, "NL_E_FORMAT", "n_layers 0", attr_u32(f, "/", "n_layers", 0));
	snprintf(name, sizeof(name), "%s_n_neurons_zero.h5", p);
	EDIT(k, name, "NL_E_FORMAT", "n_neurons 0", attr_u32(f, "/", "n_neurons", 0));
	snprintf(name, sizeof(name), "%s_d_model_zero.h5", p);
	EDIT(k, name, "NL_E_FORMAT", "d_model 0", attr_u32(f, "/", "d_model", 0));
	snprintf(name, sizeof(name), "%s_n_layers_signed.h5", p);
	EDIT(k, name, "NL_E_TYPE", "n_layers stored as int32", attr_i32(f, "/", "n_layers", 2));
	snprintf(name, sizeof(name), "%s_n_neurons_array.h5", p);
	EDIT(k, name, "NL_E_SHAPE", "n_neurons not a scalar", attr_u32_array(f, "/", "n_neurons"));
	snprintf(name, sizeof(name), "%s_model_name_float.h5", p);
	EDIT(k, name, "NL_E_TYPE", "model_name stored as a float",
	     attr_f64(f, "/", "model_name", 1.0));
	snprintf(name, sizeof(name), "%s_model_name_long.h5", p);
	EDIT(k, name, "NL_E_FORMAT", "model_name longer than 127 bytes",
	     attr_str(f, "/", "model_name",
		      "a-model-name-that-is-far-too-long-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
		      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"));
	snprintf(name, sizeof(name), "%s_no_dataset.h5", p);
	EDIT(k, name, "NL_E_MISSING", "root 'dataset' absent", attr_delete(f, "/", "dataset"));
	snprintf(name, sizeof(name), "%s_missing_group.h5", p);
	EDIT(k, name, "NL_E_MISSING", "group layer_001 absent", link_delete(f, "layer_001"));
}

static void gen_traces(void)
{
	char path[1024];

	gen_common(TRACES, "t");
	EDIT(TRACES, "t_no_n_tokens.h5", "NL_E_MISSING", "root n_tokens absent",
	     attr_delete(f, "/", "n_tokens"));
	EDIT(TRACES, "t_n_tokens_float.h5", "NL_E_TYPE", "root n_tokens stored as a float",
	     attr_f64(f, "/", "n_tokens", GD_TOKENS));
	EDIT(TRACES, "t_dataset_vlen.h5", "NL_E_TYPE", "dataset stored as a variable-length string",
	     attr_vlen_str(f, "/", "dataset", "golden-text"));
	EDIT(TRACES, "t_sparsity_unknown.h5", "NL_E_FORMAT", "sparsity 'gelu'",
	     attr_str(f, "/", "sparsity", "gelu"));
	EDIT(TRACES, "t_target_density.h5", "NL_E_FORMAT", "target_density 1.5",
	     attr_f64(f, "/", "target_density", 1.5));
	EDIT(TRACES, "t_layer_is_dataset.h5", "NL_E_TYPE", "layer_001 is a dataset, not a group",
	     (link_delete(f, "layer_001"), dset_replace(f, "layer_001", H5T_STD_U32LE, 1, 4, 0)));
	EDIT(TRACES, "t_missing_indptr.h5", "NL_E_MISSING", "layer_000/indptr absent",
	     link_delete(f, "layer_000/indptr"));
	EDIT(TRACES, "t_missing_indices.h5", "NL_E_MISSING", "layer_001/indices absent",
	     link_delete(f, "layer_001/indices"));
	EDIT(TRACES, "t_indices_is_group.h5", "NL_E_TYPE", "layer_000/indices is a group",
	     (link_delete(f, "layer_000/indices"),
	      H5Gclose(H5Gcreate2(f, "layer_000/indices", H5P_DEFAULT, untimed_group(), H5P_DEFAULT))));
	EDIT(TRACES, "t_indptr_length.h5", "NL_E_SHAPE", "indptr has n_tokens+2 entries",
	     dset_replace(f, "layer_000/indptr", H5T_STD_U64LE, 1, GD_TOKENS + 2, 0));
	EDIT(TRACES, "t_indptr_rank2.h5", "NL_E_SHAPE", "indptr is 2-D",
	     dset_replace(f, "layer_000/indptr", H5T_STD_U64LE, 2, GD_TOKENS + 1, 1));
	EDIT(TRACES, "t_indptr_u32.h5", "NL_E_TYPE", "indptr stored as uint32",
	     dset_replace(f, "layer_000/indptr", H5T_STD_U32LE, 1, GD_TOKENS + 1, 0));
	EDIT(TRACES, "t_indices_i64.h5", "NL_E_TYPE", "indices stored as int64",
	     dset_replace(f, "layer_001/indices", H5T_STD_I64LE, 1, 10, 0));
	EDIT(TRACES, "t_indices_float.h5", "NL_E_TYPE", "indices stored as float32",
	     dset_replace(f, "layer_001/indices", H5T_IEEE_F32LE, 1, 10, 0));
	EDIT(TRACES, "t_indices_too_many.h5", "NL_E_SHAPE",
	     "indices longer than n_tokens x n_neurons",
	     dset_replace(f, "layer_001/indices", H5T_STD_U32LE, 1, GD_TOKENS * GD_NEURONS + 1, 0));
	EDIT(TRACES, "t_indptr_start.h5", "NL_E_FORMAT", "indptr[0] is 1",
	     dset_edit(f, "layer_000/indptr", edit_first_is_1));
	EDIT(TRACES, "t_indptr_decreasing.h5", "NL_E_FORMAT", "indptr decreases",
	     dset_edit(f, "layer_001/indptr", edit_decrease));
	EDIT(TRACES, "t_indptr_end.h5", "NL_E_FORMAT", "indptr[n_tokens] != len(indices)",
	     dset_edit(f, "layer_000/indptr", edit_last_minus_1));
	EDIT(TRACES, "t_indices_range.h5", "NL_E_FORMAT", "neuron id >= n_neurons",
	     dset_edit(f, "layer_000/indices", edit_first_out_of_range));
	EDIT(TRACES, "t_indices_unsorted.h5", "NL_E_FORMAT", "ids of a token not increasing",
	     dset_edit(f, "layer_000/indices", edit_swap_01));
	EDIT(TRACES, "t_indices_duplicate.h5", "NL_E_FORMAT", "an id repeated within a token",
	     dset_edit(f, "layer_000/indices", edit_dup_01));
	EDIT(TRACES, "t_density_missing.h5", "NL_E_MISSING", "layer density absent",
	     attr_delete(f, "layer_001", "density"));
	EDIT(TRACES, "t_density_wrong.h5", "NL_E_FORMAT", "density != nnz/(n_tokens*n_neurons)",
	     attr_f64(f, "layer_001", "density", 0.9));
	EDIT(TRACES, "t_threshold_missing.h5", "NL_E_MISSING",
	     "threshold rule without layer threshold", attr_delete(f, "layer_000", "threshold"));
	EDIT(TRACES, "t_threshold_negative.h5", "NL_E_FORMAT", "threshold -1",
	     attr_f64(f, "layer_000", "threshold", -1.0));
	EDIT(TRACES, "t_sample_id_length.h5", "NL_E_SHAPE", "sample_id length != n_tokens",
	     dset_replace(f, "sample_id", H5T_STD_U32LE, 1, GD_TOKENS - 1, 0));
	EDIT(TRACES, "t_sample_id_i32.h5", "NL_E_TYPE", "sample_id stored as int32",
	     dset_replace(f, "sample_id", H5T_STD_I32LE, 1, GD_TOKENS, 0));

	snprintf(path, sizeof(path), "%s/t_corrupt_chunk.h5", reject_dir);
	write_traces(path, "zstd");
	corrupt_chunk(path, "layer_000/indices");
	listed(TRACES, "t_corrupt_chunk.h5", "NL_E_COMPRESS",
	       "one byte flipped inside a zstd chunk (frame checksum)");
}

static void gen_coact(void)
{
	gen_common(COACT, "c");
	EDIT(COACT, "c_layer_range.h5", "NL_E_FORMAT", "layer_count beyond n_layers",
	     attr_u32(f, "/", "layer_count", GD_LAYERS + 1));
	EDIT(COACT, "c_has_pairs_2.h5", "NL_E_FORMAT", "has_pairs is 2",
	     attr_u32(f, "/", "has_pairs", 2));
	EDIT(COACT, "c_k_too_big.h5", "NL_E_FORMAT", "k > n_neurons",
	     attr_u32(f, "/", "k", GD_NEURONS + 1));
	EDIT(COACT, "c_no_k.h5", "NL_E_MISSING", "root k absent", attr_delete(f, "/", "k"));
	EDIT(COACT, "c_missing_count.h5", "NL_E_MISSING", "layer_000/count absent",
	     link_delete(f, "layer_000/count"));
	EDIT(COACT, "c_missing_pairs.h5", "NL_E_MISSING", "has_pairs but layer_001/pairs absent",
	     link_delete(f, "layer_001/pairs"));
	EDIT(COACT, "c_missing_topk_ids.h5", "NL_E_MISSING", "k > 0 but topk_ids absent",
	     link_delete(f, "layer_000/topk_ids"));
	EDIT(COACT, "c_missing_topk_counts.h5", "NL_E_MISSING", "k > 0 but topk_counts absent",
	     link_delete(f, "layer_001/topk_counts"));
	EDIT(COACT, "c_count_length.h5", "NL_E_SHAPE", "count has n-1 entries",
	     dset_replace(f, "layer_000/count", H5T_STD_U64LE, 1, GD_NEURONS - 1, 0));
	EDIT(COACT, "c_pairs_length.h5", "NL_E_SHAPE", "pairs has n(n-1)/2-1 entries",
	     dset_replace(f, "layer_000/pairs", H5T_STD_U32LE, 1, nl_tri_size(GD_NEURONS) - 1, 0));
	EDIT(COACT, "c_topk_width.h5", "NL_E_SHAPE", "topk_ids is [n, k-1]",
	     dset_replace(f, "layer_000/topk_ids", H5T_STD_U32LE, 2, GD_NEURONS, GD_K - 1));
	EDIT(COACT, "c_count_u32.h5", "NL_E_TYPE", "count stored as uint32",
	     dset_replace(f, "layer_000/count", H5T_STD_U32LE, 1, GD_NEURONS, 0));
	EDIT(COACT, "c_pairs_i32.h5", "NL_E_TYPE", "pairs stored as int32",
	     dset_replace(f, "layer_000/pairs", H5T_STD_I32LE, 1, nl_tri_size(GD_NEURONS), 0));
	EDIT(COACT, "c_topk_counts_f64.h5", "NL_E_TYPE", "topk_counts stored as float64",
	     dset_replace(f, "layer_000/topk_counts", H5T_IEEE_F64LE, 2, GD_NEURONS, GD_K));
	EDIT(COACT, "c_layer_no_n_tokens.h5", "NL_E_MISSING", "layer n_tokens absent",
	     attr_delete(f, "layer_001", "n_tokens"));
	EDIT(COACT, "c_layer_n_tokens.h5", "NL_E_FORMAT", "layer n_tokens != root n_tokens",
	     attr_u32(f, "layer_001", "n_tokens", GD_TOKENS - 1));
	EDIT(COACT, "c_count_gt_tokens.h5", "NL_E_FORMAT", "count[0] > n_tokens",
	     dset_edit(f, "layer_000/count", edit_first_plus_tokens));
	EDIT(COACT, "c_pair_gt_count.h5", "NL_E_FORMAT", "f(0,1) > min(f(0), f(1))",
	     dset_edit(f, "layer_001/pairs", edit_first_plus_tokens));
	EDIT(COACT, "c_topk_id_range.h5", "NL_E_FORMAT", "top-K id >= n_neurons",
	     dset_edit(f, "layer_000/topk_ids", edit_first_out_of_range));
	EDIT(COACT, "c_topk_self.h5", "NL_E_FORMAT", "row 0 lists neuron 0 itself",
	     dset_edit(f, "layer_000/topk_ids", edit_first_self));
	EDIT(COACT, "c_topk_order.h5", "NL_E_FORMAT", "top-K row not in count-desc/id-asc order",
	     (dset_edit(f, "layer_000/topk_ids", edit_swap_01),
	      dset_edit(f, "layer_000/topk_counts", edit_swap_01)));
	EDIT(COACT_NORM, "c_topk_order_norm.h5", "NL_E_FORMAT",
	     "norm-ranked top-K row with slots 0 and 1 swapped",
	     (dset_edit(f, "layer_000/topk_ids", edit_swap_01),
	      dset_edit(f, "layer_000/topk_counts", edit_swap_01)));
	EDIT(COACT_NORM, "c_topk_rank_mismatch.h5", "NL_E_FORMAT",
	     "norm-ranked lists declared topk_rank count",
	     attr_str(f, "/", "topk_rank", "count"));
	EDIT(COACT_NORM, "c_topk_rank_bad.h5", "NL_E_FORMAT", "topk_rank is 'pagerank'",
	     attr_str(f, "/", "topk_rank", "pagerank"));
	EDIT(COACT_NORM, "c_no_topk_rank.h5", "NL_E_MISSING", "1.1 file without topk_rank",
	     attr_delete(f, "/", "topk_rank"));
	EDIT(COACT, "c_topk_unused_count.h5", "NL_E_FORMAT", "unused slot with a non-zero count",
	     dset_edit(f, "layer_000/topk_ids", edit_slot3_unused));
	EDIT(COACT, "c_topk_count_gt.h5", "NL_E_FORMAT", "top-K count > f(i)",
	     dset_edit(f, "layer_000/topk_counts", edit_first_plus_tokens));
	EDIT(COACT, "c_topk_count_pairs.h5", "NL_E_FORMAT", "top-K count differs from pairs",
	     dset_edit(f, "layer_001/topk_counts", edit_first_minus_1));
}

static void gen_placement(void)
{
	gen_common(PLACEMENT, "p");
	EDIT(PLACEMENT, "p_layer_range.h5", "NL_E_FORMAT", "layer_first beyond n_layers",
	     attr_u32(f, "/", "layer_first", GD_LAYERS));
	EDIT(PLACEMENT, "p_missing_perm.h5", "NL_E_MISSING", "layer_000/perm absent",
	     link_delete(f, "layer_000/perm"));
	EDIT(PLACEMENT, "p_missing_inv.h5", "NL_E_MISSING", "layer_001/inv absent",
	     link_delete(f, "layer_001/inv"));
	EDIT(PLACEMENT, "p_perm_length.h5", "NL_E_SHAPE", "perm has n+1 entries",
	     dset_replace(f, "layer_000/perm", H5T_STD_U32LE, 1, GD_NEURONS + 1, 0));
	EDIT(PLACEMENT, "p_inv_rank2.h5", "NL_E_SHAPE", "inv is 2-D",
	     dset_replace(f, "layer_000/inv", H5T_STD_U32LE, 2, GD_NEURONS, 1));
	EDIT(PLACEMENT, "p_perm_u64.h5", "NL_E_TYPE", "perm stored as uint64",
	     dset_replace(f, "layer_000/perm", H5T_STD_U64LE, 1, GD_NEURONS, 0));
	EDIT(PLACEMENT, "p_perm_range.h5", "NL_E_FORMAT", "perm entry >= n_neurons",
	     dset_edit(f, "layer_001/perm", edit_first_out_of_range));
	EDIT(PLACEMENT, "p_not_permutation.h5", "NL_E_FORMAT", "perm repeats a neuron",
	     dset_edit(f, "layer_000/perm", edit_dup_01));
	EDIT(PLACEMENT, "p_inv_not_inverse.h5", "NL_E_FORMAT", "inv is not the inverse of perm",
	     dset_edit(f, "layer_001/inv", edit_swap_01));
	EDIT(PLACEMENT, "p_no_algo.h5", "NL_E_MISSING", "algo absent",
	     attr_delete(f, "layer_000", "algo"));
	EDIT(PLACEMENT, "p_algo_empty.h5", "NL_E_FORMAT", "algo is empty",
	     attr_str(f, "layer_000", "algo", ""));
	EDIT(PLACEMENT, "p_algo_long.h5", "NL_E_FORMAT", "algo longer than 31 bytes",
	     attr_str(f, "layer_001", "algo", "greedy-with-a-name-that-is-too-long"));
	EDIT(PLACEMENT, "p_no_params.h5", "NL_E_MISSING", "params absent",
	     attr_delete(f, "layer_001", "params"));
	EDIT(PLACEMENT, "p_objective_string.h5", "NL_E_TYPE", "objective stored as a string",
	     attr_str(f, "layer_000", "objective", "1.25"));
	EDIT(PLACEMENT, "p_no_objective.h5", "NL_E_MISSING", "objective absent",
	     attr_delete(f, "layer_001", "objective"));
}

int main(int argc, char **argv)
{
	char path[1024], manifest_path[1024];

	if (argc != 2) {
		fprintf(stderr, "usage: gen_golden GOLDEN_DIR   (e.g. tests/golden)\n");
		return 2;
	}
	snprintf(ok_dir, sizeof(ok_dir), "%s/ok/hdf5", argv[1]);
	snprintf(reject_dir, sizeof(reject_dir), "%s/reject/hdf5", argv[1]);
	mkdir(ok_dir, 0755);
	mkdir(reject_dir, 0755);
	H5Eset_auto2(H5E_DEFAULT, NULL, NULL);

	/* ok: one file per kind, each with another codec */
	snprintf(path, sizeof(path), "%s/traces_v1.h5", ok_dir);
	write_traces(path, "zstd");
	snprintf(path, sizeof(path), "%s/coact_v1.h5", ok_dir);
	write_coact(path, "deflate");
	snprintf(path, sizeof(path), "%s/placement_v1.h5", ok_dir);
	write_placement(path, "none");
	/* a newer minor version with unknown extra objects must still read */
	snprintf(path, sizeof(path), "%s/traces_v1.9_extra.h5", ok_dir);
	write_traces(path, "deflate");
	{
		hid_t f = h5_open_rw(path);

		attr_u32(f, "/", "version_minor", 9);
		attr_str(f, "/", "future_attribute", "ignored by 1.0 readers");
		attr_f64(f, "layer_000", "future_layer_attribute", 3.5);
		dset_replace(f, "future_dataset", H5T_STD_U32LE, 1, 3, 0);
		H5Fclose(f);
	}

	snprintf(manifest_path, sizeof(manifest_path), "%s/MANIFEST", reject_dir);
	manifest = fopen(manifest_path, "w");
	if (!manifest)
		die("cannot write %s", manifest_path);
	fprintf(manifest, "# HDF5 reject corpus: each file breaks one rule of docs/formats/"
		"{traces,coact,placement}.md\n"
		"# and must fail with the error code given. Generated by tests/formats/gen_golden.c;\n"
		"# replayed by tests/formats/test_formats.c (golden::reject_manifest).\n"
		"# file                           kind       error           # rule broken\n");
	gen_traces();
	gen_coact();
	gen_placement();
	fclose(manifest);
	printf("wrote %s and %s\n", ok_dir, manifest_path);
	return 0;
}
