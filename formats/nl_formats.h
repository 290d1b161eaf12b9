/*
 * On-disk formats of the neuralink pipeline: activation traces, co-activation
 * statistics and placements (HDF5), see docs/formats/. The flash image has its
 * own header, nl_image.h; model checkpoints are read through nl_model.h.
 *
 * Every reader validates what it reads and fails with a project error code and
 * a diagnostic (nl_err.h) that names the file, the dataset or attribute, the
 * value found and the value expected. Every writer writes to "<path>.tmp",
 * fsyncs and renames onto <path> only when the file is complete; *_abort()
 * removes the temporary file.
 */
#ifndef NL_FORMATS_H
#define NL_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nl_err.h"

#define NL_MAX_LAYERS 1024
#define NL_NAME_MAX 128

/* ---- shared pieces ---- */

/* Which model a file describes. Files that are combined must agree on it. */
struct nl_model_id {
	char name[NL_NAME_MAX];  /* e.g. "stories260K" */
	uint32_t n_layers;       /* transformer blocks */
	uint32_t d_model;        /* hidden size */
	uint32_t n_neurons;      /* FFN neurons per layer (all layers equal) */
};

/* HDF5 compression of the chunked datasets. */
enum nl_compress {
	NL_COMPRESS_ZSTD = 0,    /* HDF5 registered filter 32015, readable with hdf5plugin */
	NL_COMPRESS_DEFLATE = 1, /* gzip, readable everywhere */
	NL_COMPRESS_NONE = 2,
};

struct nl_h5_opts {
	enum nl_compress compress;
	int level;               /* 0 = codec default */
};

/* Parses "zstd", "zstd:19", "deflate", "deflate:6", "none". */
int nl_h5_opts_parse(struct nl_h5_opts *opts, const char *spec);

/*
 * One layer of a trace: compressed sparse rows, one row per token, holding the
 * ids of the active neurons in increasing order. indptr has n_tokens + 1 entries,
 * indptr[0] = 0, indices has indptr[n_tokens] entries, each < n_neurons.
 */
struct nl_csr {
	uint64_t n_tokens;
	uint32_t n_neurons;
	uint64_t *indptr;
	uint32_t *indices;
};

void nl_csr_free(struct nl_csr *csr);  /* frees the arrays, zeroes the struct */
/* Checks the invariants above; names `what` (file and layer) in the diagnostic. */
int nl_csr_validate(const struct nl_csr *csr, const char *what);

/* "<path>.tmp" into buf; -ENAMETOOLONG when it does not fit. */
int nl_tmp_path(char *buf, size_t size, const char *path);
/* fsync(tmp), rename(tmp, path), fsync the directory. */
int nl_commit_tmp(const char *tmp, const char *path);

/* ---- activation traces ---- */

enum nl_sparsity {
	NL_SPARSITY_RELU = 0,      /* exact zeros of the ReLU gate */
	NL_SPARSITY_THRESHOLD = 1, /* |act| > t_l, t_l calibrated per layer */
	NL_SPARSITY_TOPK = 2,      /* top fraction per token */
	NL_SPARSITY_IMPORTED = 3,  /* masks brought from another framework */
};
const char *nl_sparsity_name(enum nl_sparsity s);
int nl_sparsity_parse(enum nl_sparsity *s, const char *name);

struct nl_trace_meta {
	struct nl_model_id model;
	char dataset[NL_NAME_MAX];
	enum nl_sparsity sparsity;
	double target_density;     /* asked for (threshold/topk), 0 when not applicable */
	bool has_sample_ids;       /* optional per-token sample id dataset */
	/* Filled by the writer at finish and by the reader: */
	uint64_t n_tokens;
	double *density;           /* [n_layers] achieved active fraction; owned by the meta */
	double *threshold;         /* [n_layers] for NL_SPARSITY_THRESHOLD, else NULL */
};
void nl_trace_meta_free(struct nl_trace_meta *meta);

struct nl_trace_writer;

/*
 * Creates "<path>.tmp" with the root attributes of meta (density and threshold
 * are ignored here). Tokens are appended in order; each token contributes one
 * row to every layer.
 */
int nl_trace_create(struct nl_trace_writer **out, const char *path,
		    const struct nl_trace_meta *meta, const struct nl_h5_opts *opts);
/*
 * Appends one token: ids[l] holds n_active[l] active neuron ids of layer l in
 * increasing order. sample_id is stored when meta.has_sample_ids.
 */
int nl_trace_append(struct nl_trace_writer *w, const uint32_t *const *ids,
		    const uint32_t *n_active, uint32_t sample_id);
/*
 * Appends many tokens of one layer at once (for importers that go layer by
 * layer): layers must then be written in order 0..n_layers-1, each with the
 * same token count, and sample ids once through nl_trace_set_sample_ids().
 * Do not mix with nl_trace_append().
 */
int nl_trace_write_layer(struct nl_trace_writer *w, uint32_t layer, const struct nl_csr *csr);
int nl_trace_set_sample_ids(struct nl_trace_writer *w, const uint32_t *ids, uint64_t n_tokens);
/*
 * Writes the per-layer statistics (threshold may be NULL, except for the
 * 'threshold' rule, which needs n_layers finite values >= 0: NL_E_INVAL), flushes,
 * closes and renames onto the final path. Frees w in all cases.
 */
int nl_trace_finish(struct nl_trace_writer *w, const double *threshold);
/* Removes the temporary file and frees w. Accepts NULL. */
void nl_trace_abort(struct nl_trace_writer *w);

struct nl_trace_reader;
int nl_trace_open(struct nl_trace_reader **out, const char *path);
const struct nl_trace_meta *nl_trace_get_meta(const struct nl_trace_reader *r);
/* Reads one whole layer; the caller frees with nl_csr_free(). */
int nl_trace_read_layer(struct nl_trace_reader *r, uint32_t layer, struct nl_csr *out);
/* Reads the sample ids ([n_tokens], caller frees); -NL_E_MISSING style error when absent. */
int nl_trace_read_sample_ids(struct nl_trace_reader *r, uint32_t **out);
void nl_trace_close(struct nl_trace_reader *r);

/* ---- co-activation statistics ---- */

/*
 * Index of pair (i, j), i < j < n, in the packed upper triangle (row-major, the
 * diagonal excluded): row i holds pairs (i, i+1) .. (i, n-1).
 */
static inline uint64_t nl_tri_index(uint32_t n, uint32_t i, uint32_t j)
{
	return (uint64_t)i * n - (uint64_t)i * (i + 1) / 2 + (j - i - 1);
}
static inline uint64_t nl_tri_size(uint32_t n)
{
	return (uint64_t)n * (n - 1) / 2;
}

/*
 * Ranking of the top-K neighbour lists (docs/formats/coact.md, `topk_rank`).
 * Within row i, neighbour j ranks before j' when its score is larger, then
 * when f(i,j) is larger, then when its id is smaller:
 *  - COUNT: score f(i,j);
 *  - NORM:  score f(i,j) / sqrt(f(i) f(j)); f(i) is the same for the whole
 *    row, so it compares f(i,j)^2 / f(j), exactly, by cross-multiplication
 *    in 128-bit integers (f(i,j)^2 < 2^64, f(j) < 2^64).
 * Pairs with f(i,j) = 0 are never listed.
 */
enum nl_coact_rank {
	NL_COACT_RANK_COUNT = 0,
	NL_COACT_RANK_NORM = 1,
};

/*
 * Whether neighbour a (pair count ca, neuron count fa = f(a), id ida) ranks
 * strictly before neighbour b in the same row under rank. The one rule used
 * by nl-coact, the format's writer and reader checks and nl-place. Counts
 * must be > 0 and <= their f.
 */
static inline bool nl_coact_rank_before(enum nl_coact_rank rank, uint32_t ca, uint64_t fa,
					uint32_t ida, uint32_t cb, uint64_t fb, uint32_t idb)
{
	if (rank == NL_COACT_RANK_NORM) {
		__extension__ typedef unsigned __int128 u128;
		u128 lhs = (u128)((uint64_t)ca * ca) * fb, rhs = (u128)((uint64_t)cb * cb) * fa;

		if (lhs != rhs)
			return lhs > rhs;
	}
	return ca > cb || (ca == cb && ida < idb);
}

/* "count" or "norm". */
static inline const char *nl_coact_rank_name(enum nl_coact_rank rank)
{
	return rank == NL_COACT_RANK_NORM ? "norm" : "count";
}

/* Statistics of one layer (Neuralink section 4.1, equations 1-2). */
struct nl_coact_layer {
	uint32_t n_neurons;
	uint64_t n_tokens;        /* tokens counted */
	uint64_t *count;          /* [n] f(i): tokens in which neuron i was active */
	uint32_t *pairs;          /* [nl_tri_size(n)] f(i,j), or NULL when not stored/read */
	uint32_t k;               /* neighbours per neuron in the top-K lists, 0 when none */
	uint32_t *topk_ids;       /* [n * k] row i: the k neurons most co-active with i, in `rank` order */
	uint32_t *topk_counts;    /* [n * k] their f(i,j); unused slots have count 0 and id UINT32_MAX */
	enum nl_coact_rank rank;  /* how the top-K rows are ordered (0 = count, the 1.0 rule) */
};
void nl_coact_layer_free(struct nl_coact_layer *layer);

struct nl_coact_meta {
	struct nl_model_id model;
	char dataset[NL_NAME_MAX];
	uint32_t layer_first;     /* layers present: [layer_first, layer_first + layer_count) */
	uint32_t layer_count;
	uint64_t n_tokens;
	bool has_pairs;           /* the dense triangle is stored */
	uint32_t k;
	enum nl_coact_rank rank;  /* ranking of the top-K lists (root attribute topk_rank) */
};

struct nl_coact_writer;
int nl_coact_create(struct nl_coact_writer **out, const char *path,
		    const struct nl_coact_meta *meta, const struct nl_h5_opts *opts);
/* Layers may be written in any order, each once, all within the meta's range. */
int nl_coact_write_layer(struct nl_coact_writer *w, uint32_t layer, const struct nl_coact_layer *stats);
int nl_coact_finish(struct nl_coact_writer *w);   /* fails when a layer is missing; frees w */
void nl_coact_abort(struct nl_coact_writer *w);

struct nl_coact_reader;
int nl_coact_open(struct nl_coact_reader **out, const char *path);
const struct nl_coact_meta *nl_coact_get_meta(const struct nl_coact_reader *r);
/* Reads one layer without touching the others; the triangle only when want_pairs. */
int nl_coact_read_layer(struct nl_coact_reader *r, uint32_t layer, bool want_pairs,
			struct nl_coact_layer *out);
void nl_coact_close(struct nl_coact_reader *r);

/* ---- placements ---- */

struct nl_placement_layer {
	uint32_t n_neurons;
	uint32_t *perm;           /* [n] position -> neuron id */
	uint32_t *inv;            /* [n] neuron id -> position */
	double objective;         /* sum over adjacent positions of f(perm[p], perm[p+1]) / n_tokens */
	char algo[32];            /* "identity", "frequency", "greedy", "greedy-sparse", "refine" */
	char params[256];         /* e.g. "k=32 time_limit=10" */
};
void nl_placement_layer_free(struct nl_placement_layer *layer);
/* Checks perm is a permutation of 0..n-1 and inv its inverse. */
int nl_placement_validate(const struct nl_placement_layer *layer, const char *what);

struct nl_placement_meta {
	struct nl_model_id model;
	char dataset[NL_NAME_MAX]; /* the statistics it was computed from */
	uint32_t layer_first;
	uint32_t layer_count;
};

struct nl_placement_writer;
int nl_placement_create(struct nl_placement_writer **out, const char *path,
			const struct nl_placement_meta *meta, const struct nl_h5_opts *opts);
int nl_placement_write_layer(struct nl_placement_writer *w, uint32_t layer,
			     const struct nl_placement_layer *layer_data);
int nl_placement_finish(struct nl_placement_writer *w);
void nl_placement_abort(struct nl_placement_writer *w);

struct nl_placement_reader;
int nl_placement_open(struct nl_placement_reader **out, const char *path);
const struct nl_placement_meta *nl_placement_get_meta(const struct nl_placement_reader *r);
int nl_placement_read_layer(struct nl_placement_reader *r, uint32_t layer,
			    struct nl_placement_layer *out);
void nl_placement_close(struct nl_placement_reader *r);

#endif
