/*
 * Tests of the HDF5 formats: exact round trips of traces, co-activation
 * statistics and placements under every compression, writer argument
 * checks, the committed golden files (format stability) and the reject
 * corpus (tests/golden/reject/hdf5/MANIFEST).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "golden_data.h"
#include "nl_formats.h"

static char tmp_dir[64];

static void make_tmp_dir(void)
{
	strcpy(tmp_dir, "/tmp/nl-formats-XXXXXX");
	cr_assert_not_null(mkdtemp(tmp_dir));
}

static void remove_tmp_dir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_dir);
	cr_assert_eq(system(cmd), 0);
}

static void tmp_file(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/%s", tmp_dir, name);
}

static bool file_exists(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0;
}

static const char *source_root(void)
{
	const char *root = getenv("NL_SOURCE_ROOT");

	return root ? root : ".";
}

TestSuite(h5, .init = make_tmp_dir, .fini = remove_tmp_dir);
TestSuite(traces, .init = make_tmp_dir, .fini = remove_tmp_dir);
TestSuite(coact, .init = make_tmp_dir, .fini = remove_tmp_dir);
TestSuite(placement, .init = make_tmp_dir, .fini = remove_tmp_dir);
TestSuite(golden, .init = make_tmp_dir, .fini = remove_tmp_dir);

/* ---- shared helpers ---- */

Test(h5, opts_parse)
{
	struct nl_h5_opts o;

	cr_assert_eq(nl_h5_opts_parse(&o, "zstd"), 0);
	cr_assert_eq(o.compress, NL_COMPRESS_ZSTD);
	cr_assert_eq(o.level, 0);
	cr_assert_eq(nl_h5_opts_parse(&o, "zstd:19"), 0);
	cr_assert_eq(o.level, 19);
	cr_assert_eq(nl_h5_opts_parse(&o, "deflate"), 0);
	cr_assert_eq(o.compress, NL_COMPRESS_DEFLATE);
	cr_assert_eq(nl_h5_opts_parse(&o, "deflate:6"), 0);
	cr_assert_eq(o.level, 6);
	cr_assert_eq(nl_h5_opts_parse(&o, "none"), 0);
	cr_assert_eq(o.compress, NL_COMPRESS_NONE);
	cr_assert_eq(nl_h5_opts_parse(&o, "none:3"), NL_E_INVAL);
	cr_assert_eq(nl_h5_opts_parse(&o, "zstd:99"), NL_E_INVAL);
	cr_assert_eq(nl_h5_opts_parse(&o, "zstd:"), NL_E_INVAL);
	cr_assert_eq(nl_h5_opts_parse(&o, "zstd:x"), NL_E_INVAL);
	cr_assert_eq(nl_h5_opts_parse(&o, "deflate:10"), NL_E_INVAL);
	cr_assert_eq(nl_h5_opts_parse(&o, "lz4"), NL_E_INVAL);
	cr_assert(strstr(nl_diag_msg(), "lz4"));
	cr_assert_eq(nl_h5_opts_parse(&o, "zstdx"), NL_E_INVAL);
}

Test(h5, sparsity_names)
{
	enum nl_sparsity s;

	for (int i = NL_SPARSITY_RELU; i <= NL_SPARSITY_IMPORTED; i++) {
		cr_assert_eq(nl_sparsity_parse(&s, nl_sparsity_name(i)), 0);
		cr_assert_eq((int)s, i);
	}
	cr_assert_str_eq(nl_sparsity_name(NL_SPARSITY_THRESHOLD), "threshold");
	cr_assert_eq(nl_sparsity_parse(&s, "gelu"), NL_E_INVAL);
}

Test(h5, tmp_path)
{
	char buf[16];

	cr_assert_eq(nl_tmp_path(buf, sizeof(buf), "a/b.h5"), 0);
	cr_assert_str_eq(buf, "a/b.h5.tmp");
	cr_assert_eq(nl_tmp_path(buf, sizeof(buf), "a-very-long-name.h5"), -ENAMETOOLONG);
}

Test(h5, csr_validate)
{
	uint64_t indptr[4] = { 0, 2, 2, 5 };
	uint32_t indices[5] = { 1, 3, 0, 2, 9 };
	struct nl_csr csr = { .n_tokens = 3, .n_neurons = 10, .indptr = indptr, .indices = indices };

	cr_assert_eq(nl_csr_validate(&csr, "x"), 0);
	indices[4] = 10;
	cr_assert_eq(nl_csr_validate(&csr, "x"), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "out of range"));
	indices[4] = 2;
	cr_assert_eq(nl_csr_validate(&csr, "x"), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "strictly"));
	indices[4] = 9;
	indptr[0] = 1;
	cr_assert_eq(nl_csr_validate(&csr, "x"), NL_E_FORMAT);
	indptr[0] = 0;
	indptr[2] = 1;
	cr_assert_eq(nl_csr_validate(&csr, "x"), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "decreases"));
}

Test(h5, placement_validate)
{
	uint32_t perm[4] = { 2, 0, 3, 1 }, inv[4] = { 1, 3, 0, 2 };
	struct nl_placement_layer p = { .n_neurons = 4, .perm = perm, .inv = inv };

	cr_assert_eq(nl_placement_validate(&p, "p"), 0);
	inv[0] = 2;
	cr_assert_eq(nl_placement_validate(&p, "p"), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "inverse"));
	inv[0] = 1;
	perm[3] = 2;
	cr_assert_eq(nl_placement_validate(&p, "p"), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "permutation"));
	perm[3] = 4;
	cr_assert_eq(nl_placement_validate(&p, "p"), NL_E_FORMAT);
}

/* The filter pipeline of a written dataset names the registered zstd filter. */
Test(h5, zstd_filter_on_disk)
{
	struct nl_placement_meta meta = { .layer_first = 0, .layer_count = 2 };
	struct nl_h5_opts opts = { NL_COMPRESS_ZSTD, 7 };
	struct nl_placement_writer *w;
	struct nl_placement_layer p;
	char path[128], name[64];
	unsigned int flags, cd[4], filter_config;
	size_t n_cd = 4;
	hid_t file, dset, dcpl;
	int found = 0;

	tmp_file(path, sizeof(path), "zstd.h5");
	gd_model(&meta.model);
	strcpy(meta.dataset, "d");
	cr_assert_eq(nl_placement_create(&w, path, &meta, &opts), 0, "%s", nl_diag_msg());
	for (uint32_t l = 0; l < 2; l++) {
		cr_assert_eq(gd_placement(l, &p), 0);
		cr_assert_eq(nl_placement_write_layer(w, l, &p), 0, "%s", nl_diag_msg());
		nl_placement_layer_free(&p);
	}
	cr_assert_eq(nl_placement_finish(w), 0, "%s", nl_diag_msg());
	file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
	cr_assert_geq(file, 0);
	dset = H5Dopen2(file, "layer_001/perm", H5P_DEFAULT);
	dcpl = H5Dget_create_plist(dset);
	for (int i = 0; i < H5Pget_nfilters(dcpl); i++) {
		H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &n_cd, cd, sizeof(name),
						 name, &filter_config);

		if (id == 32015) {
			found = 1;
			cr_assert_eq(n_cd, 1);
			cr_assert_eq(cd[0], 7);
		}
	}
	cr_assert(found, "dataset is not compressed with filter 32015");
	H5Pclose(dcpl);
	H5Dclose(dset);
	H5Fclose(file);
}

/*
 * Chunks compressed the way hdf5plugin's zstd filter writes them (a plain
 * ZSTD_compress frame, no checksum, no shuffle) read through our filter.
 */
Test(h5, reads_hdf5plugin_style_chunks)
{
	struct nl_placement_meta meta = { .layer_first = 0, .layer_count = 2 };
	struct nl_placement_writer *w;
	struct nl_placement_reader *r;
	struct nl_placement_layer p, back;
	char path[128];
	unsigned char frame[1024];
	unsigned int level = 5;
	hsize_t dims[1] = { GD_NEURONS }, offset[1] = { 0 };
	hid_t file, space, dcpl, dset;
	size_t frame_size;

	tmp_file(path, sizeof(path), "plugin.h5");
	gd_model(&meta.model);
	strcpy(meta.dataset, "d");
	cr_assert_eq(nl_placement_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
	for (uint32_t l = 0; l < 2; l++) {
		cr_assert_eq(gd_placement(l, &p), 0);
		cr_assert_eq(nl_placement_write_layer(w, l, &p), 0, "%s", nl_diag_msg());
		nl_placement_layer_free(&p);
	}
	cr_assert_eq(nl_placement_finish(w), 0, "%s", nl_diag_msg());

	/* replace layer_001/perm by a dataset written chunk by chunk, hdf5plugin style */
	cr_assert_eq(gd_placement(1, &p), 0);
	frame_size = ZSTD_compress(frame, sizeof(frame), p.perm, GD_NEURONS * sizeof(uint32_t), 5);
	cr_assert(!ZSTD_isError(frame_size));
	file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
	cr_assert_geq(file, 0);
	cr_assert_geq(H5Ldelete(file, "layer_001/perm", H5P_DEFAULT), 0);
	space = H5Screate_simple(1, dims, NULL);
	dcpl = H5Pcreate(H5P_DATASET_CREATE);
	cr_assert_geq(H5Pset_chunk(dcpl, 1, dims), 0);
	cr_assert_geq(H5Pset_filter(dcpl, 32015, H5Z_FLAG_MANDATORY, 1, &level), 0);
	dset = H5Dcreate2(file, "layer_001/perm", H5T_STD_U32LE, space, H5P_DEFAULT, dcpl,
			  H5P_DEFAULT);
	cr_assert_geq(dset, 0);
	cr_assert_geq(H5Dwrite_chunk(dset, H5P_DEFAULT, 0, offset, frame_size, frame), 0);
	H5Dclose(dset);
	H5Pclose(dcpl);
	H5Sclose(space);
	H5Fclose(file);

	cr_assert_eq(nl_placement_open(&r, path), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_placement_read_layer(r, 1, &back), 0, "%s", nl_diag_msg());
	cr_assert_arr_eq(back.perm, p.perm, GD_NEURONS * sizeof(uint32_t));
	nl_placement_layer_free(&back);
	nl_placement_layer_free(&p);
	nl_placement_close(r);
}

/* ---- traces ---- */

struct trace_case {
	uint32_t n_layers, n_neurons;
	uint64_t n_tokens;
	uint32_t max_active;     /* per token and layer */
	uint64_t seed;
};

/* Builds a random trace in memory: one CSR per layer. Every 5th token is empty in layer 0. */
static struct nl_csr *make_trace(const struct trace_case *tc)
{
	struct nl_csr *csr = calloc(tc->n_layers, sizeof(*csr));
	uint64_t state = tc->seed;
	uint8_t *mark = calloc(tc->n_neurons, 1);

	cr_assert_not_null(csr);
	cr_assert_not_null(mark);
	for (uint32_t l = 0; l < tc->n_layers; l++) {
		uint64_t cap = tc->n_tokens * tc->max_active + 1, nnz = 0;

		csr[l].n_tokens = tc->n_tokens;
		csr[l].n_neurons = tc->n_neurons;
		csr[l].indptr = calloc(tc->n_tokens + 1, sizeof(uint64_t));
		csr[l].indices = malloc(cap * sizeof(uint32_t));
		cr_assert(csr[l].indptr && csr[l].indices);
		for (uint64_t t = 0; t < tc->n_tokens; t++) {
			uint32_t want = (uint32_t)(gd_next(&state) % (tc->max_active + 1));

			if (l == 0 && t % 5 == 0)
				want = 0;
			memset(mark, 0, tc->n_neurons);
			for (uint32_t i = 0; i < want; i++)
				mark[gd_next(&state) % tc->n_neurons] = 1;
			for (uint32_t i = 0; i < tc->n_neurons; i++)
				if (mark[i])
					csr[l].indices[nnz++] = i;
			csr[l].indptr[t + 1] = nnz;
		}
	}
	free(mark);
	return csr;
}

static void free_trace(struct nl_csr *csr, uint32_t n_layers)
{
	for (uint32_t l = 0; l < n_layers; l++)
		nl_csr_free(&csr[l]);
	free(csr);
}

static void assert_csr_equal(const struct nl_csr *a, const struct nl_csr *b, uint32_t layer)
{
	cr_assert_eq(a->n_tokens, b->n_tokens, "layer %u tokens", layer);
	cr_assert_eq(a->n_neurons, b->n_neurons);
	cr_assert_arr_eq(a->indptr, b->indptr, (a->n_tokens + 1) * sizeof(uint64_t),
			 "layer %u indptr", layer);
	cr_assert_arr_eq(a->indices, b->indices, a->indptr[a->n_tokens] * sizeof(uint32_t),
			 "layer %u indices", layer);
}

static void trace_meta(struct nl_trace_meta *meta, const struct trace_case *tc,
		       enum nl_sparsity rule)
{
	memset(meta, 0, sizeof(*meta));
	snprintf(meta->model.name, sizeof(meta->model.name), "test-%u", tc->n_neurons);
	meta->model.n_layers = tc->n_layers;
	meta->model.d_model = 16;
	meta->model.n_neurons = tc->n_neurons;
	strcpy(meta->dataset, "synthetic");
	meta->sparsity = rule;
	meta->target_density = rule == NL_SPARSITY_RELU ? 0 : 0.1;
	meta->has_sample_ids = true;
}

/* Streams tc through nl_trace_append, reads it back and compares everything. */
static void trace_roundtrip(const struct trace_case *tc, const char *compress)
{
	const uint32_t **ids = calloc(tc->n_layers, sizeof(*ids));
	uint32_t *n_active = calloc(tc->n_layers, sizeof(*n_active));
	struct nl_csr *csr = make_trace(tc);
	struct nl_trace_writer *w;
	struct nl_trace_reader *r;
	struct nl_trace_meta meta;
	const struct nl_trace_meta *got;
	struct nl_h5_opts opts;
	char path[128], tmp[140];
	uint32_t *samples;

	cr_assert(ids && n_active);
	tmp_file(path, sizeof(path), "trace.h5");
	cr_assert_eq(nl_h5_opts_parse(&opts, compress), 0);
	trace_meta(&meta, tc, NL_SPARSITY_RELU);
	cr_assert_eq(nl_trace_create(&w, path, &meta, &opts), 0, "%s", nl_diag_msg());
	for (uint64_t t = 0; t < tc->n_tokens; t++) {
		for (uint32_t l = 0; l < tc->n_layers; l++) {
			ids[l] = csr[l].indices + csr[l].indptr[t];
			n_active[l] = (uint32_t)(csr[l].indptr[t + 1] - csr[l].indptr[t]);
		}
		cr_assert_eq(nl_trace_append(w, ids, n_active, (uint32_t)(t / 3)), 0, "%s",
			     nl_diag_msg());
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	cr_assert(file_exists(tmp));
	cr_assert(!file_exists(path), "final name exists before finish");
	cr_assert_eq(nl_trace_finish(w, NULL), 0, "%s", nl_diag_msg());
	cr_assert(!file_exists(tmp));

	cr_assert_eq(nl_trace_open(&r, path), 0, "%s", nl_diag_msg());
	got = nl_trace_get_meta(r);
	cr_assert_str_eq(got->model.name, meta.model.name);
	cr_assert_eq(got->model.n_layers, tc->n_layers);
	cr_assert_eq(got->model.d_model, 16);
	cr_assert_eq(got->model.n_neurons, tc->n_neurons);
	cr_assert_str_eq(got->dataset, "synthetic");
	cr_assert_eq(got->sparsity, NL_SPARSITY_RELU);
	cr_assert_eq(got->n_tokens, tc->n_tokens);
	cr_assert(got->has_sample_ids);
	cr_assert_null(got->threshold);
	for (uint32_t l = 0; l < tc->n_layers; l++) {
		struct nl_csr back;
		double cells = (double)tc->n_tokens * tc->n_neurons;

		cr_assert_eq(nl_trace_read_layer(r, l, &back), 0, "%s", nl_diag_msg());
		assert_csr_equal(&csr[l], &back, l);
		cr_assert_eq(got->density[l], cells ? csr[l].indptr[tc->n_tokens] / cells : 0.0);
		nl_csr_free(&back);
	}
	cr_assert_eq(nl_trace_read_sample_ids(r, &samples), 0, "%s", nl_diag_msg());
	for (uint64_t t = 0; t < tc->n_tokens; t++)
		cr_assert_eq(samples[t], t / 3);
	free(samples);
	{
		struct nl_csr back;

		cr_assert_eq(nl_trace_read_layer(r, tc->n_layers, &back), NL_E_INVAL);
	}
	nl_trace_close(r);
	free_trace(csr, tc->n_layers);
	free(ids);
	free(n_active);
}

Test(traces, roundtrip_zstd)
{
	struct trace_case tc = { 3, 37, 1001, 9, 1 };

	trace_roundtrip(&tc, "zstd");
}

Test(traces, roundtrip_zstd_level)
{
	struct trace_case tc = { 2, 64, 333, 20, 2 };

	trace_roundtrip(&tc, "zstd:19");
}

Test(traces, roundtrip_deflate)
{
	struct trace_case tc = { 3, 37, 1001, 9, 3 };

	trace_roundtrip(&tc, "deflate");
}

Test(traces, roundtrip_none)
{
	struct trace_case tc = { 1, 5, 17, 5, 4 };

	trace_roundtrip(&tc, "none");
}

/* More than one chunk of indices (256K) and of indptr (128K) per layer. */
Test(traces, roundtrip_many_chunks)
{
	struct trace_case tc = { 2, 300, 140000, 5, 5 };

	trace_roundtrip(&tc, "zstd:1");
}

Test(traces, zero_tokens)
{
	struct trace_case tc = { 2, 8, 0, 3, 6 };

	trace_roundtrip(&tc, "zstd");
}

/* The layer-at-a-time writer, threshold rule, sample ids set in one go. */
Test(traces, layer_writer)
{
	struct trace_case tc = { 4, 129, 257, 40, 7 };
	const double threshold[4] = { 0.1, 0.2, 0.3, 0.4 };
	struct nl_csr *csr = make_trace(&tc);
	struct nl_trace_writer *w;
	struct nl_trace_reader *r;
	struct nl_trace_meta meta;
	uint32_t *samples = malloc(tc.n_tokens * sizeof(uint32_t)), *back_samples;
	char path[128];

	tmp_file(path, sizeof(path), "layers.h5");
	for (uint64_t t = 0; t < tc.n_tokens; t++)
		samples[t] = (uint32_t)(1000 + t % 11);
	trace_meta(&meta, &tc, NL_SPARSITY_THRESHOLD);
	cr_assert_eq(nl_trace_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_trace_write_layer(w, 1, &csr[1]), NL_E_INVAL);
	for (uint32_t l = 0; l < tc.n_layers; l++)
		cr_assert_eq(nl_trace_write_layer(w, l, &csr[l]), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_trace_set_sample_ids(w, samples, tc.n_tokens - 1), NL_E_INVAL);
	cr_assert_eq(nl_trace_set_sample_ids(w, samples, tc.n_tokens), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_trace_append(w, NULL, NULL, 0), NL_E_INVAL);
	cr_assert_eq(nl_trace_finish(w, threshold), 0, "%s", nl_diag_msg());

	cr_assert_eq(nl_trace_open(&r, path), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_trace_get_meta(r)->sparsity, NL_SPARSITY_THRESHOLD);
	cr_assert_eq(nl_trace_get_meta(r)->target_density, 0.1);
	for (uint32_t l = 0; l < tc.n_layers; l++) {
		struct nl_csr back;

		cr_assert_eq(nl_trace_get_meta(r)->threshold[l], threshold[l]);
		cr_assert_eq(nl_trace_read_layer(r, l, &back), 0, "%s", nl_diag_msg());
		assert_csr_equal(&csr[l], &back, l);
		nl_csr_free(&back);
	}
	cr_assert_eq(nl_trace_read_sample_ids(r, &back_samples), 0);
	cr_assert_arr_eq(back_samples, samples, tc.n_tokens * sizeof(uint32_t));
	free(back_samples);
	nl_trace_close(r);
	free(samples);
	free_trace(csr, tc.n_layers);
}

Test(traces, writer_rejects_bad_input)
{
	struct trace_case tc = { 2, 10, 0, 0, 0 };
	struct nl_trace_writer *w;
	struct nl_trace_meta meta;
	char path[128], tmp[140];
	uint32_t good[2] = { 1, 4 }, unsorted[2] = { 4, 1 }, range[1] = { 10 };
	const uint32_t *ids[2] = { good, unsorted };
	uint32_t n_active[2] = { 2, 2 };

	tmp_file(path, sizeof(path), "bad.h5");
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	trace_meta(&meta, &tc, NL_SPARSITY_THRESHOLD);
	meta.model.n_layers = 0;
	cr_assert_eq(nl_trace_create(&w, path, &meta, NULL), NL_E_INVAL);
	meta.model.n_layers = 2;
	meta.target_density = 2;
	cr_assert_eq(nl_trace_create(&w, path, &meta, NULL), NL_E_INVAL);
	meta.target_density = 0.5;
	cr_assert_eq(nl_trace_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_trace_append(w, ids, n_active, 0), NL_E_INVAL);
	cr_assert(strstr(nl_diag_msg(), "layer 1"), "%s", nl_diag_msg());
	ids[1] = range;
	n_active[1] = 1;
	cr_assert_eq(nl_trace_append(w, ids, n_active, 0), NL_E_INVAL);
	ids[1] = good;
	n_active[1] = 2;
	cr_assert_eq(nl_trace_append(w, ids, n_active, 0), 0, "%s", nl_diag_msg());
	/* threshold rule without thresholds: refused, nothing left behind */
	cr_assert_eq(nl_trace_finish(w, NULL), NL_E_INVAL);
	cr_assert(!file_exists(tmp));
	cr_assert(!file_exists(path));
	/* thresholds the reader would refuse (rule 16): refused, nothing left behind */
	{
		const double bad_thr[2][2] = { { 0.5, -1.0 }, { NAN, 0.5 } };

		for (int i = 0; i < 2; i++) {
			cr_assert_eq(nl_trace_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
			cr_assert_eq(nl_trace_append(w, ids, n_active, 0), 0, "%s", nl_diag_msg());
			cr_assert_eq(nl_trace_finish(w, bad_thr[i]), NL_E_INVAL);
			cr_assert(strstr(nl_diag_msg(), "threshold"), "%s", nl_diag_msg());
			cr_assert(!file_exists(tmp));
			cr_assert(!file_exists(path));
		}
	}

	cr_assert_eq(nl_trace_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
	nl_trace_abort(w);
	cr_assert(!file_exists(tmp));
	cr_assert(!file_exists(path));
	nl_trace_abort(NULL);

	/* layer writer: finishing with a layer missing fails */
	{
		struct nl_csr *csr = make_trace(&(struct trace_case){ 2, 10, 5, 3, 9 });
		double thr[2] = { 1, 1 };

		cr_assert_eq(nl_trace_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
		cr_assert_eq(nl_trace_write_layer(w, 0, &csr[0]), 0, "%s", nl_diag_msg());
		cr_assert_eq(nl_trace_finish(w, thr), NL_E_INVAL);
		cr_assert(!file_exists(path));
		free_trace(csr, 2);
	}
}

/* ---- co-activation ---- */

static void assert_coact_equal(const struct nl_coact_layer *a, const struct nl_coact_layer *b,
			       bool pairs)
{
	uint32_t n = a->n_neurons;

	cr_assert_eq(a->n_neurons, b->n_neurons);
	cr_assert_eq(a->n_tokens, b->n_tokens);
	cr_assert_eq(a->k, b->k);
	cr_assert_arr_eq(a->count, b->count, n * sizeof(uint64_t));
	if (pairs)
		cr_assert_arr_eq(a->pairs, b->pairs, nl_tri_size(n) * sizeof(uint32_t));
	else
		cr_assert_null(b->pairs);
	if (a->k) {
		cr_assert_arr_eq(a->topk_ids, b->topk_ids, (size_t)n * a->k * sizeof(uint32_t));
		cr_assert_arr_eq(a->topk_counts, b->topk_counts, (size_t)n * a->k * sizeof(uint32_t));
	} else {
		cr_assert_null(b->topk_ids);
	}
}

static void coact_roundtrip(const char *compress, uint32_t n, uint32_t k, bool with_pairs)
{
	struct trace_case tc = { 4, n, 300, n / 3 + 1, 11 };
	struct nl_csr *csr = make_trace(&tc);
	struct nl_coact_layer stats[2];
	struct nl_coact_meta meta = { .layer_first = 1, .layer_count = 2, .n_tokens = tc.n_tokens,
				      .has_pairs = with_pairs, .k = k };
	struct nl_coact_writer *w;
	struct nl_coact_reader *r;
	struct nl_h5_opts opts;
	char path[128];

	tmp_file(path, sizeof(path), "coact.h5");
	cr_assert_eq(nl_h5_opts_parse(&opts, compress), 0);
	strcpy(meta.model.name, "coact-test");
	meta.model.n_layers = 4;
	meta.model.d_model = 8;
	meta.model.n_neurons = n;
	strcpy(meta.dataset, "synthetic");
	for (uint32_t i = 0; i < 2; i++)
		cr_assert_eq(gd_coact_from_csr(&csr[1 + i], k, with_pairs, &stats[i]), 0);
	cr_assert_eq(nl_coact_create(&w, path, &meta, &opts), 0, "%s", nl_diag_msg());
	/* any order */
	cr_assert_eq(nl_coact_write_layer(w, 2, &stats[1]), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_coact_write_layer(w, 2, &stats[1]), NL_E_INVAL);
	cr_assert_eq(nl_coact_write_layer(w, 0, &stats[0]), NL_E_INVAL);
	cr_assert_eq(nl_coact_write_layer(w, 1, &stats[0]), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_coact_finish(w), 0, "%s", nl_diag_msg());

	cr_assert_eq(nl_coact_open(&r, path), 0, "%s", nl_diag_msg());
	cr_assert_str_eq(nl_coact_get_meta(r)->model.name, "coact-test");
	cr_assert_str_eq(nl_coact_get_meta(r)->dataset, "synthetic");
	cr_assert_eq(nl_coact_get_meta(r)->layer_first, 1);
	cr_assert_eq(nl_coact_get_meta(r)->layer_count, 2);
	cr_assert_eq(nl_coact_get_meta(r)->n_tokens, tc.n_tokens);
	cr_assert_eq(nl_coact_get_meta(r)->k, k);
	cr_assert_eq(nl_coact_get_meta(r)->has_pairs, with_pairs);
	for (uint32_t i = 0; i < 2; i++) {
		struct nl_coact_layer back;

		cr_assert_eq(nl_coact_read_layer(r, 1 + i, false, &back), 0, "%s", nl_diag_msg());
		assert_coact_equal(&stats[i], &back, false);
		nl_coact_layer_free(&back);
		if (with_pairs) {
			cr_assert_eq(nl_coact_read_layer(r, 1 + i, true, &back), 0, "%s",
				     nl_diag_msg());
			assert_coact_equal(&stats[i], &back, true);
			nl_coact_layer_free(&back);
		} else {
			cr_assert_eq(nl_coact_read_layer(r, 1 + i, true, &back), NL_E_MISSING);
		}
	}
	{
		struct nl_coact_layer back;

		cr_assert_eq(nl_coact_read_layer(r, 3, false, &back), NL_E_INVAL);
		cr_assert_eq(nl_coact_read_layer(r, 0, false, &back), NL_E_INVAL);
	}
	nl_coact_close(r);
	for (uint32_t i = 0; i < 2; i++)
		nl_coact_layer_free(&stats[i]);
	free_trace(csr, tc.n_layers);
}

Test(coact, roundtrip_zstd_pairs)
{
	coact_roundtrip("zstd", 61, 5, true);
}

Test(coact, roundtrip_deflate_no_pairs)
{
	coact_roundtrip("deflate:1", 33, 3, false);
}

Test(coact, roundtrip_none_k0)
{
	coact_roundtrip("none", 2, 0, true);
}

Test(coact, k_larger_than_neighbours)
{
	coact_roundtrip("zstd", 7, 7, true);
}

/* A damaged layer does not stop another layer from being read. */
Test(coact, layers_read_independently)
{
	struct trace_case tc = { 2, 20, 50, 6, 12 };
	struct nl_csr *csr = make_trace(&tc);
	struct nl_coact_meta meta = { .layer_first = 0, .layer_count = 2, .n_tokens = 50,
				      .has_pairs = true, .k = 2 };
	struct nl_coact_layer stats, back;
	struct nl_coact_writer *w;
	struct nl_coact_reader *r;
	char path[128];
	hid_t file;

	tmp_file(path, sizeof(path), "indep.h5");
	strcpy(meta.model.name, "m");
	meta.model.n_layers = 2;
	meta.model.d_model = 4;
	meta.model.n_neurons = 20;
	cr_assert_eq(nl_coact_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
	for (uint32_t l = 0; l < 2; l++) {
		cr_assert_eq(gd_coact_from_csr(&csr[l], 2, true, &stats), 0);
		cr_assert_eq(nl_coact_write_layer(w, l, &stats), 0, "%s", nl_diag_msg());
		nl_coact_layer_free(&stats);
	}
	cr_assert_eq(nl_coact_finish(w), 0, "%s", nl_diag_msg());
	/* remove layer 1's pairs behind the library's back */
	file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
	cr_assert_geq(file, 0);
	cr_assert_geq(H5Ldelete(file, "layer_001/pairs", H5P_DEFAULT), 0);
	H5Fclose(file);
	cr_assert_eq(nl_coact_open(&r, path), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_coact_read_layer(r, 0, true, &back), 0, "%s", nl_diag_msg());
	nl_coact_layer_free(&back);
	cr_assert_eq(nl_coact_read_layer(r, 1, false, &back), 0, "%s", nl_diag_msg());
	nl_coact_layer_free(&back);
	cr_assert_eq(nl_coact_read_layer(r, 1, true, &back), NL_E_MISSING);
	cr_assert(strstr(nl_diag_msg(), "layer_001/pairs"), "%s", nl_diag_msg());
	cr_assert(strstr(nl_diag_msg(), path), "%s", nl_diag_msg());
	nl_coact_close(r);
	free_trace(csr, 2);
}

/* Lists ranked by f(i,j)/sqrt(f(i)f(j)): written, read back, order enforced. */
Test(coact, norm_ranking)
{
	struct nl_coact_meta meta = { .layer_first = 0, .layer_count = GD_LAYERS,
				      .n_tokens = GD_TOKENS, .has_pairs = true, .k = GD_K,
				      .rank = NL_COACT_RANK_NORM };
	struct nl_coact_layer norm[GD_LAYERS], count, back;
	struct nl_coact_writer *w;
	struct nl_coact_reader *r;
	char path[128];
	bool differ = false;

	tmp_file(path, sizeof(path), "norm.h5");
	gd_model(&meta.model);
	strcpy(meta.dataset, "golden-text");
	cr_assert_eq(nl_coact_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
	for (uint32_t l = 0; l < GD_LAYERS; l++) {
		struct nl_csr csr;

		cr_assert_eq(gd_csr(l, &csr), 0);
		cr_assert_eq(gd_coact_from_csr_ranked(&csr, GD_K, true, NL_COACT_RANK_NORM, &norm[l]), 0);
		cr_assert_eq(gd_coact_from_csr(&csr, GD_K, true, &count), 0);
		nl_csr_free(&csr);
		/* count-ranked lists in a norm file: refused */
		cr_assert_eq(nl_coact_write_layer(w, l, &count), NL_E_INVAL);
		if (memcmp(count.topk_ids, norm[l].topk_ids, GD_NEURONS * GD_K * sizeof(uint32_t))) {
			differ = true;
			/* ...also when they claim to be norm-ranked */
			count.rank = NL_COACT_RANK_NORM;
			cr_assert_eq(nl_coact_write_layer(w, l, &count), NL_E_INVAL);
			cr_assert(strstr(nl_diag_msg(), "'norm' order"), "%s", nl_diag_msg());
		}
		nl_coact_layer_free(&count);
		/* a norm row with two slots swapped: refused */
		for (uint32_t i = 0; i < GD_NEURONS; i++) {
			uint32_t *ids = norm[l].topk_ids + i * GD_K, *cnt = norm[l].topk_counts + i * GD_K;
			uint32_t t;

			if (ids[1] == UINT32_MAX)
				continue;
			t = ids[0], ids[0] = ids[1], ids[1] = t;
			t = cnt[0], cnt[0] = cnt[1], cnt[1] = t;
			cr_assert_eq(nl_coact_write_layer(w, l, &norm[l]), NL_E_INVAL);
			t = ids[0], ids[0] = ids[1], ids[1] = t;
			t = cnt[0], cnt[0] = cnt[1], cnt[1] = t;
			break;
		}
		cr_assert_eq(nl_coact_write_layer(w, l, &norm[l]), 0, "%s", nl_diag_msg());
	}
	cr_assert(differ, "the golden data should rank differently by norm and by count");
	cr_assert_eq(nl_coact_finish(w), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_coact_open(&r, path), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_coact_get_meta(r)->rank, NL_COACT_RANK_NORM);
	for (uint32_t l = 0; l < GD_LAYERS; l++) {
		cr_assert_eq(nl_coact_read_layer(r, l, l == 0, &back), 0, "%s", nl_diag_msg());
		cr_assert_eq(back.rank, NL_COACT_RANK_NORM);
		assert_coact_equal(&norm[l], &back, l == 0);
		nl_coact_layer_free(&back);
		nl_coact_layer_free(&norm[l]);
	}
	nl_coact_close(r);
	/* an unknown ranking is refused by the writer */
	meta.rank = (enum nl_coact_rank)7;
	cr_assert_eq(nl_coact_create(&w, path, &meta, NULL), NL_E_INVAL);
}

Test(coact, writer_rejects_bad_input)
{
	struct trace_case tc = { 1, 10, 30, 4, 13 };
	struct nl_csr *csr = make_trace(&tc);
	struct nl_coact_meta meta = { .layer_first = 0, .layer_count = 2, .n_tokens = 30,
				      .has_pairs = true, .k = 3 };
	struct nl_coact_layer stats;
	struct nl_coact_writer *w;
	char path[128];

	tmp_file(path, sizeof(path), "bad.h5");
	strcpy(meta.model.name, "m");
	meta.model.n_layers = 2;
	meta.model.d_model = 4;
	meta.model.n_neurons = 10;
	meta.layer_first = 1;
	cr_assert_eq(nl_coact_create(&w, path, &meta, NULL), NL_E_INVAL);
	meta.layer_first = 0;
	cr_assert_eq(gd_coact_from_csr(&csr[0], 3, true, &stats), 0);
	cr_assert_eq(nl_coact_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
	stats.n_tokens = 29;
	cr_assert_eq(nl_coact_write_layer(w, 0, &stats), NL_E_INVAL);
	stats.n_tokens = 30;
	{
		/* swap two top-K slots of row 0: no longer sorted */
		uint32_t id = stats.topk_ids[0], c = stats.topk_counts[0];

		stats.topk_ids[0] = stats.topk_ids[1];
		stats.topk_counts[0] = stats.topk_counts[1] ? stats.topk_counts[1] : 0;
		stats.topk_ids[1] = id;
		stats.topk_counts[1] = c;
		if (stats.topk_counts[0] != c || stats.topk_ids[0] != id)
			cr_assert_eq(nl_coact_write_layer(w, 0, &stats), NL_E_INVAL);
		stats.topk_ids[1] = stats.topk_ids[0];
		stats.topk_counts[1] = stats.topk_counts[0];
		stats.topk_ids[0] = id;
		stats.topk_counts[0] = c;
	}
	stats.count[3] = 31;
	cr_assert_eq(nl_coact_write_layer(w, 0, &stats), NL_E_INVAL);
	stats.count[3] = 0;
	for (uint32_t j = 4; j < 10; j++)
		stats.count[j] = 0;
	cr_assert_eq(nl_coact_write_layer(w, 0, &stats), NL_E_INVAL, "pairs above counts accepted");
	nl_coact_layer_free(&stats);
	cr_assert_eq(gd_coact_from_csr(&csr[0], 3, true, &stats), 0);
	cr_assert_eq(nl_coact_write_layer(w, 0, &stats), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_coact_finish(w), NL_E_INVAL);
	cr_assert(strstr(nl_diag_msg(), "layer 1"), "%s", nl_diag_msg());
	cr_assert(!file_exists(path));
	nl_coact_layer_free(&stats);
	free_trace(csr, 1);
}

/* ---- placement ---- */

static void placement_roundtrip(const char *compress, uint32_t n)
{
	struct nl_placement_meta meta = { .layer_first = 2, .layer_count = 3 };
	struct nl_placement_layer p[3];
	struct nl_placement_writer *w;
	struct nl_placement_reader *r;
	struct nl_h5_opts opts;
	uint64_t state = n;
	char path[128];

	tmp_file(path, sizeof(path), "place.h5");
	cr_assert_eq(nl_h5_opts_parse(&opts, compress), 0);
	strcpy(meta.model.name, "place-test");
	meta.model.n_layers = 5;
	meta.model.d_model = 8;
	meta.model.n_neurons = n;
	strcpy(meta.dataset, "tinystories");
	for (uint32_t l = 0; l < 3; l++) {
		memset(&p[l], 0, sizeof(p[l]));
		p[l].n_neurons = n;
		p[l].perm = malloc(n * sizeof(uint32_t));
		p[l].inv = malloc(n * sizeof(uint32_t));
		for (uint32_t i = 0; i < n; i++)
			p[l].perm[i] = i;
		for (uint32_t i = n - 1; l && i > 0; i--) {
			uint32_t j = (uint32_t)(gd_next(&state) % (i + 1)), t = p[l].perm[i];

			p[l].perm[i] = p[l].perm[j];
			p[l].perm[j] = t;
		}
		for (uint32_t i = 0; i < n; i++)
			p[l].inv[p[l].perm[i]] = i;
		p[l].objective = 0.125 * l + 1.0 / 3;
		snprintf(p[l].algo, sizeof(p[l].algo), "%s", l ? "greedy" : "identity");
		snprintf(p[l].params, sizeof(p[l].params), l == 2 ? "" : "k=%u time_limit=10", l);
	}
	cr_assert_eq(nl_placement_create(&w, path, &meta, &opts), 0, "%s", nl_diag_msg());
	for (uint32_t l = 0; l < 3; l++)
		cr_assert_eq(nl_placement_write_layer(w, 2 + l, &p[l]), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_placement_finish(w), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_placement_open(&r, path), 0, "%s", nl_diag_msg());
	cr_assert_str_eq(nl_placement_get_meta(r)->dataset, "tinystories");
	cr_assert_eq(nl_placement_get_meta(r)->layer_first, 2);
	cr_assert_eq(nl_placement_get_meta(r)->layer_count, 3);
	cr_assert_eq(nl_placement_get_meta(r)->model.n_neurons, n);
	for (uint32_t l = 0; l < 3; l++) {
		struct nl_placement_layer back;

		cr_assert_eq(nl_placement_read_layer(r, 2 + l, &back), 0, "%s", nl_diag_msg());
		cr_assert_eq(back.n_neurons, n);
		cr_assert_arr_eq(back.perm, p[l].perm, n * sizeof(uint32_t));
		cr_assert_arr_eq(back.inv, p[l].inv, n * sizeof(uint32_t));
		cr_assert_eq(back.objective, p[l].objective);
		cr_assert_str_eq(back.algo, p[l].algo);
		cr_assert_str_eq(back.params, p[l].params);
		nl_placement_layer_free(&back);
		nl_placement_layer_free(&p[l]);
	}
	{
		struct nl_placement_layer back;

		cr_assert_eq(nl_placement_read_layer(r, 1, &back), NL_E_INVAL);
	}
	nl_placement_close(r);
}

Test(placement, roundtrip_zstd)
{
	placement_roundtrip("zstd", 1000);
}

Test(placement, roundtrip_deflate)
{
	placement_roundtrip("deflate", 333);
}

Test(placement, roundtrip_none_one_neuron)
{
	placement_roundtrip("none", 1);
}

/* More than one 256K-element chunk. */
Test(placement, roundtrip_big)
{
	placement_roundtrip("zstd:1", 300000);
}

Test(placement, writer_rejects_bad_input)
{
	struct nl_placement_meta meta = { .layer_first = 0, .layer_count = 2 };
	struct nl_placement_writer *w;
	struct nl_placement_layer p;
	char path[128];

	tmp_file(path, sizeof(path), "bad.h5");
	gd_model(&meta.model);
	strcpy(meta.dataset, "d");
	meta.layer_count = 3;
	cr_assert_eq(nl_placement_create(&w, path, &meta, NULL), NL_E_INVAL);
	meta.layer_count = 2;
	cr_assert_eq(nl_placement_create(&w, path, &meta, NULL), 0, "%s", nl_diag_msg());
	cr_assert_eq(gd_placement(0, &p), 0);
	p.inv[p.perm[0]] = 1;
	cr_assert_eq(nl_placement_write_layer(w, 0, &p), NL_E_INVAL);
	p.inv[p.perm[0]] = 0;
	p.algo[0] = '\0';
	cr_assert_eq(nl_placement_write_layer(w, 0, &p), NL_E_INVAL);
	strcpy(p.algo, "greedy");
	cr_assert_eq(nl_placement_write_layer(w, 0, &p), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_placement_write_layer(w, 0, &p), NL_E_INVAL);
	nl_placement_layer_free(&p);
	nl_placement_abort(w);
	cr_assert(!file_exists(path));
}

/* ---- golden files ---- */

static void golden_path(char *buf, size_t size, const char *dir, const char *name)
{
	snprintf(buf, size, "%s/tests/golden/%s/hdf5/%s", source_root(), dir, name);
}

static void check_golden_traces(const char *name)
{
	struct nl_trace_reader *r;
	const struct nl_trace_meta *meta;
	struct nl_trace_meta want;
	uint32_t *samples;
	char path[512];

	golden_path(path, sizeof(path), "ok", name);
	gd_trace_meta(&want);
	cr_assert_eq(nl_trace_open(&r, path), 0, "%s", nl_diag_msg());
	meta = nl_trace_get_meta(r);
	cr_assert_str_eq(meta->model.name, want.model.name);
	cr_assert_eq(meta->model.n_layers, GD_LAYERS);
	cr_assert_eq(meta->model.n_neurons, GD_NEURONS);
	cr_assert_eq(meta->model.d_model, want.model.d_model);
	cr_assert_str_eq(meta->dataset, want.dataset);
	cr_assert_eq(meta->sparsity, want.sparsity);
	cr_assert_eq(meta->target_density, want.target_density);
	cr_assert_eq(meta->n_tokens, GD_TOKENS);
	for (uint32_t l = 0; l < GD_LAYERS; l++) {
		struct nl_csr expect, back;

		cr_assert_eq(meta->threshold[l], gd_threshold[l]);
		cr_assert_eq(gd_csr(l, &expect), 0);
		cr_assert_eq(nl_trace_read_layer(r, l, &back), 0, "%s", nl_diag_msg());
		assert_csr_equal(&expect, &back, l);
		nl_csr_free(&expect);
		nl_csr_free(&back);
	}
	cr_assert_eq(nl_trace_read_sample_ids(r, &samples), 0, "%s", nl_diag_msg());
	for (uint64_t t = 0; t < GD_TOKENS; t++)
		cr_assert_eq(samples[t], gd_sample_id(t));
	free(samples);
	nl_trace_close(r);
}

Test(golden, ok_traces)
{
	check_golden_traces("traces_v1.h5");
}

/* Version 1.9 with unknown attributes and datasets: a 1.0 reader accepts it. */
Test(golden, ok_traces_newer_minor)
{
	check_golden_traces("traces_v1.9_extra.h5");
}

Test(golden, ok_coact)
{
	struct nl_coact_reader *r;
	char path[512];

	golden_path(path, sizeof(path), "ok", "coact_v1.h5");
	cr_assert_eq(nl_coact_open(&r, path), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_coact_get_meta(r)->k, GD_K);
	cr_assert(nl_coact_get_meta(r)->has_pairs);
	/* a 1.0 file has no topk_rank: its lists are ranked by count */
	cr_assert_eq(nl_coact_get_meta(r)->rank, NL_COACT_RANK_COUNT);
	for (uint32_t l = 0; l < GD_LAYERS; l++) {
		struct nl_csr csr;
		struct nl_coact_layer expect, back;

		cr_assert_eq(gd_csr(l, &csr), 0);
		cr_assert_eq(gd_coact_from_csr(&csr, GD_K, true, &expect), 0);
		cr_assert_eq(nl_coact_read_layer(r, l, true, &back), 0, "%s", nl_diag_msg());
		assert_coact_equal(&expect, &back, true);
		nl_coact_layer_free(&expect);
		nl_coact_layer_free(&back);
		nl_csr_free(&csr);
	}
	nl_coact_close(r);
}

Test(golden, ok_placement)
{
	struct nl_placement_reader *r;
	char path[512];

	golden_path(path, sizeof(path), "ok", "placement_v1.h5");
	cr_assert_eq(nl_placement_open(&r, path), 0, "%s", nl_diag_msg());
	for (uint32_t l = 0; l < GD_LAYERS; l++) {
		struct nl_placement_layer expect, back;

		cr_assert_eq(gd_placement(l, &expect), 0);
		cr_assert_eq(nl_placement_read_layer(r, l, &back), 0, "%s", nl_diag_msg());
		cr_assert_arr_eq(back.perm, expect.perm, GD_NEURONS * sizeof(uint32_t));
		cr_assert_arr_eq(back.inv, expect.inv, GD_NEURONS * sizeof(uint32_t));
		cr_assert_str_eq(back.algo, expect.algo);
		cr_assert_str_eq(back.params, expect.params);
		cr_assert_eq(back.objective, expect.objective);
		nl_placement_layer_free(&expect);
		nl_placement_layer_free(&back);
	}
	nl_placement_close(r);
}

static int read_everything(const char *kind, const char *path);

static size_t slurp(const char *path, unsigned char **out)
{
	FILE *f = fopen(path, "rb");
	size_t size;

	cr_assert_not_null(f, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	size = (size_t)ftell(f);
	rewind(f);
	*out = malloc(size);
	cr_assert_not_null(*out);
	cr_assert_eq(fread(*out, 1, size, f), size);
	fclose(f);
	return size;
}

static void spit(const char *path, const unsigned char *data, size_t size)
{
	FILE *f = fopen(path, "wb");

	cr_assert_not_null(f);
	cr_assert_eq(fwrite(data, 1, size, f), size);
	fclose(f);
}

/*
 * Damaged copies of the golden files (random bit flips, every kind of
 * truncation) fail with an error naming the file, or still read when the
 * flip hit unused bytes; they never crash (the test runs under ASan in CI).
 */
static void damage(const char *kind, const char *name)
{
	unsigned char *orig, *copy;
	char src[512], path[128];
	uint64_t state = 42;
	size_t size;

	golden_path(src, sizeof(src), "ok", name);
	size = slurp(src, &orig);
	copy = malloc(size);
	tmp_file(path, sizeof(path), name);
	for (int it = 0; it < 150; it++) {
		int flips = 1 + (int)(gd_next(&state) % 3), err;

		memcpy(copy, orig, size);
		for (int f = 0; f < flips; f++)
			copy[gd_next(&state) % size] ^= (unsigned char)(1u << (gd_next(&state) % 8));
		spit(path, copy, size);
		nl_diag_clear();
		err = read_everything(kind, path);
		cr_assert_leq(err, 0);
		if (err)
			cr_assert(strstr(nl_diag_msg(), path), "iteration %d: %s", it, nl_diag_msg());
	}
	for (size_t cut = 0; cut < size; cut += 1 + size / 40) {
		int err;

		spit(path, orig, cut);
		nl_diag_clear();
		err = read_everything(kind, path);
		cr_assert(err == NL_E_TRUNCATED || err == NL_E_MAGIC,
			  "cut at %zu of %zu: %d %s", cut, size, err, nl_diag_msg());
		cr_assert(strstr(nl_diag_msg(), path), "%s", nl_diag_msg());
	}
	free(copy);
	free(orig);
}

Test(golden, damaged_traces)
{
	damage("traces", "traces_v1.h5");
}

Test(golden, damaged_coact)
{
	damage("coact", "coact_v1.h5");
}

Test(golden, damaged_placement)
{
	damage("placement", "placement_v1.h5");
}

static const struct {
	const char *name;
	int code;
} err_names[] = {
	{ "NL_E_INVAL", NL_E_INVAL }, { "NL_E_FORMAT", NL_E_FORMAT },
	{ "NL_E_MAGIC", NL_E_MAGIC }, { "NL_E_VERSION", NL_E_VERSION },
	{ "NL_E_CHECKSUM", NL_E_CHECKSUM }, { "NL_E_TRUNCATED", NL_E_TRUNCATED },
	{ "NL_E_RESERVED", NL_E_RESERVED }, { "NL_E_MISSING", NL_E_MISSING },
	{ "NL_E_SHAPE", NL_E_SHAPE }, { "NL_E_TYPE", NL_E_TYPE }, { "NL_E_HDF5", NL_E_HDF5 },
	{ "NL_E_MISMATCH", NL_E_MISMATCH }, { "NL_E_UNSUPPORTED", NL_E_UNSUPPORTED },
	{ "NL_E_COMPRESS", NL_E_COMPRESS },
};

static int err_code(const char *name)
{
	for (size_t i = 0; i < sizeof(err_names) / sizeof(err_names[0]); i++)
		if (!strcmp(err_names[i].name, name))
			return err_names[i].code;
	cr_assert_fail("unknown error name '%s' in MANIFEST", name);
	return 0;
}

/* Opens and fully reads a file of `kind`; returns the first error. */
static int read_everything(const char *kind, const char *path)
{
	int err = 0;

	if (!strcmp(kind, "traces")) {
		struct nl_trace_reader *r;

		err = nl_trace_open(&r, path);
		for (uint32_t l = 0; !err && l < nl_trace_get_meta(r)->model.n_layers; l++) {
			struct nl_csr csr;

			err = nl_trace_read_layer(r, l, &csr);
			nl_csr_free(&csr);
		}
		if (!err && nl_trace_get_meta(r)->has_sample_ids) {
			uint32_t *ids;

			err = nl_trace_read_sample_ids(r, &ids);
			free(ids);
		}
		nl_trace_close(r);
	} else if (!strcmp(kind, "coact")) {
		struct nl_coact_reader *r;

		err = nl_coact_open(&r, path);
		if (!err) {
			const struct nl_coact_meta *m = nl_coact_get_meta(r);

			for (uint32_t l = m->layer_first; !err && l < m->layer_first + m->layer_count;
			     l++) {
				struct nl_coact_layer layer;

				err = nl_coact_read_layer(r, l, m->has_pairs, &layer);
				nl_coact_layer_free(&layer);
			}
		}
		nl_coact_close(r);
	} else if (!strcmp(kind, "placement")) {
		struct nl_placement_reader *r;

		err = nl_placement_open(&r, path);
		if (!err) {
			const struct nl_placement_meta *m = nl_placement_get_meta(r);

			for (uint32_t l = m->layer_first; !err && l < m->layer_first + m->layer_count;
			     l++) {
				struct nl_placement_layer layer;

				err = nl_placement_read_layer(r, l, &layer);
				nl_placement_layer_free(&layer);
			}
		}
		nl_placement_close(r);
	} else {
		cr_assert_fail("unknown kind '%s' in MANIFEST", kind);
	}
	return err;
}

Test(golden, reject_manifest)
{
	char dir[512], manifest[600], line[512], path[1024];
	unsigned cases = 0, by_kind[3] = { 0 };
	FILE *f;

	snprintf(dir, sizeof(dir), "%s/tests/golden/reject/hdf5", source_root());
	snprintf(manifest, sizeof(manifest), "%s/MANIFEST", dir);
	f = fopen(manifest, "r");
	cr_assert_not_null(f, "cannot open %s", manifest);
	while (fgets(line, sizeof(line), f)) {
		char file[256], kind[32], code[32];
		int expect, got;

		if (line[0] == '#' || line[0] == '\n')
			continue;
		cr_assert_eq(sscanf(line, "%255s %31s %31s", file, kind, code), 3,
			     "bad MANIFEST line: %s", line);
		expect = err_code(code);
		snprintf(path, sizeof(path), "%s/%s", dir, file);
		cr_assert(file_exists(path), "%s listed in MANIFEST but missing", file);
		nl_diag_clear();
		got = read_everything(kind, path);
		cr_expect_eq(got, expect, "%s: got %d (%s), expected %s; diagnostic: %s", file, got,
			     nl_strerror(got), code, nl_diag_msg());
		cr_expect(strstr(nl_diag_msg(), file) != NULL,
			  "%s: diagnostic does not name the file: %s", file, nl_diag_msg());
		cases++;
		by_kind[kind[0] == 't' ? 0 : kind[0] == 'c' ? 1 : 2]++;
	}
	fclose(f);
	cr_assert_geq(cases, 30, "only %u reject cases", cases);
	cr_assert(by_kind[0] && by_kind[1] && by_kind[2]);
}
