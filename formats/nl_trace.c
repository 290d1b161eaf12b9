/*
 * Activation traces (docs/formats/traces.md): per layer, the active FFN
 * neurons of every profiled token as compressed sparse rows.
 *
 * The streaming writer keeps, per layer, a buffer of pending indptr and
 * indices entries and appends them to extensible datasets in whole chunks, so
 * memory stays bounded (about 2 MiB per layer) whatever the token count, and
 * every chunk is compressed exactly once. A dataset is created at its first
 * flush: a trace that never fills one chunk gets a chunk of exactly its size,
 * which keeps small files small.
 */
#include "nl_h5.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_FORMAT "neuralink-traces"
#define TRACE_MAJOR 1
#define TRACE_MINOR 0

/* Chunk lengths (elements): 1 MiB of indices, 1 MiB of indptr, 1 MiB of sample ids. */
#define CHUNK_INDICES (256u * 1024)
#define CHUNK_INDPTR (128u * 1024)
#define CHUNK_SAMPLES (256u * 1024)

#define FIX_TRACE "re-run nl-profile to re-create the traces"

/* A growing 1-D dataset fed through a buffer that is flushed in whole chunks. */
struct stream {
	const char *name;        /* dataset path, e.g. "layer_003/indices" */
	enum nl_h5_type type;
	size_t elem;             /* bytes per element */
	uint64_t chunk;          /* chunk length in elements */
	hid_t dset;              /* -1 until the first flush */
	uint64_t written;        /* elements in the file */
	void *buf;               /* pending elements */
	uint64_t pending;
	uint64_t cap;
};

struct trace_layer {
	char group[32];
	char indptr_name[48];
	char indices_name[48];
	struct stream indptr;
	struct stream indices;
	uint64_t nnz;            /* indices so far, written and pending */
};

enum writer_mode { MODE_NONE, MODE_APPEND, MODE_LAYER };

struct nl_trace_writer {
	char *path;
	char *tmp;
	hid_t file;
	struct nl_trace_meta meta;   /* copy; density/threshold unused */
	struct nl_h5_opts opts;
	struct trace_layer *layers;
	struct stream samples;
	enum writer_mode mode;
	uint64_t n_tokens;
	uint32_t layers_written;     /* MODE_LAYER */
	bool samples_set;            /* MODE_LAYER */
};

struct nl_trace_reader {
	char *path;
	hid_t file;
	struct nl_trace_meta meta;
	uint64_t *nnz;               /* [n_layers] length of each indices dataset */
};

/* ---- streams ---- */

static int stream_init(struct stream *s, const char *name, enum nl_h5_type type, uint64_t chunk)
{
	s->name = name;
	s->type = type;
	s->elem = type == NL_H5_U32 ? 4 : 8;
	s->chunk = chunk;
	s->dset = -1;
	s->written = 0;
	s->pending = 0;
	s->cap = chunk;
	s->buf = malloc(chunk * s->elem);
	return s->buf ? 0 : -ENOMEM;
}

static void stream_free(struct stream *s)
{
	nl_h5_close(s->dset);
	s->dset = -1;
	free(s->buf);
	s->buf = NULL;
}

static int stream_reserve(struct stream *s, uint64_t extra)
{
	uint64_t want = s->pending + extra, cap = s->cap;
	void *grown;

	if (want <= cap)
		return 0;
	while (cap < want)
		cap *= 2;
	grown = realloc(s->buf, cap * s->elem);
	if (!grown)
		return -ENOMEM;
	s->buf = grown;
	s->cap = cap;
	return 0;
}

/*
 * Writes pending elements: only whole chunks unless `final`, so that every
 * append starts on a chunk boundary and no chunk is compressed twice.
 */
static int stream_flush(struct stream *s, hid_t file, const char *path,
			const struct nl_h5_opts *opts, bool final)
{
	uint64_t n = final ? s->pending : s->pending / s->chunk * s->chunk;
	int err;

	if (s->dset < 0) {
		uint64_t dims[1] = { 0 };

		if (!final && n == 0)
			return 0;
		if (final) {
			/* Everything fits in one go: a fixed-size dataset, chunk of its size. */
			dims[0] = n;
			err = nl_h5_write_full(file, path, s->name, s->type, 1, dims, s->chunk, opts,
					       s->buf);
			if (!err) {
				s->written = n;
				s->pending = 0;
			}
			return err;
		}
		err = nl_h5_dset_create(&s->dset, file, path, s->name, s->type, 1, dims, true,
					s->chunk, opts);
		if (err)
			return err;
	}
	if (n == 0)
		return 0;
	err = nl_h5_append(s->dset, path, s->name, s->type, &s->written, 1, s->buf, n);
	if (err)
		return err;
	memmove(s->buf, (char *)s->buf + n * s->elem, (s->pending - n) * s->elem);
	s->pending -= n;
	return 0;
}

/* ---- writer ---- */

static void writer_free(struct nl_trace_writer *w)
{
	if (!w)
		return;
	if (w->layers) {
		for (uint32_t l = 0; l < w->meta.model.n_layers; l++) {
			stream_free(&w->layers[l].indptr);
			stream_free(&w->layers[l].indices);
		}
		free(w->layers);
	}
	stream_free(&w->samples);
	nl_h5_close(w->file);
	free(w->path);
	free(w->tmp);
	free(w);
}

int nl_trace_create(struct nl_trace_writer **out, const char *path,
		    const struct nl_trace_meta *meta, const struct nl_h5_opts *opts)
{
	static const struct nl_h5_opts default_opts = { NL_COMPRESS_ZSTD, 0 };
	struct nl_trace_writer *w;
	int err;

	*out = NULL;
	if (!path || !meta)
		return nl_diag(NL_E_INVAL, "nl_trace_create: path and meta are required");
	err = nl_h5_check_model(&meta->model, path);
	if (err)
		return err;
	if ((unsigned)meta->sparsity > NL_SPARSITY_IMPORTED)
		return nl_diag(NL_E_INVAL, "'%s': sparsity rule %d unknown", path, (int)meta->sparsity);
	if (!isfinite(meta->target_density) || meta->target_density < 0 || meta->target_density > 1)
		return nl_diag(NL_E_INVAL, "'%s': target density %g out of range, expected 0..1",
			       path, meta->target_density);
	if (!memchr(meta->dataset, '\0', sizeof(meta->dataset)))
		return nl_diag(NL_E_INVAL, "'%s': dataset name is not NUL-terminated", path);
	w = calloc(1, sizeof(*w));
	if (!w)
		return nl_diag(-ENOMEM, "'%s': out of memory", path);
	w->file = -1;
	w->samples.dset = -1;
	w->meta = *meta;
	w->meta.density = NULL;
	w->meta.threshold = NULL;
	w->opts = opts ? *opts : default_opts;
	w->layers = calloc(meta->model.n_layers, sizeof(*w->layers));
	if (!w->layers) {
		err = nl_diag(-ENOMEM, "'%s': out of memory", path);
		goto fail;
	}
	for (uint32_t l = 0; l < meta->model.n_layers; l++) {
		struct trace_layer *tl = &w->layers[l];

		tl->indptr.dset = tl->indices.dset = -1;
	}
	for (uint32_t l = 0; l < meta->model.n_layers; l++) {
		struct trace_layer *tl = &w->layers[l];

		nl_h5_layer_name(tl->group, sizeof(tl->group), l);
		snprintf(tl->indptr_name, sizeof(tl->indptr_name), "%s/indptr", tl->group);
		snprintf(tl->indices_name, sizeof(tl->indices_name), "%s/indices", tl->group);
		if (stream_init(&tl->indptr, tl->indptr_name, NL_H5_U64, CHUNK_INDPTR) ||
		    stream_init(&tl->indices, tl->indices_name, NL_H5_U32, CHUNK_INDICES)) {
			err = nl_diag(-ENOMEM, "'%s': out of memory for layer buffers", path);
			goto fail;
		}
		/* Every CSR starts with offset 0. */
		((uint64_t *)tl->indptr.buf)[0] = 0;
		tl->indptr.pending = 1;
	}
	if (stream_init(&w->samples, "sample_id", NL_H5_U32, CHUNK_SAMPLES)) {
		err = nl_diag(-ENOMEM, "'%s': out of memory", path);
		goto fail;
	}
	err = nl_h5_tmp_create(&w->file, &w->path, &w->tmp, path);
	if (err)
		goto fail;
	err = nl_h5_put_header(w->file, path, TRACE_FORMAT, TRACE_MAJOR, TRACE_MINOR, &meta->model);
	if (!err)
		err = nl_h5_attr_put_str(w->file, path, "dataset", meta->dataset);
	if (!err)
		err = nl_h5_attr_put_str(w->file, path, "sparsity", nl_sparsity_name(meta->sparsity));
	if (!err)
		err = nl_h5_attr_put_f64(w->file, path, "target_density", meta->target_density);
	for (uint32_t l = 0; !err && l < meta->model.n_layers; l++) {
		hid_t group;

		err = nl_h5_group_create(&group, w->file, path, w->layers[l].group);
		if (!err)
			H5Gclose(group);
	}
	if (err)
		goto fail_unlink;
	*out = w;
	return 0;
fail_unlink:
	nl_h5_tmp_discard(&w->file, w->tmp);
fail:
	writer_free(w);
	return err;
}

int nl_trace_append(struct nl_trace_writer *w, const uint32_t *const *ids,
		    const uint32_t *n_active, uint32_t sample_id)
{
	uint32_t n_layers, n_neurons;
	int err;

	if (!w || !ids || !n_active)
		return nl_diag(NL_E_INVAL, "nl_trace_append: writer, ids and n_active are required");
	if (w->mode == MODE_LAYER)
		return nl_diag(NL_E_INVAL, "'%s': nl_trace_append after nl_trace_write_layer; "
			       "use one of the two writers", w->path);
	n_layers = w->meta.model.n_layers;
	n_neurons = w->meta.model.n_neurons;
	/* Check the whole token first so a bad one leaves the file unchanged. */
	for (uint32_t l = 0; l < n_layers; l++) {
		if (n_active[l] > n_neurons)
			return nl_diag(NL_E_INVAL, "'%s': token %llu layer %u: %u active neurons, more "
				       "than the %u of the layer", w->path,
				       (unsigned long long)w->n_tokens, l, n_active[l], n_neurons);
		if (n_active[l] && !ids[l])
			return nl_diag(NL_E_INVAL, "'%s': token %llu layer %u: ids missing", w->path,
				       (unsigned long long)w->n_tokens, l);
		for (uint32_t i = 0; i < n_active[l]; i++) {
			if (ids[l][i] >= n_neurons || (i && ids[l][i] <= ids[l][i - 1]))
				return nl_diag(NL_E_INVAL, "'%s': token %llu layer %u: id %u at %u is "
					       "out of range or not increasing (need strictly "
					       "increasing ids < %u)", w->path,
					       (unsigned long long)w->n_tokens, l, ids[l][i], i,
					       n_neurons);
		}
	}
	w->mode = MODE_APPEND;
	for (uint32_t l = 0; l < n_layers; l++) {
		struct trace_layer *tl = &w->layers[l];

		if (stream_reserve(&tl->indices, n_active[l]))
			return nl_diag(-ENOMEM, "'%s': out of memory", w->path);
		memcpy((uint32_t *)tl->indices.buf + tl->indices.pending, ids[l],
		       (size_t)n_active[l] * sizeof(uint32_t));
		tl->indices.pending += n_active[l];
		tl->nnz += n_active[l];
		((uint64_t *)tl->indptr.buf)[tl->indptr.pending++] = tl->nnz;
		if (tl->indices.pending >= tl->indices.chunk) {
			err = stream_flush(&tl->indices, w->file, w->path, &w->opts, false);
			if (err)
				return err;
		}
		if (tl->indptr.pending >= tl->indptr.chunk) {
			err = stream_flush(&tl->indptr, w->file, w->path, &w->opts, false);
			if (err)
				return err;
		}
	}
	if (w->meta.has_sample_ids) {
		((uint32_t *)w->samples.buf)[w->samples.pending++] = sample_id;
		if (w->samples.pending >= w->samples.chunk) {
			err = stream_flush(&w->samples, w->file, w->path, &w->opts, false);
			if (err)
				return err;
		}
	}
	w->n_tokens++;
	return 0;
}

int nl_trace_write_layer(struct nl_trace_writer *w, uint32_t layer, const struct nl_csr *csr)
{
	char what[600];
	uint64_t dims[1];
	int err;

	if (!w || !csr)
		return nl_diag(NL_E_INVAL, "nl_trace_write_layer: writer and csr are required");
	if (w->mode == MODE_APPEND)
		return nl_diag(NL_E_INVAL, "'%s': nl_trace_write_layer after nl_trace_append; "
			       "use one of the two writers", w->path);
	if (layer != w->layers_written || layer >= w->meta.model.n_layers)
		return nl_diag(NL_E_INVAL, "'%s': layer %u written out of order, expected layer %u "
			       "of %u", w->path, layer, w->layers_written, w->meta.model.n_layers);
	if (csr->n_neurons != w->meta.model.n_neurons)
		return nl_diag(NL_E_INVAL, "'%s': layer %u CSR has %u neurons, the model has %u",
			       w->path, layer, csr->n_neurons, w->meta.model.n_neurons);
	if (layer > 0 && csr->n_tokens != w->n_tokens)
		return nl_diag(NL_E_INVAL, "'%s': layer %u has %llu tokens, layer 0 had %llu",
			       w->path, layer, (unsigned long long)csr->n_tokens,
			       (unsigned long long)w->n_tokens);
	if (w->samples_set && csr->n_tokens != w->n_tokens)
		return nl_diag(NL_E_INVAL, "'%s': layer %u has %llu tokens, the sample ids %llu",
			       w->path, layer, (unsigned long long)csr->n_tokens,
			       (unsigned long long)w->n_tokens);
	snprintf(what, sizeof(what), "'%s': layer %u", w->path, layer);
	err = nl_csr_validate(csr, what);
	if (err)
		return err == NL_E_FORMAT ? NL_E_INVAL : err;
	w->mode = MODE_LAYER;
	dims[0] = csr->n_tokens + 1;
	err = nl_h5_write_full(w->file, w->path, w->layers[layer].indptr_name, NL_H5_U64, 1, dims,
			       CHUNK_INDPTR, &w->opts, csr->indptr);
	if (err)
		return err;
	dims[0] = csr->indptr[csr->n_tokens];
	err = nl_h5_write_full(w->file, w->path, w->layers[layer].indices_name, NL_H5_U32, 1, dims,
			       CHUNK_INDICES, &w->opts, csr->indices);
	if (err)
		return err;
	w->layers[layer].nnz = dims[0];
	w->layers[layer].indptr.pending = 0;
	w->n_tokens = csr->n_tokens;
	w->layers_written++;
	return 0;
}

int nl_trace_set_sample_ids(struct nl_trace_writer *w, const uint32_t *ids, uint64_t n_tokens)
{
	uint64_t dims[1] = { n_tokens };
	int err;

	if (!w || (!ids && n_tokens))
		return nl_diag(NL_E_INVAL, "nl_trace_set_sample_ids: writer and ids are required");
	if (w->mode == MODE_APPEND || w->samples_set || !w->meta.has_sample_ids)
		return nl_diag(NL_E_INVAL, "'%s': sample ids are set once, with the layer writer, "
			       "and only when meta.has_sample_ids", w->path);
	if (w->layers_written && n_tokens != w->n_tokens)
		return nl_diag(NL_E_INVAL, "'%s': %llu sample ids for %llu tokens", w->path,
			       (unsigned long long)n_tokens, (unsigned long long)w->n_tokens);
	err = nl_h5_write_full(w->file, w->path, "sample_id", NL_H5_U32, 1, dims, CHUNK_SAMPLES,
			       &w->opts, ids);
	if (err)
		return err;
	w->mode = MODE_LAYER;
	w->samples_set = true;
	w->n_tokens = n_tokens;
	return 0;
}

static int finish_layers(struct nl_trace_writer *w, const double *threshold)
{
	uint32_t n_layers = w->meta.model.n_layers;
	int err = 0;

	if (w->mode == MODE_LAYER && w->layers_written != n_layers)
		return nl_diag(NL_E_INVAL, "'%s': only %u of %u layers written", w->path,
			       w->layers_written, n_layers);
	if (w->mode == MODE_LAYER && w->meta.has_sample_ids && !w->samples_set)
		return nl_diag(NL_E_INVAL, "'%s': meta.has_sample_ids but no sample ids were set",
			       w->path);
	if (w->meta.sparsity == NL_SPARSITY_THRESHOLD && !threshold)
		return nl_diag(NL_E_INVAL, "'%s': sparsity rule 'threshold' needs the per-layer "
			       "thresholds at finish", w->path);
	/* The reader refuses a threshold that is not finite and >= 0 (traces.md rule 16). */
	for (uint32_t l = 0; threshold && w->meta.sparsity == NL_SPARSITY_THRESHOLD &&
	     l < n_layers; l++)
		if (!isfinite(threshold[l]) || threshold[l] < 0)
			return nl_diag(NL_E_INVAL, "'%s': layer %u threshold is %g, expected a finite "
				       "value >= 0", w->path, l, threshold[l]);
	for (uint32_t l = 0; l < n_layers; l++) {
		struct trace_layer *tl = &w->layers[l];
		double cells = (double)w->n_tokens * w->meta.model.n_neurons;
		hid_t group;

		if (w->mode != MODE_LAYER) {
			err = stream_flush(&tl->indices, w->file, w->path, &w->opts, true);
			if (!err)
				err = stream_flush(&tl->indptr, w->file, w->path, &w->opts, true);
			if (err)
				return err;
		}
		group = H5Gopen2(w->file, tl->group, H5P_DEFAULT);
		if (group < 0)
			return nl_h5_fail(w->path, "cannot open group '%s'", tl->group);
		err = nl_h5_attr_put_f64(group, w->path, "density", cells > 0 ? tl->nnz / cells : 0.0);
		if (!err && w->meta.sparsity == NL_SPARSITY_THRESHOLD)
			err = nl_h5_attr_put_f64(group, w->path, "threshold", threshold[l]);
		H5Gclose(group);
		if (err)
			return err;
	}
	if (w->meta.has_sample_ids && w->mode != MODE_LAYER)
		err = stream_flush(&w->samples, w->file, w->path, &w->opts, true);
	if (!err)
		err = nl_h5_attr_put_u64(w->file, w->path, "n_tokens", w->n_tokens);
	return err;
}

int nl_trace_finish(struct nl_trace_writer *w, const double *threshold)
{
	int err;

	if (!w)
		return nl_diag(NL_E_INVAL, "nl_trace_finish: no writer");
	err = finish_layers(w, threshold);
	if (err)
		goto fail;
	for (uint32_t l = 0; l < w->meta.model.n_layers; l++) {
		w->layers[l].indptr.dset = nl_h5_close(w->layers[l].indptr.dset);
		w->layers[l].indices.dset = nl_h5_close(w->layers[l].indices.dset);
	}
	w->samples.dset = nl_h5_close(w->samples.dset);
	err = nl_h5_tmp_commit(&w->file, w->tmp, w->path);
	writer_free(w);
	return err;
fail:
	nl_h5_tmp_discard(&w->file, w->tmp);
	writer_free(w);
	return err;
}

void nl_trace_abort(struct nl_trace_writer *w)
{
	if (!w)
		return;
	nl_h5_tmp_discard(&w->file, w->tmp);
	writer_free(w);
}

/* ---- reader ---- */

void nl_trace_close(struct nl_trace_reader *r)
{
	if (!r)
		return;
	nl_h5_close(r->file);
	nl_trace_meta_free(&r->meta);
	free(r->nnz);
	free(r->path);
	free(r);
}

static int open_layer(struct nl_trace_reader *r, uint32_t l)
{
	char group_name[32], name[64];
	uint64_t dims[1];
	hid_t group = -1, dset = -1;
	double cells, expect;
	const char *file = r->path;
	struct nl_trace_meta *meta = &r->meta;
	int err;

	nl_h5_layer_name(group_name, sizeof(group_name), l);
	err = nl_h5_group_open(&group, r->file, file, group_name, FIX_TRACE);
	if (err)
		return err;
	snprintf(name, sizeof(name), "%s/indptr", group_name);
	dims[0] = meta->n_tokens + 1;
	err = nl_h5_dset_open(&dset, r->file, file, name, NL_H5_U64, 1, dims, NULL, FIX_TRACE);
	if (err)
		goto out;
	dset = nl_h5_close(dset);
	snprintf(name, sizeof(name), "%s/indices", group_name);
	dims[0] = NL_H5_ANY;
	err = nl_h5_dset_open(&dset, r->file, file, name, NL_H5_U32, 1, dims, &r->nnz[l],
			      FIX_TRACE);
	if (err)
		goto out;
	cells = (double)meta->n_tokens * meta->model.n_neurons;
	if ((double)r->nnz[l] > cells) {
		err = nl_diag(NL_E_SHAPE, "'%s': dataset '%s' has %llu entries, more than "
			      "n_tokens x n_neurons = %.0f; %s", file, name,
			      (unsigned long long)r->nnz[l], cells, FIX_TRACE);
		goto out;
	}
	err = nl_h5_attr_get_f64(group, file, group_name, "density", &meta->density[l]);
	if (err)
		goto out;
	expect = cells > 0 ? r->nnz[l] / cells : 0.0;
	if (!(fabs(meta->density[l] - expect) <= 1e-9)) {
		err = nl_diag(NL_E_FORMAT, "'%s': attribute 'density' of '%s' is %.9g, expected "
			      "%.9g (indices / (n_tokens x n_neurons)); %s", file, group_name,
			      meta->density[l], expect, FIX_TRACE);
		goto out;
	}
	if (meta->threshold) {
		err = nl_h5_attr_get_f64(group, file, group_name, "threshold", &meta->threshold[l]);
		if (err)
			goto out;
		if (!isfinite(meta->threshold[l]) || meta->threshold[l] < 0) {
			err = nl_diag(NL_E_FORMAT, "'%s': attribute 'threshold' of '%s' is %g, "
				      "expected a finite value >= 0; %s", file, group_name,
				      meta->threshold[l], FIX_TRACE);
			goto out;
		}
	}
out:
	nl_h5_close(dset);
	nl_h5_close(group);
	return err;
}

int nl_trace_open(struct nl_trace_reader **out, const char *path)
{
	struct nl_trace_reader *r;
	struct nl_trace_meta *meta;
	char sparsity[32];
	int err;

	*out = NULL;
	if (!path)
		return nl_diag(NL_E_INVAL, "nl_trace_open: no path");
	r = calloc(1, sizeof(*r));
	if (!r)
		return nl_diag(-ENOMEM, "'%s': out of memory", path);
	meta = &r->meta;
	err = nl_h5_open_header(&r->file, &r->path, path, TRACE_FORMAT, TRACE_MAJOR, &meta->model,
				NULL);
	if (!err)
		err = nl_h5_attr_get_str(r->file, path, "/", "dataset", meta->dataset,
					 sizeof(meta->dataset));
	if (!err)
		err = nl_h5_attr_get_str(r->file, path, "/", "sparsity", sparsity, sizeof(sparsity));
	if (err)
		goto fail;
	if (nl_sparsity_parse(&meta->sparsity, sparsity)) {
		err = nl_diag(NL_E_FORMAT, "'%s': root attribute 'sparsity' is '%s', expected relu, "
			      "threshold, topk or imported; %s", path, sparsity, FIX_TRACE);
		goto fail;
	}
	err = nl_h5_attr_get_f64(r->file, path, "/", "target_density", &meta->target_density);
	if (!err)
		err = nl_h5_attr_get_u64(r->file, path, "/", "n_tokens", &meta->n_tokens);
	if (err)
		goto fail;
	if (!(meta->target_density >= 0 && meta->target_density <= 1)) {
		err = nl_diag(NL_E_FORMAT, "'%s': root attribute 'target_density' is %g, expected "
			      "0..1; %s", path, meta->target_density, FIX_TRACE);
		goto fail;
	}
	if (meta->n_tokens >= UINT64_MAX / 16) {
		err = nl_diag(NL_E_FORMAT, "'%s': root attribute 'n_tokens' is %llu, too large; %s",
			      path, (unsigned long long)meta->n_tokens, FIX_TRACE);
		goto fail;
	}
	meta->density = calloc(meta->model.n_layers, sizeof(double));
	r->nnz = calloc(meta->model.n_layers, sizeof(uint64_t));
	if (meta->sparsity == NL_SPARSITY_THRESHOLD)
		meta->threshold = calloc(meta->model.n_layers, sizeof(double));
	if (!meta->density || !r->nnz ||
	    (meta->sparsity == NL_SPARSITY_THRESHOLD && !meta->threshold)) {
		err = nl_diag(-ENOMEM, "'%s': out of memory", path);
		goto fail;
	}
	for (uint32_t l = 0; l < meta->model.n_layers; l++) {
		err = open_layer(r, l);
		if (err)
			goto fail;
	}
	err = nl_h5_link_exists(r->file, path, "sample_id");
	if (err < 0)
		goto fail;
	if (err) {
		uint64_t dims[1] = { meta->n_tokens };
		hid_t dset;

		err = nl_h5_dset_open(&dset, r->file, path, "sample_id", NL_H5_U32, 1, dims, NULL,
				      FIX_TRACE);
		if (err)
			goto fail;
		H5Dclose(dset);
		meta->has_sample_ids = true;
	}
	*out = r;
	return 0;
fail:
	nl_trace_close(r);
	return err;
}

const struct nl_trace_meta *nl_trace_get_meta(const struct nl_trace_reader *r)
{
	return &r->meta;
}

int nl_trace_read_layer(struct nl_trace_reader *r, uint32_t layer, struct nl_csr *out)
{
	char name[64], what[600];
	uint64_t dims[1];
	uint64_t *indptr = NULL;
	uint32_t *indices = NULL;
	uint64_t n_tokens;
	int err;

	memset(out, 0, sizeof(*out));
	if (!r || layer >= r->meta.model.n_layers)
		return nl_diag(NL_E_INVAL, "'%s': layer %u out of range, the file has %u layers",
			       r ? r->path : "?", layer, r ? r->meta.model.n_layers : 0);
	n_tokens = r->meta.n_tokens;
	snprintf(name, sizeof(name), "layer_%03u/indptr", layer);
	dims[0] = n_tokens + 1;
	err = nl_h5_read_alloc(r->file, r->path, name, NL_H5_U64, 1, dims, (void **)&indptr,
			       FIX_TRACE);
	if (err)
		return err;
	/* Check the offsets against the indices before trusting them for sizes. */
	if (indptr[n_tokens] != r->nnz[layer]) {
		err = nl_diag(NL_E_FORMAT, "'%s': dataset '%s' ends at %llu, but 'layer_%03u/indices' "
			      "has %llu entries; %s", r->path, name,
			      (unsigned long long)indptr[n_tokens], layer,
			      (unsigned long long)r->nnz[layer], FIX_TRACE);
		goto fail;
	}
	snprintf(name, sizeof(name), "layer_%03u/indices", layer);
	dims[0] = r->nnz[layer];
	err = nl_h5_read_alloc(r->file, r->path, name, NL_H5_U32, 1, dims, (void **)&indices,
			       FIX_TRACE);
	if (err)
		goto fail;
	out->n_tokens = n_tokens;
	out->n_neurons = r->meta.model.n_neurons;
	out->indptr = indptr;
	out->indices = indices;
	snprintf(what, sizeof(what), "'%s': layer_%03u", r->path, layer);
	err = nl_csr_validate(out, what);
	if (err) {
		nl_csr_free(out);
		return err;
	}
	return 0;
fail:
	free(indptr);
	free(indices);
	return err;
}

int nl_trace_read_sample_ids(struct nl_trace_reader *r, uint32_t **out)
{
	uint64_t dims[1];

	*out = NULL;
	if (!r)
		return nl_diag(NL_E_INVAL, "nl_trace_read_sample_ids: no reader");
	if (!r->meta.has_sample_ids)
		return nl_diag(NL_E_MISSING, "'%s': the trace has no 'sample_id' dataset; re-run "
			       "nl-profile with sample ids to split by sample", r->path);
	dims[0] = r->meta.n_tokens;
	return nl_h5_read_alloc(r->file, r->path, "sample_id", NL_H5_U32, 1, dims, (void **)out,
				FIX_TRACE);
}
