/*
 * Co-activation statistics (docs/formats/coact.md): per layer the activation
 * counts f(i), the pair counts f(i,j) as a packed upper triangle, and the
 * top-K neighbour lists (Neuralink section 4.1, equations 1-2).
 *
 * Each layer lives in its own group and nl_coact_read_layer() opens only
 * that group. The triangle of a 16384-neuron layer is 134M u32 (512 MiB):
 * it is stored in 1M-element (4 MiB) chunks and read straight into the
 * caller's array.
 */
#include "nl_h5.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COACT_FORMAT "neuralink-coact"
#define COACT_MAJOR 1
#define COACT_MINOR 1   /* 1.1: root attribute topk_rank */

#define CHUNK_COUNT (128u * 1024)       /* u64: 1 MiB */
#define CHUNK_PAIRS (1024u * 1024)      /* u32: 4 MiB */
#define CHUNK_TOPK_ELEMS (256u * 1024)  /* u32 per top-K chunk: 1 MiB */

#define FIX_COACT "re-run nl-coact to re-create the statistics"

struct nl_coact_writer {
	char *path;
	char *tmp;
	hid_t file;
	struct nl_coact_meta meta;
	struct nl_h5_opts opts;
	bool *written;               /* [layer_count] */
};

struct nl_coact_reader {
	char *path;
	hid_t file;
	struct nl_coact_meta meta;
};

/*
 * Checks one layer's statistics against the spec's rules. `what` names
 * file and layer; `err_code` is NL_E_FORMAT for files, NL_E_INVAL for writer
 * input. pairs may be NULL.
 */
static int check_layer(const struct nl_coact_layer *s, const char *what, int err_code,
		       const char *fix)
{
	uint32_t n = s->n_neurons, k = s->k;

	for (uint32_t i = 0; i < n; i++) {
		if (s->count[i] > s->n_tokens)
			return nl_diag(err_code, "%s: count[%u] is %llu, more than the %llu tokens "
				       "counted; %s", what, i, (unsigned long long)s->count[i],
				       (unsigned long long)s->n_tokens, fix);
	}
	for (uint32_t i = 0; i < n && k; i++) {
		const uint32_t *ids = s->topk_ids + (uint64_t)i * k;
		const uint32_t *counts = s->topk_counts + (uint64_t)i * k;

		for (uint32_t j = 0; j < k; j++) {
			uint32_t id = ids[j], c = counts[j];

			if (id == UINT32_MAX) {
				if (c != 0)
					return nl_diag(err_code, "%s: topk row %u slot %u is unused (id "
						       "UINT32_MAX) but has count %u, expected 0; %s",
						       what, i, j, c, fix);
				continue;
			}
			if (id >= n || id == i)
				return nl_diag(err_code, "%s: topk_ids[%u][%u] is %u, expected a "
					       "neuron id < %u other than %u; %s", what, i, j, id, n,
					       i, fix);
			if (c > s->count[i] || c > s->count[id])
				return nl_diag(err_code, "%s: topk_counts[%u][%u] is %u, more than "
					       "f(%u) = %llu or f(%u) = %llu; %s", what, i, j, c, i,
					       (unsigned long long)s->count[i], id,
					       (unsigned long long)s->count[id], fix);
			if (j > 0 && (ids[j - 1] == UINT32_MAX ||
				      !nl_coact_rank_before(s->rank, counts[j - 1],
							    s->count[ids[j - 1]], ids[j - 1], c,
							    s->count[id], id)))
				return nl_diag(err_code, "%s: topk row %u is not in '%s' order (%s "
					       "descending, then id ascending) at slot %u (id:count "
					       "%u:%u after %u:%u); %s", what, i,
					       nl_coact_rank_name(s->rank), s->rank == NL_COACT_RANK_NORM ?
					       "f(i,j)/sqrt(f(i)f(j)), then f(i,j)" : "f(i,j)", j, id, c,
					       ids[j - 1], counts[j - 1], fix);
			if (c == 0)
				return nl_diag(err_code, "%s: topk_counts[%u][%u] is 0 for neuron %u; "
					       "pairs that never co-occur are not listed (id %u "
					       "expected); %s", what, i, j, id, UINT32_MAX, fix);
			if (s->pairs) {
				uint64_t at = i < id ? nl_tri_index(n, i, id) : nl_tri_index(n, id, i);

				if (s->pairs[at] != c)
					return nl_diag(err_code, "%s: topk_counts[%u][%u] is %u but "
						       "f(%u,%u) in 'pairs' is %u; %s", what, i, j, c, i,
						       id, s->pairs[at], fix);
			}
		}
	}
	if (s->pairs) {
		const uint32_t *row = s->pairs;

		for (uint32_t i = 0; i + 1 < n; i++) {
			uint64_t ci = s->count[i];
			int bad = 0;

			/* Branch-free scan of the row (vectorizes); rescan only when it fails. */
			for (uint32_t j = i + 1; j < n; j++)
				bad |= (row[j - i - 1] > ci) | (row[j - i - 1] > s->count[j]);
			for (uint32_t j = i + 1; bad && j < n; j++) {
				uint32_t c = row[j - i - 1];

				if (c > ci || c > s->count[j])
					return nl_diag(err_code, "%s: pairs f(%u,%u) is %u, more than "
						       "f(%u) = %llu or f(%u) = %llu; %s", what, i, j, c,
						       i, (unsigned long long)ci, j,
						       (unsigned long long)s->count[j], fix);
			}
			row += n - i - 1;
		}
	}
	return 0;
}

/* ---- writer ---- */

static void writer_free(struct nl_coact_writer *w)
{
	if (!w)
		return;
	nl_h5_close(w->file);
	free(w->written);
	free(w->path);
	free(w->tmp);
	free(w);
}

int nl_coact_create(struct nl_coact_writer **out, const char *path,
		    const struct nl_coact_meta *meta, const struct nl_h5_opts *opts)
{
	static const struct nl_h5_opts default_opts = { NL_COMPRESS_ZSTD, 0 };
	struct nl_coact_writer *w;
	int err;

	*out = NULL;
	if (!path || !meta)
		return nl_diag(NL_E_INVAL, "nl_coact_create: path and meta are required");
	err = nl_h5_check_model(&meta->model, path);
	if (!err)
		err = nl_h5_check_layer_range(path, meta->model.n_layers, meta->layer_first,
					      meta->layer_count, NL_E_INVAL, NULL);
	if (err)
		return err;
	if (meta->k > meta->model.n_neurons)
		return nl_diag(NL_E_INVAL, "'%s': k = %u exceeds the %u neurons", path, meta->k,
			       meta->model.n_neurons);
	if (meta->has_pairs && meta->model.n_neurons < 2)
		return nl_diag(NL_E_INVAL, "'%s': pairs need at least 2 neurons", path);
	if (meta->rank != NL_COACT_RANK_COUNT && meta->rank != NL_COACT_RANK_NORM)
		return nl_diag(NL_E_INVAL, "'%s': top-K ranking %d unknown, expected count (%d) or "
			       "norm (%d)", path, (int)meta->rank, NL_COACT_RANK_COUNT,
			       NL_COACT_RANK_NORM);
	if (!memchr(meta->dataset, '\0', sizeof(meta->dataset)))
		return nl_diag(NL_E_INVAL, "'%s': dataset name is not NUL-terminated", path);
	w = calloc(1, sizeof(*w));
	if (!w)
		return nl_diag(-ENOMEM, "'%s': out of memory", path);
	w->file = -1;
	w->meta = *meta;
	w->opts = opts ? *opts : default_opts;
	w->written = calloc(meta->layer_count, sizeof(bool));
	if (!w->written) {
		err = nl_diag(-ENOMEM, "'%s': out of memory", path);
		goto fail;
	}
	err = nl_h5_tmp_create(&w->file, &w->path, &w->tmp, path);
	if (err)
		goto fail;
	err = nl_h5_put_header(w->file, path, COACT_FORMAT, COACT_MAJOR, COACT_MINOR, &meta->model);
	if (!err)
		err = nl_h5_attr_put_str(w->file, path, "dataset", meta->dataset);
	if (!err)
		err = nl_h5_attr_put_u32(w->file, path, "layer_first", meta->layer_first);
	if (!err)
		err = nl_h5_attr_put_u32(w->file, path, "layer_count", meta->layer_count);
	if (!err)
		err = nl_h5_attr_put_u64(w->file, path, "n_tokens", meta->n_tokens);
	if (!err)
		err = nl_h5_attr_put_u32(w->file, path, "k", meta->k);
	if (!err)
		err = nl_h5_attr_put_u32(w->file, path, "has_pairs", meta->has_pairs ? 1 : 0);
	if (!err)
		err = nl_h5_attr_put_str(w->file, path, "topk_rank", nl_coact_rank_name(meta->rank));
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

int nl_coact_write_layer(struct nl_coact_writer *w, uint32_t layer, const struct nl_coact_layer *s)
{
	char group_name[32], what[600];
	uint64_t dims[2];
	uint32_t n;
	hid_t group = -1;
	int err;

	if (!w || !s)
		return nl_diag(NL_E_INVAL, "nl_coact_write_layer: writer and stats are required");
	n = w->meta.model.n_neurons;
	err = nl_h5_check_layer_arg(w->path, w->meta.layer_first, w->meta.layer_count, layer,
				    w->written);
	if (err)
		return err;
	if (s->n_neurons != n || s->n_tokens != w->meta.n_tokens || s->k != w->meta.k)
		return nl_diag(NL_E_INVAL, "'%s': layer %u has n=%u tokens=%llu k=%u, the file "
			       "expects n=%u tokens=%llu k=%u", w->path, layer, s->n_neurons,
			       (unsigned long long)s->n_tokens, s->k, n,
			       (unsigned long long)w->meta.n_tokens, w->meta.k);
	if (s->k && s->rank != w->meta.rank)
		return nl_diag(NL_E_INVAL, "'%s': layer %u has top-K lists ranked by %s, the file "
			       "declares %s; recompute them with nl_coact_topk()", w->path, layer,
			       nl_coact_rank_name(s->rank), nl_coact_rank_name(w->meta.rank));
	if (!s->count || (w->meta.has_pairs && !s->pairs) ||
	    (s->k && (!s->topk_ids || !s->topk_counts)))
		return nl_diag(NL_E_INVAL, "'%s': layer %u is missing count, pairs or top-K arrays",
			       w->path, layer);
	snprintf(what, sizeof(what), "'%s': layer %u", w->path, layer);
	{
		struct nl_coact_layer view = *s;

		if (!w->meta.has_pairs)
			view.pairs = NULL;
		err = check_layer(&view, what, NL_E_INVAL, "fix the statistics");
		if (err)
			return err;
	}
	nl_h5_layer_name(group_name, sizeof(group_name), layer);
	err = nl_h5_group_create(&group, w->file, w->path, group_name);
	if (err)
		return err;
	err = nl_h5_attr_put_u64(group, w->path, "n_tokens", s->n_tokens);
	dims[0] = n;
	if (!err)
		err = nl_h5_write_full(group, w->path, "count", NL_H5_U64, 1, dims, CHUNK_COUNT,
				       &w->opts, s->count);
	if (!err && w->meta.has_pairs) {
		dims[0] = nl_tri_size(n);
		err = nl_h5_write_full(group, w->path, "pairs", NL_H5_U32, 1, dims, CHUNK_PAIRS,
				       &w->opts, s->pairs);
	}
	if (!err && s->k) {
		uint64_t rows = CHUNK_TOPK_ELEMS / s->k;

		dims[0] = n;
		dims[1] = s->k;
		err = nl_h5_write_full(group, w->path, "topk_ids", NL_H5_U32, 2, dims, rows,
				       &w->opts, s->topk_ids);
		if (!err)
			err = nl_h5_write_full(group, w->path, "topk_counts", NL_H5_U32, 2, dims, rows,
					       &w->opts, s->topk_counts);
	}
	H5Gclose(group);
	if (!err)
		w->written[layer - w->meta.layer_first] = true;
	return err;
}

int nl_coact_finish(struct nl_coact_writer *w)
{
	int err;

	if (!w)
		return nl_diag(NL_E_INVAL, "nl_coact_finish: no writer");
	err = nl_h5_check_all_written(w->path, w->meta.layer_first, w->meta.layer_count,
				      w->written);
	if (err)
		nl_h5_tmp_discard(&w->file, w->tmp);
	else
		err = nl_h5_tmp_commit(&w->file, w->tmp, w->path);
	writer_free(w);
	return err;
}

void nl_coact_abort(struct nl_coact_writer *w)
{
	if (!w)
		return;
	nl_h5_tmp_discard(&w->file, w->tmp);
	writer_free(w);
}

/* ---- reader ---- */

void nl_coact_close(struct nl_coact_reader *r)
{
	if (!r)
		return;
	nl_h5_close(r->file);
	free(r->path);
	free(r);
}

int nl_coact_open(struct nl_coact_reader **out, const char *path)
{
	struct nl_coact_reader *r;
	struct nl_coact_meta *meta;
	uint32_t has_pairs = 0, minor = 0;
	char rank[NL_NAME_MAX];
	int err;

	*out = NULL;
	if (!path)
		return nl_diag(NL_E_INVAL, "nl_coact_open: no path");
	r = calloc(1, sizeof(*r));
	if (!r)
		return nl_diag(-ENOMEM, "'%s': out of memory", path);
	meta = &r->meta;
	err = nl_h5_open_header(&r->file, &r->path, path, COACT_FORMAT, COACT_MAJOR, &meta->model,
				&minor);
	if (!err)
		err = nl_h5_attr_get_str(r->file, path, "/", "dataset", meta->dataset,
					 sizeof(meta->dataset));
	if (!err)
		err = nl_h5_attr_get_u32(r->file, path, "/", "layer_first", &meta->layer_first);
	if (!err)
		err = nl_h5_attr_get_u32(r->file, path, "/", "layer_count", &meta->layer_count);
	if (!err)
		err = nl_h5_attr_get_u64(r->file, path, "/", "n_tokens", &meta->n_tokens);
	if (!err)
		err = nl_h5_attr_get_u32(r->file, path, "/", "k", &meta->k);
	if (!err)
		err = nl_h5_attr_get_u32(r->file, path, "/", "has_pairs", &has_pairs);
	if (err)
		goto fail;
	/* topk_rank: since 1.1; a 1.0 file without it was ranked by count */
	err = nl_h5_attr_exists(r->file, path, "/", "topk_rank");
	if (err < 0)
		goto fail;
	if (err == 0 && minor >= 1) {
		err = nl_diag(NL_E_MISSING, "'%s': root attribute 'topk_rank' is missing (required "
			      "since version 1.1, the file says 1.%u); %s", path, minor, FIX_COACT);
		goto fail;
	}
	meta->rank = NL_COACT_RANK_COUNT;
	if (err == 1) {
		err = nl_h5_attr_get_str(r->file, path, "/", "topk_rank", rank, sizeof(rank));
		if (err)
			goto fail;
		if (strcmp(rank, "norm") == 0) {
			meta->rank = NL_COACT_RANK_NORM;
		} else if (strcmp(rank, "count") != 0) {
			err = nl_diag(NL_E_FORMAT, "'%s': root attribute 'topk_rank' is '%s', expected "
				      "'norm' or 'count'; %s", path, rank, FIX_COACT);
			goto fail;
		}
	}
	err = nl_h5_check_layer_range(path, meta->model.n_layers, meta->layer_first,
				      meta->layer_count, NL_E_FORMAT, FIX_COACT);
	if (err)
		goto fail;
	if (has_pairs > 1) {
		err = nl_diag(NL_E_FORMAT, "'%s': root attribute 'has_pairs' is %u, expected 0 or 1; "
			      "%s", path, has_pairs, FIX_COACT);
		goto fail;
	}
	if (meta->k > meta->model.n_neurons) {
		err = nl_diag(NL_E_FORMAT, "'%s': root attribute 'k' is %u, more than n_neurons = "
			      "%u; %s", path, meta->k, meta->model.n_neurons, FIX_COACT);
		goto fail;
	}
	meta->has_pairs = has_pairs;
	/* Only the links are checked here: the layers' data stay unread. */
	err = nl_h5_check_layer_groups(r->file, path, meta->layer_first, meta->layer_count,
				       FIX_COACT);
	if (err)
		goto fail;
	*out = r;
	return 0;
fail:
	nl_coact_close(r);
	return err;
}

const struct nl_coact_meta *nl_coact_get_meta(const struct nl_coact_reader *r)
{
	return &r->meta;
}

int nl_coact_read_layer(struct nl_coact_reader *r, uint32_t layer, bool want_pairs,
			struct nl_coact_layer *out)
{
	char group_name[32], name[64], what[600];
	const struct nl_coact_meta *meta;
	uint64_t dims[2], n_tokens;
	hid_t group = -1;
	uint32_t n;
	int err;

	memset(out, 0, sizeof(*out));
	if (!r)
		return nl_diag(NL_E_INVAL, "nl_coact_read_layer: no reader");
	meta = &r->meta;
	n = meta->model.n_neurons;
	err = nl_h5_check_layer_arg(r->path, meta->layer_first, meta->layer_count, layer, NULL);
	if (err)
		return err;
	if (want_pairs && !meta->has_pairs)
		return nl_diag(NL_E_MISSING, "'%s': the file has no pair counts ('has_pairs' is 0); "
			       "re-run nl-coact with the dense triangle enabled", r->path);
	nl_h5_layer_name(group_name, sizeof(group_name), layer);
	err = nl_h5_group_open(&group, r->file, r->path, group_name, FIX_COACT);
	if (err)
		return err;
	err = nl_h5_attr_get_u64(group, r->path, group_name, "n_tokens", &n_tokens);
	if (err)
		goto fail;
	if (n_tokens != meta->n_tokens) {
		err = nl_diag(NL_E_FORMAT, "'%s': attribute 'n_tokens' of '%s' is %llu, the root "
			      "says %llu; %s", r->path, group_name, (unsigned long long)n_tokens,
			      (unsigned long long)meta->n_tokens, FIX_COACT);
		goto fail;
	}
	out->n_neurons = n;
	out->n_tokens = n_tokens;
	out->k = meta->k;
	out->rank = meta->rank;
	snprintf(name, sizeof(name), "%s/count", group_name);
	dims[0] = n;
	err = nl_h5_read_alloc(r->file, r->path, name, NL_H5_U64, 1, dims, (void **)&out->count,
			       FIX_COACT);
	if (err)
		goto fail;
	if (meta->k) {
		dims[1] = meta->k;
		snprintf(name, sizeof(name), "%s/topk_ids", group_name);
		err = nl_h5_read_alloc(r->file, r->path, name, NL_H5_U32, 2, dims,
				       (void **)&out->topk_ids, FIX_COACT);
		if (err)
			goto fail;
		snprintf(name, sizeof(name), "%s/topk_counts", group_name);
		err = nl_h5_read_alloc(r->file, r->path, name, NL_H5_U32, 2, dims,
				       (void **)&out->topk_counts, FIX_COACT);
		if (err)
			goto fail;
	}
	if (want_pairs) {
		snprintf(name, sizeof(name), "%s/pairs", group_name);
		dims[0] = nl_tri_size(n);
		err = nl_h5_read_alloc(r->file, r->path, name, NL_H5_U32, 1, dims,
				       (void **)&out->pairs, FIX_COACT);
		if (err)
			goto fail;
	}
	snprintf(what, sizeof(what), "'%s': %s", r->path, group_name);
	err = check_layer(out, what, NL_E_FORMAT, FIX_COACT);
	if (err)
		goto fail;
	H5Gclose(group);
	return 0;
fail:
	nl_h5_close(group);
	nl_coact_layer_free(out);
	return err;
}
