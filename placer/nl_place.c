/*
 * The placer's entry point, the simple baselines, the weight lookup, the
 * top-K computation and input checks.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nl_coact.h"
#include "nl_place.h"
#include "nl_place_internal.h"

static const char *const algo_names[NL_PLACE_N_ALGOS] = {
	[NL_PLACE_IDENTITY] = "identity",
	[NL_PLACE_FREQUENCY] = "frequency",
	[NL_PLACE_GREEDY] = "greedy",
	[NL_PLACE_GREEDY_SPARSE] = "greedy-sparse",
	[NL_PLACE_REFINE] = "refine",
};

const char *nl_place_algo_name(enum nl_place_algo algo)
{
	if ((unsigned)algo >= NL_PLACE_N_ALGOS)
		return "?";
	return algo_names[algo];
}

int nl_place_algo_parse(enum nl_place_algo *out, const char *name)
{
	for (unsigned a = 0; a < NL_PLACE_N_ALGOS; a++) {
		if (strcmp(name, algo_names[a]) == 0) {
			*out = (enum nl_place_algo)a;
			return 0;
		}
	}
	return nl_diag(NL_E_INVAL, "unknown placement algorithm '%s'; expected one of "
		       "identity, frequency, greedy, greedy-sparse, refine", name);
}

void nl_place_opts_default(struct nl_place_opts *opts)
{
	memset(opts, 0, sizeof(*opts));
	opts->algo = NL_PLACE_GREEDY;
}

double nl_place_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int nl_place_check_stats(const struct nl_coact_layer *stats, const char *what)
{
	uint32_t n = stats->n_neurons;

	if (!what)
		what = "statistics";
	if (n == 0)
		return nl_diag(NL_E_FORMAT, "%s: n_neurons is 0, expected at least 1", what);
	if (!stats->count)
		return nl_diag(NL_E_MISSING, "%s: per-neuron counts f(i) are missing; re-run nl-coact", what);
	if (stats->k && (!stats->topk_ids || !stats->topk_counts))
		return nl_diag(NL_E_MISSING, "%s: k is %" PRIu32 " but the top-K lists are missing; "
			       "re-run nl-coact", what, stats->k);
	for (uint32_t i = 0; stats->k && i < n; i++) {
		const uint32_t *ids = stats->topk_ids + (uint64_t)i * stats->k;
		const uint32_t *cnt = stats->topk_counts + (uint64_t)i * stats->k;

		for (uint32_t r = 0; r < stats->k; r++) {
			if (cnt[r] == 0)
				continue;
			if (ids[r] >= n || ids[r] == i)
				return nl_diag(NL_E_FORMAT, "%s: top-K list of neuron %" PRIu32
					       " entry %" PRIu32 " names neuron %" PRIu32 " (count %" PRIu32
					       "), expected another neuron id < %" PRIu32 "; re-run nl-coact",
					       what, i, r, ids[r], cnt[r], n);
		}
	}
	return 0;
}

/* ---- baselines ---- */

struct freq_key {
	uint64_t count;
	uint32_t id;
};

static int freq_cmp(const void *a, const void *b)
{
	const struct freq_key *x = a, *y = b;

	if (x->count != y->count)
		return x->count > y->count ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

int nl_place_frequency(const struct nl_coact_layer *stats, uint32_t *perm)
{
	uint32_t n = stats->n_neurons;
	struct freq_key *keys = malloc((size_t)n * sizeof(*keys));

	if (!keys)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		keys[i].count = stats->count[i];
		keys[i].id = i;
	}
	qsort(keys, n, sizeof(*keys), freq_cmp);
	for (uint32_t i = 0; i < n; i++)
		perm[i] = keys[i].id;
	free(keys);
	return 0;
}

/* ---- weights ---- */

struct adj_entry {
	uint32_t id, count;
};

static int adj_cmp(const void *x, const void *y)
{
	const struct adj_entry *p = x, *q = y;

	if (p->id != q->id)
		return p->id < q->id ? -1 : 1;
	/* duplicates (i in j's list and j in i's): keep the larger count first */
	return p->count > q->count ? -1 : p->count < q->count;
}

int nl_place_weights_init(struct nl_place_weights *w, const struct nl_coact_layer *stats,
			  uint32_t k, bool use_pairs)
{
	uint32_t n = stats->n_neurons;
	struct adj_entry *e = NULL;
	uint64_t *fill = NULL, out = 0;
	int err = 0;

	memset(w, 0, sizeof(*w));
	w->n = n;
	if (use_pairs && stats->pairs) {
		w->pairs = stats->pairs;
		return 0;
	}
	if (!stats->k)
		return nl_diag(NL_E_MISSING, "neither the pair triangle nor top-K lists are present; "
			       "re-run nl-coact with pairs or --topk");
	if (k == 0 || k > stats->k)
		k = stats->k;
	/* symmetric adjacency in CSR: count per row, fill, sort each row by id */
	w->row_start = calloc((size_t)n + 1, sizeof(uint64_t));
	fill = calloc((size_t)n + 1, sizeof(uint64_t));
	e = malloc(2 * (size_t)n * k * sizeof(*e) + sizeof(*e));
	if (!w->row_start || !fill || !e) {
		err = -ENOMEM;
		goto out_free;
	}
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t r = 0; r < k; r++) {
			uint32_t j = stats->topk_ids[(uint64_t)i * stats->k + r];

			if (stats->topk_counts[(uint64_t)i * stats->k + r] == 0 || j >= n || j == i)
				continue;
			fill[i + 1]++;
			fill[j + 1]++;
		}
	}
	for (uint32_t i = 0; i < n; i++)
		fill[i + 1] += fill[i];
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t r = 0; r < k; r++) {
			uint32_t j = stats->topk_ids[(uint64_t)i * stats->k + r];
			uint32_t c = stats->topk_counts[(uint64_t)i * stats->k + r];

			if (c == 0 || j >= n || j == i)
				continue;
			e[fill[i]++] = (struct adj_entry){ j, c };
			e[fill[j]++] = (struct adj_entry){ i, c };
		}
	}
	w->row_ids = malloc((fill[n] + 1) * sizeof(uint32_t));
	w->row_counts = malloc((fill[n] + 1) * sizeof(uint32_t));
	if (!w->row_ids || !w->row_counts) {
		err = -ENOMEM;
		goto out_free;
	}
	/* after filling, fill[i] is the end of row i and fill[i - 1] (0) its start */
	for (uint32_t i = 0; i < n; i++) {
		uint64_t lo = i ? fill[i - 1] : 0, hi = fill[i];

		qsort(e + lo, hi - lo, sizeof(*e), adj_cmp);
		w->row_start[i] = out;
		for (uint64_t x = lo; x < hi; x++) {
			if (x > lo && e[x].id == e[x - 1].id)
				continue;
			w->row_ids[out] = e[x].id;
			w->row_counts[out] = e[x].count;
			out++;
		}
	}
	w->row_start[n] = out;
	free(e);
	free(fill);
	return 0;

out_free:
	free(e);
	free(fill);
	nl_place_weights_free(w);
	return err;
}

void nl_place_weights_free(struct nl_place_weights *w)
{
	free(w->row_start);
	free(w->row_ids);
	free(w->row_counts);
	memset(w, 0, sizeof(*w));
}

int nl_place_path_weight(const struct nl_coact_layer *stats, const uint32_t *perm,
			 uint64_t *weight, bool *exact)
{
	struct nl_place_weights w;
	uint64_t sum = 0;
	int err;

	err = nl_place_weights_init(&w, stats, 0, true);
	if (err)
		return err;
	for (uint32_t p = 0; p + 1 < stats->n_neurons; p++)
		sum += nl_place_weight(&w, perm[p], perm[p + 1]);
	*weight = sum;
	if (exact)
		*exact = w.pairs != NULL;
	nl_place_weights_free(&w);
	return 0;
}

/* ---- top-K from the triangle ---- */

int nl_place_topk_from_pairs(struct nl_coact_layer *stats, uint32_t k)
{
	/* one thread: nl-place already places layers in parallel */
	return nl_coact_topk_ranked(stats, k, stats->rank, 1);
}

/* ---- entry point ---- */

int nl_place_layer(const struct nl_coact_layer *stats, const struct nl_place_opts *opts,
		   struct nl_placement_layer *out, struct nl_place_stats *st)
{
	struct nl_place_stats local;
	uint32_t n = stats->n_neurons;
	uint32_t *perm = NULL, *inv = NULL;
	double t0 = nl_place_now();
	int err;

	if (!st)
		st = &local;
	memset(st, 0, sizeof(*st));
	memset(out, 0, sizeof(*out));
	err = nl_place_check_stats(stats, NULL);
	if (err)
		return err;
	if ((unsigned)opts->algo >= NL_PLACE_N_ALGOS)
		return nl_diag(NL_E_INVAL, "placement algorithm %d out of range", (int)opts->algo);
	if (opts->time_limit < 0)
		return nl_diag(NL_E_INVAL, "time limit %g s is negative", opts->time_limit);
	perm = malloc((size_t)n * sizeof(*perm));
	inv = malloc((size_t)n * sizeof(*inv));
	if (!perm || !inv) {
		err = -ENOMEM;
		goto out_free;
	}
	switch (opts->algo) {
	case NL_PLACE_IDENTITY:
		for (uint32_t i = 0; i < n; i++)
			perm[i] = i;
		break;
	case NL_PLACE_FREQUENCY:
		err = nl_place_frequency(stats, perm);
		break;
	case NL_PLACE_GREEDY:
		err = nl_place_greedy(stats, opts->band_pairs, perm, st);
		break;
	case NL_PLACE_GREEDY_SPARSE:
		err = nl_place_greedy_sparse(stats, opts->k, perm, st);
		break;
	case NL_PLACE_REFINE:
		if (opts->start)
			memcpy(perm, opts->start, (size_t)n * sizeof(*perm));
		else if (stats->pairs && !opts->sparse)
			err = nl_place_greedy(stats, opts->band_pairs, perm, st);
		else
			err = nl_place_greedy_sparse(stats, opts->k, perm, st);
		if (!err)
			err = nl_place_refine(stats, opts, perm, st);
		break;
	default:
		break;
	}
	if (err)
		goto out_free;
	if (opts->algo != NL_PLACE_REFINE) {
		struct nl_place_weights w;

		err = nl_place_weights_init(&w, stats, 0, true);
		if (err == NL_E_MISSING) {
			/* identity/frequency on counts only: no pair weights to report */
			nl_diag_clear();
			err = 0;
			st->weight = 0;
			st->weight_exact = false;
		} else if (err) {
			goto out_free;
		} else {
			uint64_t sum = 0;

			for (uint32_t p = 0; p + 1 < n; p++)
				sum += nl_place_weight(&w, perm[p], perm[p + 1]);
			st->weight = sum;
			st->weight_exact = w.pairs != NULL;
			nl_place_weights_free(&w);
		}
	}
	for (uint32_t p = 0; p < n; p++)
		inv[perm[p]] = p;
	out->n_neurons = n;
	out->perm = perm;
	out->inv = inv;
	out->objective = stats->n_tokens ? (double)st->weight / (double)stats->n_tokens : 0.0;
	snprintf(out->algo, sizeof(out->algo), "%s", nl_place_algo_name(opts->algo));
	switch (opts->algo) {
	case NL_PLACE_GREEDY:
		snprintf(out->params, sizeof(out->params), "edges=all weights=%s",
			 st->weight_exact ? "exact" : "topk");
		break;
	case NL_PLACE_GREEDY_SPARSE:
		snprintf(out->params, sizeof(out->params), "k=%" PRIu32 " weights=%s",
			 opts->k && opts->k < stats->k ? opts->k : stats->k,
			 st->weight_exact ? "exact" : "topk");
		break;
	case NL_PLACE_REFINE:
		snprintf(out->params, sizeof(out->params),
			 "start=%s k=%" PRIu32 " candidates=%s move_budget=%" PRIu64
			 " time_limit=%g weights=%s%s%s",
			 stats->pairs && !opts->sparse ? "greedy" : "greedy-sparse",
			 opts->k ? opts->k : (stats->k && !(stats->pairs && !opts->sparse) ?
					      stats->k : NL_PLACE_DEFAULT_K),
			 stats->pairs && !opts->sparse ? "norm" : "count",
			 opts->move_budget, opts->time_limit,
			 st->weight_exact ? "exact" : "topk",
			 st->time_limit_hit ? " time_limit_hit=1" : "",
			 st->move_budget_hit ? " move_budget_hit=1" : "");
		break;
	default:
		break;
	}
	st->seconds = nl_place_now() - t0;
	return 0;

out_free:
	free(perm);
	free(inv);
	return err;
}
