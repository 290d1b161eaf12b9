/*
 * Placements (docs/formats/placement.md): per layer the permutation
 * position -> neuron id, its inverse, and the algorithm, parameters and
 * objective value that produced it (Neuralink section 4.2).
 */
#include "nl_h5.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLACE_FORMAT "neuralink-placement"
#define PLACE_MAJOR 1
#define PLACE_MINOR 0

#define CHUNK_PERM (256u * 1024)        /* u32: 1 MiB */

#define FIX_PLACE "re-run nl-place to re-create the placement"

struct nl_placement_writer {
	char *path;
	char *tmp;
	hid_t file;
	struct nl_placement_meta meta;
	struct nl_h5_opts opts;
	bool *written;
};

struct nl_placement_reader {
	char *path;
	hid_t file;
	struct nl_placement_meta meta;
};

static int check_range(const struct nl_placement_meta *meta, const char *path, int code)
{
	return nl_h5_check_layer_range(path, meta->model.n_layers, meta->layer_first,
				       meta->layer_count, code,
				       code == NL_E_FORMAT ? FIX_PLACE : NULL);
}

/* ---- writer ---- */

static void writer_free(struct nl_placement_writer *w)
{
	if (!w)
		return;
	nl_h5_close(w->file);
	free(w->written);
	free(w->path);
	free(w->tmp);
	free(w);
}

int nl_placement_create(struct nl_placement_writer **out, const char *path,
			const struct nl_placement_meta *meta, const struct nl_h5_opts *opts)
{
	static const struct nl_h5_opts default_opts = { NL_COMPRESS_ZSTD, 0 };
	struct nl_placement_writer *w;
	int err;

	*out = NULL;
	if (!path || !meta)
		return nl_diag(NL_E_INVAL, "nl_placement_create: path and meta are required");
	err = nl_h5_check_model(&meta->model, path);
	if (!err)
		err = check_range(meta, path, NL_E_INVAL);
	if (err)
		return err;
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
	err = nl_h5_put_header(w->file, path, PLACE_FORMAT, PLACE_MAJOR, PLACE_MINOR, &meta->model);
	if (!err)
		err = nl_h5_attr_put_str(w->file, path, "dataset", meta->dataset);
	if (!err)
		err = nl_h5_attr_put_u32(w->file, path, "layer_first", meta->layer_first);
	if (!err)
		err = nl_h5_attr_put_u32(w->file, path, "layer_count", meta->layer_count);
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

int nl_placement_write_layer(struct nl_placement_writer *w, uint32_t layer,
			     const struct nl_placement_layer *p)
{
	char group_name[32], what[600];
	uint64_t dims[1];
	hid_t group;
	int err;

	if (!w || !p)
		return nl_diag(NL_E_INVAL, "nl_placement_write_layer: writer and layer are required");
	err = nl_h5_check_layer_arg(w->path, w->meta.layer_first, w->meta.layer_count, layer,
				    w->written);
	if (err)
		return err;
	if (p->n_neurons != w->meta.model.n_neurons)
		return nl_diag(NL_E_INVAL, "'%s': layer %u placement has %u neurons, the model %u",
			       w->path, layer, p->n_neurons, w->meta.model.n_neurons);
	if (!memchr(p->algo, '\0', sizeof(p->algo)) || !p->algo[0] ||
	    !memchr(p->params, '\0', sizeof(p->params)))
		return nl_diag(NL_E_INVAL, "'%s': layer %u: algo must be a non-empty string and "
			       "params a NUL-terminated one", w->path, layer);
	snprintf(what, sizeof(what), "'%s': layer %u", w->path, layer);
	err = nl_placement_validate(p, what);
	if (err)
		return err == NL_E_FORMAT ? NL_E_INVAL : err;
	nl_h5_layer_name(group_name, sizeof(group_name), layer);
	err = nl_h5_group_create(&group, w->file, w->path, group_name);
	if (err)
		return err;
	dims[0] = p->n_neurons;
	err = nl_h5_write_full(group, w->path, "perm", NL_H5_U32, 1, dims, CHUNK_PERM, &w->opts,
			       p->perm);
	if (!err)
		err = nl_h5_write_full(group, w->path, "inv", NL_H5_U32, 1, dims, CHUNK_PERM,
				       &w->opts, p->inv);
	if (!err)
		err = nl_h5_attr_put_str(group, w->path, "algo", p->algo);
	if (!err)
		err = nl_h5_attr_put_str(group, w->path, "params", p->params);
	if (!err)
		err = nl_h5_attr_put_f64(group, w->path, "objective", p->objective);
	H5Gclose(group);
	if (!err)
		w->written[layer - w->meta.layer_first] = true;
	return err;
}

int nl_placement_finish(struct nl_placement_writer *w)
{
	int err;

	if (!w)
		return nl_diag(NL_E_INVAL, "nl_placement_finish: no writer");
	err = nl_h5_check_all_written(w->path, w->meta.layer_first, w->meta.layer_count,
				      w->written);
	if (err)
		nl_h5_tmp_discard(&w->file, w->tmp);
	else
		err = nl_h5_tmp_commit(&w->file, w->tmp, w->path);
	writer_free(w);
	return err;
}

void nl_placement_abort(struct nl_placement_writer *w)
{
	if (!w)
		return;
	nl_h5_tmp_discard(&w->file, w->tmp);
	writer_free(w);
}

/* ---- reader ---- */

void nl_placement_close(struct nl_placement_reader *r)
{
	if (!r)
		return;
	nl_h5_close(r->file);
	free(r->path);
	free(r);
}

int nl_placement_open(struct nl_placement_reader **out, const char *path)
{
	struct nl_placement_reader *r;
	struct nl_placement_meta *meta;
	int err;

	*out = NULL;
	if (!path)
		return nl_diag(NL_E_INVAL, "nl_placement_open: no path");
	r = calloc(1, sizeof(*r));
	if (!r)
		return nl_diag(-ENOMEM, "'%s': out of memory", path);
	meta = &r->meta;
	err = nl_h5_open_header(&r->file, &r->path, path, PLACE_FORMAT, PLACE_MAJOR, &meta->model,
				NULL);
	if (!err)
		err = nl_h5_attr_get_str(r->file, path, "/", "dataset", meta->dataset,
					 sizeof(meta->dataset));
	if (!err)
		err = nl_h5_attr_get_u32(r->file, path, "/", "layer_first", &meta->layer_first);
	if (!err)
		err = nl_h5_attr_get_u32(r->file, path, "/", "layer_count", &meta->layer_count);
	if (!err)
		err = check_range(meta, path, NL_E_FORMAT);
	if (!err)
		err = nl_h5_check_layer_groups(r->file, path, meta->layer_first,
					       meta->layer_count, FIX_PLACE);
	if (err)
		goto fail;
	*out = r;
	return 0;
fail:
	nl_placement_close(r);
	return err;
}

const struct nl_placement_meta *nl_placement_get_meta(const struct nl_placement_reader *r)
{
	return &r->meta;
}

int nl_placement_read_layer(struct nl_placement_reader *r, uint32_t layer,
			    struct nl_placement_layer *out)
{
	char group_name[32], name[64], what[600];
	const struct nl_placement_meta *meta;
	uint64_t dims[1];
	hid_t group = -1;
	int err;

	memset(out, 0, sizeof(*out));
	if (!r)
		return nl_diag(NL_E_INVAL, "nl_placement_read_layer: no reader");
	meta = &r->meta;
	err = nl_h5_check_layer_arg(r->path, meta->layer_first, meta->layer_count, layer, NULL);
	if (err)
		return err;
	nl_h5_layer_name(group_name, sizeof(group_name), layer);
	err = nl_h5_group_open(&group, r->file, r->path, group_name, FIX_PLACE);
	if (err)
		return err;
	out->n_neurons = meta->model.n_neurons;
	dims[0] = out->n_neurons;
	snprintf(name, sizeof(name), "%s/perm", group_name);
	err = nl_h5_read_alloc(r->file, r->path, name, NL_H5_U32, 1, dims, (void **)&out->perm,
			       FIX_PLACE);
	if (err)
		goto fail;
	snprintf(name, sizeof(name), "%s/inv", group_name);
	err = nl_h5_read_alloc(r->file, r->path, name, NL_H5_U32, 1, dims, (void **)&out->inv,
			       FIX_PLACE);
	if (!err)
		err = nl_h5_attr_get_str(group, r->path, group_name, "algo", out->algo,
					 sizeof(out->algo));
	if (!err)
		err = nl_h5_attr_get_str(group, r->path, group_name, "params", out->params,
					 sizeof(out->params));
	if (!err)
		err = nl_h5_attr_get_f64(group, r->path, group_name, "objective", &out->objective);
	if (err)
		goto fail;
	if (!out->algo[0]) {
		err = nl_diag(NL_E_FORMAT, "'%s': attribute 'algo' of '%s' is empty, expected the "
			      "algorithm name; %s", r->path, group_name, FIX_PLACE);
		goto fail;
	}
	snprintf(what, sizeof(what), "'%s': %s", r->path, group_name);
	err = nl_placement_validate(out, what);
	if (err)
		goto fail;
	H5Gclose(group);
	return 0;
fail:
	nl_h5_close(group);
	nl_placement_layer_free(out);
	return err;
}
