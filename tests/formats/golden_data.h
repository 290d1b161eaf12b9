/*
 * Deterministic contents shared by the golden-file generator (gen_golden.c)
 * and the tests (test_formats.c): the generator writes these into
 * tests/golden/ok/hdf5/ and the tests check the committed files still read
 * back exactly as these functions describe them.
 */
#ifndef NL_TEST_GOLDEN_DATA_H
#define NL_TEST_GOLDEN_DATA_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nl_formats.h"

#define GD_LAYERS 2
#define GD_NEURONS 24
#define GD_TOKENS 20
#define GD_K 4

static inline uint64_t gd_next(uint64_t *state)
{
	/* splitmix64: fixed, portable, good enough for test data */
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline void gd_model(struct nl_model_id *model)
{
	memset(model, 0, sizeof(*model));
	strcpy(model->name, "golden-tiny");
	model->n_layers = GD_LAYERS;
	model->d_model = 8;
	model->n_neurons = GD_NEURONS;
}

static inline void gd_trace_meta(struct nl_trace_meta *meta)
{
	memset(meta, 0, sizeof(*meta));
	gd_model(&meta->model);
	strcpy(meta->dataset, "golden-text");
	meta->sparsity = NL_SPARSITY_THRESHOLD;
	meta->target_density = 0.25;
	meta->has_sample_ids = true;
}

static const double gd_threshold[GD_LAYERS] = { 0.5, 0.75 };

/* Active ids of token t in layer l (increasing); returns the count. Token 3 is empty. */
static inline uint32_t gd_token(uint32_t layer, uint64_t t, uint32_t *ids)
{
	uint64_t state = 1000 * (layer + 1) + t;
	uint32_t n = 0;

	if (t == 3)
		return 0;
	for (uint32_t i = 0; i < GD_NEURONS; i++)
		if (gd_next(&state) % 4 == 0)
			ids[n++] = i;
	return n;
}

static inline uint32_t gd_sample_id(uint64_t t)
{
	return (uint32_t)(t / 7);
}

/* The CSR of one golden layer; the caller frees with nl_csr_free(). */
static inline int gd_csr(uint32_t layer, struct nl_csr *csr)
{
	uint32_t ids[GD_NEURONS];

	memset(csr, 0, sizeof(*csr));
	csr->n_tokens = GD_TOKENS;
	csr->n_neurons = GD_NEURONS;
	csr->indptr = calloc(GD_TOKENS + 1, sizeof(uint64_t));
	csr->indices = calloc((size_t)GD_TOKENS * GD_NEURONS, sizeof(uint32_t));
	if (!csr->indptr || !csr->indices)
		return -1;
	for (uint64_t t = 0; t < GD_TOKENS; t++) {
		uint32_t n = gd_token(layer, t, ids);

		memcpy(csr->indices + csr->indptr[t], ids, n * sizeof(uint32_t));
		csr->indptr[t + 1] = csr->indptr[t] + n;
	}
	return 0;
}

/*
 * Brute-force co-activation statistics of a CSR layer with top-k lists
 * (count desc, id asc; unused slots id UINT32_MAX, count 0). The reference
 * the formats tests write and compare against.
 */
static inline int gd_coact_from_csr_ranked(const struct nl_csr *csr, uint32_t k, bool with_pairs,
					   enum nl_coact_rank rank, struct nl_coact_layer *out)
{
	uint32_t n = csr->n_neurons;
	uint32_t *full;

	memset(out, 0, sizeof(*out));
	out->n_neurons = n;
	out->n_tokens = csr->n_tokens;
	out->k = k;
	out->rank = rank;
	out->count = calloc(n, sizeof(uint64_t));
	full = calloc((size_t)n * n, sizeof(uint32_t));
	if (!out->count || !full)
		goto fail;
	for (uint64_t t = 0; t < csr->n_tokens; t++) {
		for (uint64_t a = csr->indptr[t]; a < csr->indptr[t + 1]; a++) {
			uint32_t i = csr->indices[a];

			out->count[i]++;
			for (uint64_t b = a + 1; b < csr->indptr[t + 1]; b++) {
				uint32_t j = csr->indices[b];

				full[(size_t)i * n + j]++;
				full[(size_t)j * n + i]++;
			}
		}
	}
	if (with_pairs) {
		out->pairs = calloc(nl_tri_size(n) ? nl_tri_size(n) : 1, sizeof(uint32_t));
		if (!out->pairs)
			goto fail;
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t j = i + 1; j < n; j++)
				out->pairs[nl_tri_index(n, i, j)] = full[(size_t)i * n + j];
	}
	if (k) {
		out->topk_ids = malloc((size_t)n * k * sizeof(uint32_t));
		out->topk_counts = malloc((size_t)n * k * sizeof(uint32_t));
		if (!out->topk_ids || !out->topk_counts)
			goto fail;
		for (uint32_t i = 0; i < n; i++) {
			uint32_t *ids = out->topk_ids + (size_t)i * k;
			uint32_t *counts = out->topk_counts + (size_t)i * k;
			uint32_t filled = 0;

			/* selection: best not yet taken, count > 0; count ranking:
			 * count desc, id asc; norm: c/sqrt(f(i)f(j)) desc (compared
			 * as c^2 f(j') vs c'^2 f(j): small counts, exact in u64),
			 * then count desc, id asc */
			for (uint32_t s = 0; s < k; s++) {
				uint32_t best = UINT32_MAX, best_count = 0;

				for (uint32_t j = 0; j < n; j++) {
					uint32_t c = full[(size_t)i * n + j];
					bool taken = false;

					if (j == i || c == 0)
						continue;
					for (uint32_t q = 0; q < filled; q++)
						taken |= ids[q] == j;
					if (taken)
						continue;
					bool better = c > best_count;

					if (rank == NL_COACT_RANK_NORM && best != UINT32_MAX) {
						uint64_t a = (uint64_t)c * c * out->count[best];
						uint64_t b = (uint64_t)best_count * best_count * out->count[j];

						better = a > b || (a == b && c > best_count);
					}
					if (better) {
						best = j;
						best_count = c;
					}
				}
				ids[s] = best;
				counts[s] = best_count;
				if (best != UINT32_MAX)
					filled++;
			}
		}
	}
	free(full);
	return 0;
fail:
	free(full);
	nl_coact_layer_free(out);
	return -1;
}

static inline int gd_coact_from_csr(const struct nl_csr *csr, uint32_t k, bool with_pairs,
				    struct nl_coact_layer *out)
{
	return gd_coact_from_csr_ranked(csr, k, with_pairs, NL_COACT_RANK_COUNT, out);
}

/* Golden placement of layer l: a fixed permutation from a seeded shuffle. */
static inline int gd_placement(uint32_t layer, struct nl_placement_layer *p)
{
	uint64_t state = 77 + layer;

	memset(p, 0, sizeof(*p));
	p->n_neurons = GD_NEURONS;
	p->perm = malloc(GD_NEURONS * sizeof(uint32_t));
	p->inv = malloc(GD_NEURONS * sizeof(uint32_t));
	if (!p->perm || !p->inv)
		return -1;
	for (uint32_t i = 0; i < GD_NEURONS; i++)
		p->perm[i] = i;
	for (uint32_t i = GD_NEURONS - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(gd_next(&state) % (i + 1)), tmp = p->perm[i];

		p->perm[i] = p->perm[j];
		p->perm[j] = tmp;
	}
	for (uint32_t i = 0; i < GD_NEURONS; i++)
		p->inv[p->perm[i]] = i;
	p->objective = 1.25 + layer;
	strcpy(p->algo, "greedy");
	strcpy(p->params, "k=4 seed=77");
	return 0;
}

#endif
