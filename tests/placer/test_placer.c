/*
 * Tests of the placer: Algorithm 1 against a plainly written reference greedy,
 * both greedy and refine against the brute-force optimum on tiny graphs,
 * clusters coming out contiguous, validity and determinism on random inputs,
 * evaluation on hand-made traces, and the nl-place program.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nl_formats.h"
#include "nl_place.h"

/* ---- helpers ---- */

static uint64_t rng_state;

static uint32_t rnd(void)
{
	/* xorshift64*: deterministic per test */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

static void layer_free(struct nl_coact_layer *l)
{
	free(l->count);
	free(l->pairs);
	free(l->topk_ids);
	free(l->topk_counts);
	memset(l, 0, sizeof(*l));
}

static void placement_free(struct nl_placement_layer *p)
{
	free(p->perm);
	free(p->inv);
	memset(p, 0, sizeof(*p));
}

/* A layer whose pair counts come from gen(i, j); f(i) = max over pairs + 1. */
static void make_layer(struct nl_coact_layer *l, uint32_t n, uint32_t (*gen)(uint32_t, uint32_t, void *),
		       void *arg)
{
	memset(l, 0, sizeof(*l));
	l->n_neurons = n;
	l->n_tokens = 1000;
	l->count = calloc(n, sizeof(uint64_t));
	l->pairs = calloc(nl_tri_size(n) + 1, sizeof(uint32_t));
	cr_assert(l->count && l->pairs);
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = i + 1; j < n; j++) {
			uint32_t c = gen(i, j, arg);

			l->pairs[nl_tri_index(n, i, j)] = c;
			if (c + 1 > l->count[i])
				l->count[i] = c + 1;
			if (c + 1 > l->count[j])
				l->count[j] = c + 1;
		}
	for (uint32_t i = 0; i < n; i++)
		if (l->count[i] == 0)
			l->count[i] = 1 + i % 3;
}

static uint32_t gen_random(uint32_t i, uint32_t j, void *arg)
{
	uint32_t range = *(uint32_t *)arg;

	(void)i;
	(void)j;
	return range ? rnd() % range : 0;
}

static uint32_t gen_sparse(uint32_t i, uint32_t j, void *arg)
{
	(void)i;
	(void)j;
	(void)arg;
	return rnd() % 4 == 0 ? rnd() % 50 : 0;
}

static uint32_t gen_const(uint32_t i, uint32_t j, void *arg)
{
	(void)i;
	(void)j;
	return *(uint32_t *)arg;
}

static uint32_t w_of(const struct nl_coact_layer *l, uint32_t a, uint32_t b)
{
	if (a > b) {
		uint32_t t = a;

		a = b;
		b = t;
	}
	return l->pairs[nl_tri_index(l->n_neurons, a, b)];
}

static uint64_t path_weight(const struct nl_coact_layer *l, const uint32_t *perm)
{
	uint64_t s = 0;

	for (uint32_t p = 0; p + 1 < l->n_neurons; p++)
		s += w_of(l, perm[p], perm[p + 1]);
	return s;
}

static void assert_perm(const uint32_t *perm, const uint32_t *inv, uint32_t n)
{
	char *seen = calloc(n + 1, 1);

	cr_assert(seen);
	for (uint32_t p = 0; p < n; p++) {
		cr_assert_lt(perm[p], n, "perm[%u] = %u out of range", p, perm[p]);
		cr_assert(!seen[perm[p]], "neuron %u placed twice", perm[p]);
		seen[perm[p]] = 1;
		if (inv)
			cr_assert_eq(inv[perm[p]], p);
	}
	free(seen);
}

/* ---- the reference greedy: full sort, plain checks ---- */

struct ref_edge {
	uint32_t w, i, j;
};

static int ref_cmp(const void *a, const void *b)
{
	const struct ref_edge *x = a, *y = b;

	if (x->w != y->w)
		return x->w > y->w ? -1 : 1;
	if (x->i != y->i)
		return x->i < y->i ? -1 : 1;
	return x->j < y->j ? -1 : x->j > y->j;
}

/*
 * weight(i, j) for every pair, sort by (w desc, i, j), link pairs with w > 0
 * when both ends have fewer than two links and different component labels
 * (relabelled on merge); then list the paths (each from its smaller-id end),
 * order them by total f(i) descending, ties by that end, and concatenate.
 */
static void ref_greedy(uint32_t n, uint32_t (*weight)(const struct nl_coact_layer *, uint32_t, uint32_t),
		       const struct nl_coact_layer *l, uint32_t *perm)
{
	uint64_t m = 0;
	struct ref_edge *e = malloc((nl_tri_size(n) + 1) * sizeof(*e));
	uint32_t *comp = malloc(n * sizeof(uint32_t)), *deg = calloc(n, sizeof(uint32_t));
	uint32_t *adj = malloc(2 * n * sizeof(uint32_t));
	uint32_t *start = malloc(n * sizeof(uint32_t)), n_paths = 0, out = 0;
	uint64_t *freq = calloc(n, sizeof(uint64_t));
	char *used = calloc(n, 1);

	for (uint32_t i = 0; i < n; i++) {
		comp[i] = i;
		for (uint32_t j = i + 1; j < n; j++)
			e[m++] = (struct ref_edge){ weight(l, i, j), i, j };
	}
	qsort(e, m, sizeof(*e), ref_cmp);
	for (uint64_t x = 0; x < m; x++) {
		uint32_t i = e[x].i, j = e[x].j, old;

		if (e[x].w == 0 || deg[i] == 2 || deg[j] == 2 || comp[i] == comp[j])
			continue;
		adj[2 * i + deg[i]++] = j;
		adj[2 * j + deg[j]++] = i;
		old = comp[j];
		for (uint32_t v = 0; v < n; v++)
			if (comp[v] == old)
				comp[v] = comp[i];
	}
	/* path ends in id order: the first end seen of each component */
	for (uint32_t i = 0; i < n; i++) {
		bool have = false;

		if (deg[i] == 2)
			continue;
		for (uint32_t p = 0; p < n_paths; p++)
			have |= comp[start[p]] == comp[i];
		if (!have)
			start[n_paths++] = i;
	}
	for (uint32_t p = 0; p < n_paths; p++)
		for (uint32_t v = 0; v < n; v++)
			if (comp[v] == comp[start[p]])
				freq[p] += l->count[v];
	for (uint32_t done = 0; done < n_paths; done++) {
		uint32_t best = UINT32_MAX, prev = UINT32_MAX, cur;

		for (uint32_t p = 0; p < n_paths; p++)
			if (!used[p] && (best == UINT32_MAX || freq[p] > freq[best]))
				best = p;   /* ties: the earlier (smaller) end wins */
		used[best] = 1;
		cur = start[best];
		while (cur != UINT32_MAX) {
			uint32_t nx = UINT32_MAX;

			perm[out++] = cur;
			for (uint32_t d = 0; d < deg[cur]; d++)
				if (adj[2 * cur + d] != prev) {
					nx = adj[2 * cur + d];
					break;
				}
			prev = cur;
			cur = nx;
		}
	}
	cr_assert_eq(out, n);
	free(e);
	free(comp);
	free(deg);
	free(adj);
	free(start);
	free(freq);
	free(used);
}

static uint32_t weight_tri(const struct nl_coact_layer *l, uint32_t i, uint32_t j)
{
	return w_of(l, i, j);
}

/* top-K weight: f(i,j) when j is in i's list or i in j's */
static uint32_t weight_topk(const struct nl_coact_layer *l, uint32_t i, uint32_t j)
{
	for (uint32_t r = 0; r < l->k; r++) {
		if (l->topk_counts[i * l->k + r] && l->topk_ids[i * l->k + r] == j)
			return l->topk_counts[i * l->k + r];
		if (l->topk_counts[j * l->k + r] && l->topk_ids[j * l->k + r] == i)
			return l->topk_counts[j * l->k + r];
	}
	return 0;
}

static uint64_t brute_force_opt(const struct nl_coact_layer *l)
{
	uint32_t n = l->n_neurons, perm[16], c[16] = { 0 };
	uint64_t best;
	uint32_t i = 1;

	/* Heap's algorithm over all n! orders */
	for (uint32_t x = 0; x < n; x++)
		perm[x] = x;
	best = path_weight(l, perm);
	while (i < n) {
		if (c[i] < i) {
			uint32_t a = i % 2 == 0 ? 0 : c[i], t = perm[a];
			uint64_t wgt;

			perm[a] = perm[i];
			perm[i] = t;
			wgt = path_weight(l, perm);
			if (wgt > best)
				best = wgt;
			c[i]++;
			i = 1;
		} else {
			c[i] = 0;
			i++;
		}
	}
	return best;
}

static void place(const struct nl_coact_layer *l, enum nl_place_algo algo, uint32_t k,
		  struct nl_placement_layer *out, struct nl_place_stats *st)
{
	struct nl_place_opts opts;
	int err;

	nl_place_opts_default(&opts);
	opts.algo = algo;
	opts.k = k;
	err = nl_place_layer(l, &opts, out, st);
	cr_assert_eq(err, 0, "%s failed: %d %s", nl_place_algo_name(algo), err, nl_diag_msg());
	assert_perm(out->perm, out->inv, l->n_neurons);
}

/* ---- tiny graphs: reference greedy, refine, optimum ---- */

Test(placer, greedy_equals_reference_and_optimum_bounds)
{
	double ratio_greedy = 0, ratio_refine = 0;
	unsigned cases = 0, greedy_optimal = 0, refine_optimal = 0;

	for (uint32_t n = 1; n <= 9; n++) {
		for (uint32_t seed = 1; seed <= (n <= 7 ? 12u : 4u); seed++) {
			struct nl_coact_layer l;
			struct nl_placement_layer g, r, band;
			struct nl_place_stats gst, rst;
			struct nl_place_opts opts;
			uint32_t ref[16], range = seed % 3 == 0 ? 3 : seed % 5 == 0 ? 1u << 24 : 100;
			uint64_t opt, wg, wr;

			rng_state = seed * 7919 + n;
			make_layer(&l, n, seed % 4 == 1 ? gen_sparse : gen_random, &range);
			place(&l, NL_PLACE_GREEDY, 0, &g, &gst);
			ref_greedy(n, weight_tri, &l, ref);
			cr_assert_arr_eq(g.perm, ref, n * sizeof(uint32_t),
					 "greedy differs from the reference greedy (n=%u seed=%u)", n, seed);
			/* tiny bands must give the same order */
			nl_place_opts_default(&opts);
			opts.band_pairs = 1;
			cr_assert_eq(nl_place_layer(&l, &opts, &band, NULL), 0);
			cr_assert_arr_eq(band.perm, ref, n * sizeof(uint32_t));
			place(&l, NL_PLACE_REFINE, 0, &r, &rst);
			wg = path_weight(&l, g.perm);
			wr = path_weight(&l, r.perm);
			opt = brute_force_opt(&l);
			cr_assert_eq(gst.weight, wg);
			cr_assert_eq(rst.weight, wr, "refine's bookkeeping %llu != recomputed %llu",
				     (unsigned long long)rst.weight, (unsigned long long)wr);
			cr_assert_eq(rst.weight_before, wg);
			cr_assert_geq(wr, wg, "refine worsened the objective");
			cr_assert_geq(opt, wg);
			cr_assert_geq(opt, wr);
			cr_assert_float_eq(g.objective, (double)wg / 1000.0, 1e-12);
			ratio_greedy += opt ? (double)wg / (double)opt : 1.0;
			ratio_refine += opt ? (double)wr / (double)opt : 1.0;
			greedy_optimal += wg == opt;
			refine_optimal += wr == opt;
			cases++;
			placement_free(&g);
			placement_free(&r);
			placement_free(&band);
			layer_free(&l);
		}
	}
	cr_log_info("%u tiny graphs (n <= 9): greedy reaches on average %.2f%% of the optimum "
		    "path weight (optimal in %u), refine %.2f%% (optimal in %u)", cases,
		    100.0 * ratio_greedy / cases, greedy_optimal, 100.0 * ratio_refine / cases,
		    refine_optimal);
}

Test(placer, greedy_equals_reference_on_larger_graphs_and_bands)
{
	static const uint32_t sizes[] = { 60, 300, 1000 };
	static const uint64_t bands[] = { 0, 150, 4000 };

	for (unsigned s = 0; s < 3; s++) {
		for (uint32_t seed = 1; seed <= 2; seed++) {
			uint32_t n = sizes[s], range = seed == 1 ? 40 : 5000;
			uint32_t *ref = malloc(n * sizeof(uint32_t)), *perm = malloc(n * sizeof(uint32_t));
			struct nl_coact_layer l;

			rng_state = 31337 * seed + n;
			make_layer(&l, n, seed == 1 ? gen_sparse : gen_random, &range);
			ref_greedy(n, weight_tri, &l, ref);
			for (unsigned b = 0; b < 3; b++) {
				struct nl_place_stats st;

				memset(&st, 0, sizeof(st));
				cr_assert_eq(nl_place_greedy(&l, bands[b], perm, &st), 0);
				cr_assert_arr_eq(perm, ref, n * sizeof(uint32_t),
						 "n=%u seed=%u band_pairs=%llu (%u bands)", n, seed,
						 (unsigned long long)bands[b], st.bands);
			}
			free(ref);
			free(perm);
			layer_free(&l);
		}
	}
}

Test(placer, greedy_sparse_equals_reference_on_topk_weights)
{
	for (uint32_t n = 2; n <= 40; n += 3) {
		for (uint32_t k = 1; k <= 4; k++) {
			struct nl_coact_layer l;
			struct nl_placement_layer g;
			uint32_t *ref = malloc(n * sizeof(uint32_t)), range = 30;
			uint32_t *pairs;

			rng_state = n * 31 + k;
			make_layer(&l, n, gen_random, &range);
			cr_assert_eq(nl_place_topk_from_pairs(&l, k), 0);
			/* greedy-sparse must not need the triangle */
			pairs = l.pairs;
			l.pairs = NULL;
			place(&l, NL_PLACE_GREEDY_SPARSE, 0, &g, NULL);
			ref_greedy(n, weight_topk, &l, ref);
			cr_assert_arr_eq(g.perm, ref, n * sizeof(uint32_t), "n=%u k=%u", n, k);
			placement_free(&g);
			/* refine on top-K weights only never loses top-K weight */
			{
				struct nl_place_stats st;

				place(&l, NL_PLACE_REFINE, 0, &g, &st);
				cr_assert_geq(st.weight, st.weight_before);
				cr_assert(!st.weight_exact);
				placement_free(&g);
			}
			l.pairs = pairs;
			free(ref);
			layer_free(&l);
		}
	}
}

Test(placer, topk_from_pairs_order)
{
	struct nl_coact_layer l;
	uint32_t range = 5;

	rng_state = 99;
	make_layer(&l, 30, gen_random, &range);
	cr_assert_eq(nl_place_topk_from_pairs(&l, 6), 0);
	for (uint32_t i = 0; i < 30; i++) {
		/* the reference: all others sorted by (count desc, id asc) */
		uint32_t ids[30], cnt[30], m = 0;

		for (uint32_t j = 0; j < 30; j++) {
			uint32_t c, x;

			if (j == i || (c = w_of(&l, i, j)) == 0)
				continue;
			for (x = m; x > 0 && (cnt[x - 1] < c); x--) {
				ids[x] = ids[x - 1];
				cnt[x] = cnt[x - 1];
			}
			ids[x] = j;
			cnt[x] = c;
			m++;
		}
		for (uint32_t r = 0; r < 6; r++) {
			if (r < m) {
				cr_assert_eq(l.topk_ids[i * 6 + r], ids[r], "neuron %u rank %u", i, r);
				cr_assert_eq(l.topk_counts[i * 6 + r], cnt[r]);
			} else {
				cr_assert_eq(l.topk_counts[i * 6 + r], 0);
				cr_assert_eq(l.topk_ids[i * 6 + r], UINT32_MAX);
			}
		}
	}
	layer_free(&l);
}

/* ---- clusters ---- */

#define N_CLUSTERS 6
#define CLUSTER_SIZE 10

static uint32_t cluster_of(uint32_t i)
{
	return (i * 7 + 3) % N_CLUSTERS;  /* members scattered over the id range */
}

static uint32_t gen_clustered(uint32_t i, uint32_t j, void *arg)
{
	(void)arg;
	if (cluster_of(i) == cluster_of(j))
		return 200 + rnd() % 100;
	return rnd() % 20;
}

Test(placer, clusters_come_out_contiguous)
{
	const uint32_t n = N_CLUSTERS * CLUSTER_SIZE;
	const enum nl_place_algo algos[] = { NL_PLACE_GREEDY, NL_PLACE_GREEDY_SPARSE, NL_PLACE_REFINE };

	for (unsigned a = 0; a < 3; a++) {
		struct nl_coact_layer l;
		struct nl_placement_layer pl;

		rng_state = 4242 + a;
		make_layer(&l, n, gen_clustered, NULL);
		cr_assert_eq(nl_place_topk_from_pairs(&l, CLUSTER_SIZE), 0);
		place(&l, algos[a], 0, &pl, NULL);
		for (uint32_t c = 0; c < N_CLUSTERS; c++) {
			uint32_t lo = n, hi = 0;

			for (uint32_t i = 0; i < n; i++) {
				if (cluster_of(i) != c)
					continue;
				if (pl.inv[i] < lo)
					lo = pl.inv[i];
				if (pl.inv[i] > hi)
					hi = pl.inv[i];
			}
			cr_assert_eq(hi - lo + 1, CLUSTER_SIZE, "%s: cluster %u spans positions %u-%u",
				     nl_place_algo_name(algos[a]), c, lo, hi);
		}
		placement_free(&pl);
		layer_free(&l);
	}
}

/* ---- validity and determinism on random inputs ---- */

Test(placer, valid_and_deterministic_on_random_inputs)
{
	static const uint32_t sizes[] = { 1, 2, 3, 5, 17, 64, 201 };

	for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		for (uint32_t seed = 0; seed < 6; seed++) {
			uint32_t n = sizes[s], range = seed == 0 ? 0 : seed == 1 ? 1 : 1000;
			struct nl_coact_layer l;

			rng_state = 1000003ULL * seed + n;
			if (seed == 2) {
				uint32_t eq = 7;

				make_layer(&l, n, gen_const, &eq);  /* all-equal counts */
			} else if (seed == 3) {
				make_layer(&l, n, gen_sparse, NULL);
			} else {
				make_layer(&l, n, gen_random, &range);
			}
			for (unsigned a = 0; a < NL_PLACE_N_ALGOS; a++) {
				struct nl_placement_layer p1, p2;
				struct nl_place_stats st;

				place(&l, (enum nl_place_algo)a, seed % 2 ? 4 : 0, &p1, &st);
				place(&l, (enum nl_place_algo)a, seed % 2 ? 4 : 0, &p2, NULL);
				cr_assert_arr_eq(p1.perm, p2.perm, n * sizeof(uint32_t),
						 "%s is not deterministic (n=%u seed=%u)",
						 nl_place_algo_name((enum nl_place_algo)a), n, seed);
				if (a == NL_PLACE_IDENTITY)
					for (uint32_t i = 0; i < n; i++)
						cr_assert_eq(p1.perm[i], i);
				if (a == NL_PLACE_FREQUENCY)
					for (uint32_t i = 1; i < n; i++)
						cr_assert(l.count[p1.perm[i - 1]] > l.count[p1.perm[i]] ||
							  (l.count[p1.perm[i - 1]] == l.count[p1.perm[i]] &&
							   p1.perm[i - 1] < p1.perm[i]));
				if (range == 0 && a >= NL_PLACE_GREEDY) {
					/* no co-activation at all: singletons joined by f(i) desc, id */
					uint32_t ref[256];

					cr_assert_eq(nl_place_frequency(&l, ref), 0);
					cr_assert_arr_eq(p1.perm, ref, n * sizeof(uint32_t));
				}
				cr_assert_eq(st.weight, path_weight(&l, p1.perm));
				placement_free(&p1);
				placement_free(&p2);
			}
			layer_free(&l);
		}
	}
}

Test(placer, refine_never_worsens_and_respects_budget)
{
	for (uint32_t seed = 1; seed <= 8; seed++) {
		uint32_t n = 150 + seed * 13, range = 500;
		struct nl_coact_layer l;
		struct nl_placement_layer g, r;
		struct nl_place_stats st;
		struct nl_place_opts opts;
		uint64_t wg;

		rng_state = seed * 65537;
		make_layer(&l, n, seed % 2 ? gen_random : gen_sparse, &range);
		place(&l, NL_PLACE_GREEDY, 0, &g, NULL);
		wg = path_weight(&l, g.perm);
		nl_place_opts_default(&opts);
		opts.algo = NL_PLACE_REFINE;
		opts.k = 8;
		cr_assert_eq(nl_place_layer(&l, &opts, &r, &st), 0);
		assert_perm(r.perm, r.inv, n);
		cr_assert_eq(path_weight(&l, r.perm), st.weight);
		cr_assert_geq(st.weight, wg);
		cr_assert_eq(st.weight_before, wg);
		placement_free(&r);
		opts.move_budget = 3;
		cr_assert_eq(nl_place_layer(&l, &opts, &r, &st), 0);
		cr_assert_leq(st.moves_2opt + st.moves_oropt, 3);
		cr_assert_eq(path_weight(&l, r.perm), st.weight);
		cr_assert_geq(st.weight, wg);
		placement_free(&r);
		placement_free(&g);
		layer_free(&l);
	}
}

Test(placer, bad_inputs_are_refused)
{
	struct nl_coact_layer l;
	struct nl_placement_layer pl;
	struct nl_place_opts opts;
	enum nl_place_algo algo;
	uint32_t range = 10;

	rng_state = 5;
	make_layer(&l, 8, gen_random, &range);
	nl_place_opts_default(&opts);
	cr_assert_eq(nl_place_algo_parse(&algo, "tsp"), NL_E_INVAL);
	cr_assert(strstr(nl_diag_msg(), "greedy-sparse"));
	cr_assert_eq(nl_place_algo_parse(&algo, "greedy-sparse"), 0);
	cr_assert_eq(algo, NL_PLACE_GREEDY_SPARSE);
	/* greedy without the triangle */
	{
		uint32_t *pairs = l.pairs;

		l.pairs = NULL;
		opts.algo = NL_PLACE_GREEDY;
		cr_assert_eq(nl_place_layer(&l, &opts, &pl, NULL), NL_E_MISSING);
		opts.algo = NL_PLACE_REFINE;
		cr_assert_eq(nl_place_layer(&l, &opts, &pl, NULL), NL_E_MISSING);
		opts.algo = NL_PLACE_FREQUENCY;
		cr_assert_eq(nl_place_layer(&l, &opts, &pl, NULL), 0);
		placement_free(&pl);
		l.pairs = pairs;
	}
	/* a top-K list naming a neuron out of range */
	cr_assert_eq(nl_place_topk_from_pairs(&l, 3), 0);
	l.topk_ids[5] = 99;
	opts.algo = NL_PLACE_GREEDY_SPARSE;
	cr_assert_eq(nl_place_layer(&l, &opts, &pl, NULL), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "names neuron 99"), "%s", nl_diag_msg());
	layer_free(&l);
	/* no counts */
	memset(&l, 0, sizeof(l));
	l.n_neurons = 4;
	cr_assert_eq(nl_place_layer(&l, &opts, &pl, NULL), NL_E_MISSING);
	l.n_neurons = 0;
	cr_assert_eq(nl_place_layer(&l, &opts, &pl, NULL), NL_E_FORMAT);
}

/* ---- eval ---- */

static void csr_from_rows(struct nl_csr *csr, uint32_t n, const uint32_t *const *rows,
			  const uint32_t *lens, uint64_t n_tokens)
{
	uint64_t total = 0;

	csr->n_tokens = n_tokens;
	csr->n_neurons = n;
	csr->indptr = calloc(n_tokens + 1, sizeof(uint64_t));
	for (uint64_t t = 0; t < n_tokens; t++)
		total += lens[t];
	csr->indices = calloc(total + 1, sizeof(uint32_t));
	total = 0;
	for (uint64_t t = 0; t < n_tokens; t++) {
		memcpy(csr->indices + total, rows[t], lens[t] * sizeof(uint32_t));
		total += lens[t];
		csr->indptr[t + 1] = total;
	}
}

Test(placer, eval_counts_runs_and_collapse)
{
	/* n = 12; tokens: {0,1,2,5,6,9}, {}, {11}, {3,7} */
	static const uint32_t t0[] = { 0, 1, 2, 5, 6, 9 }, t2[] = { 11 }, t3[] = { 3, 7 };
	const uint32_t *rows[] = { t0, NULL, t2, t3 };
	const uint32_t lens[] = { 6, 0, 1, 2 };
	struct nl_csr csr;
	struct nl_placement_layer pl;
	struct nl_place_eval ev;
	uint32_t perm[12], inv[12];

	csr_from_rows(&csr, 12, rows, lens, 4);
	memset(&pl, 0, sizeof(pl));
	pl.n_neurons = 12;
	pl.perm = perm;
	pl.inv = inv;
	for (uint32_t i = 0; i < 12; i++)
		perm[i] = inv[i] = i;
	memset(&ev, 0, sizeof(ev));
	cr_assert_eq(nl_place_eval_layer(&csr, &pl, &ev), 0);
	cr_assert_eq(ev.n_tokens, 4);
	cr_assert_eq(ev.active, 9);
	/* token 0: runs 0-2, 5-6, 9 (gaps 2, 2); token 2: 11; token 3: 3, 7 (gap 3) */
	cr_assert_eq(ev.runs, 3 + 1 + 2);
	cr_assert_eq(ev.max_run, 3);
	cr_assert_eq(ev.run_hist[0], 4);  /* length 1: 9, 11, 3, 7 */
	cr_assert_eq(ev.run_hist[1], 1);  /* length 2 */
	cr_assert_eq(ev.run_hist[2], 1);  /* length 3-4 */
	cr_assert_eq(ev.reads_collapsed[0], 6);
	cr_assert_eq(ev.reads_collapsed[1], 6);
	cr_assert_eq(ev.extra_collapsed[1], 0);
	cr_assert_eq(ev.reads_collapsed[2], 4);
	cr_assert_eq(ev.extra_collapsed[2], 4);
	cr_assert_eq(ev.reads_collapsed[3], 3);
	cr_assert_eq(ev.extra_collapsed[3], 7);
	cr_assert_eq(ev.reads_collapsed[8], 3);
	cr_assert_eq(ev.extra_collapsed[8], 7);

	/* a placement that makes token 0 one run: 0 1 2 5 6 9 first, then the rest */
	{
		static const uint32_t order[12] = { 0, 1, 2, 5, 6, 9, 3, 7, 4, 8, 10, 11 };

		for (uint32_t p = 0; p < 12; p++) {
			perm[p] = order[p];
			inv[order[p]] = p;
		}
	}
	memset(&ev, 0, sizeof(ev));
	cr_assert_eq(nl_place_eval_layer(&csr, &pl, &ev), 0);
	cr_assert_eq(ev.runs, 1 + 1 + 1);
	cr_assert_eq(ev.max_run, 6);
	cr_assert_eq(ev.run_hist[3], 1);  /* length 5-8 */
	/* objective on the trace: adjacent co-active pairs = active - runs */
	cr_assert_eq(ev.active - ev.runs, 6);
	/* mismatched sizes */
	pl.n_neurons = 11;
	cr_assert_eq(nl_place_eval_layer(&csr, &pl, &ev), NL_E_MISMATCH);
	free(csr.indptr);
	free(csr.indices);
}

Test(placer, eval_objective_matches_statistics)
{
	/* on the profiling trace, eval's objective equals the placement objective */
	const uint32_t n = 40, n_tokens = 300;
	struct nl_coact_layer l;
	struct nl_csr csr;
	struct nl_placement_layer pl;
	struct nl_place_eval ev;
	uint32_t **rows = calloc(n_tokens, sizeof(*rows)), *lens = calloc(n_tokens, sizeof(*lens));

	rng_state = 77;
	memset(&l, 0, sizeof(l));
	l.n_neurons = n;
	l.n_tokens = n_tokens;
	l.count = calloc(n, sizeof(uint64_t));
	l.pairs = calloc(nl_tri_size(n), sizeof(uint32_t));
	for (uint32_t t = 0; t < n_tokens; t++) {
		uint32_t group = rnd() % 4;

		rows[t] = malloc(n * sizeof(uint32_t));
		for (uint32_t i = 0; i < n; i++)
			if ((i % 4 == group && rnd() % 10 < 8) || rnd() % 10 == 0)
				rows[t][lens[t]++] = i;
		for (uint32_t a = 0; a < lens[t]; a++) {
			l.count[rows[t][a]]++;
			for (uint32_t b = a + 1; b < lens[t]; b++)
				l.pairs[nl_tri_index(n, rows[t][a], rows[t][b])]++;
		}
	}
	csr_from_rows(&csr, n, (const uint32_t *const *)rows, lens, n_tokens);
	for (unsigned a = 0; a < NL_PLACE_N_ALGOS; a++) {
		place(&l, (enum nl_place_algo)a, 6, &pl, NULL);
		memset(&ev, 0, sizeof(ev));
		cr_assert_eq(nl_place_eval_layer(&csr, &pl, &ev), 0);
		cr_assert_float_eq((double)(ev.active - ev.runs) / n_tokens, pl.objective, 1e-9,
				   "%s", nl_place_algo_name((enum nl_place_algo)a));
		placement_free(&pl);
	}
	for (uint32_t t = 0; t < n_tokens; t++)
		free(rows[t]);
	free(rows);
	free(lens);
	free(csr.indptr);
	free(csr.indices);
	layer_free(&l);
}

/* ---- the program ---- */

static char prog[4096];
static char tmpdir[256];

static void cli_setup(void)
{
	const char *build = getenv("NL_BUILD_ROOT");

	snprintf(prog, sizeof(prog), "%s/placer/nl-place", build ? build : ".");
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/nl-place-test-XXXXXX");
	cr_assert(mkdtemp(tmpdir));
}

static void cli_teardown(void)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	cr_assert_eq(system(cmd), 0);
}

/* Runs "prog args" with stdout and stderr into files; returns the exit status. */
static int run(const char *args, const char *out_name)
{
	char cmd[8192];
	int st;

	snprintf(cmd, sizeof(cmd), "cd '%s' && '%s' %s >%s.out 2>%s.err", tmpdir, prog, args,
		 out_name, out_name);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *name)
{
	char path[512];
	FILE *f;
	char *buf = calloc(1 << 20, 1);

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	f = fopen(path, "rb");
	cr_assert(f, "cannot open %s", path);
	fread(buf, 1, (1 << 20) - 1, f);
	fclose(f);
	return buf;
}

Test(placer, cli_usage, .init = cli_setup, .fini = cli_teardown)
{
	char *s;

	cr_assert_eq(run("--help", "help"), 0);
	s = slurp("help.out");
	cr_assert(strstr(s, "Usage: nl-place") && strstr(s, "greedy-sparse"));
	free(s);
	cr_assert_eq(run("eval --help", "ehelp"), 0);
	s = slurp("ehelp.out");
	cr_assert(strstr(s, "--traces"));
	free(s);
	cr_assert_eq(run("--version", "ver"), 0);
	cr_assert_eq(run("--bogus x.h5 -o y.h5", "bad"), 2);
	cr_assert_eq(run("x.h5", "noout"), 2);
	s = slurp("noout.err");
	cr_assert(strstr(s, "-o/--output"), "%s", s);
	free(s);
	cr_assert_eq(run("-a tsp x.h5 -o y.h5", "algo"), 2);
	s = slurp("algo.err");
	cr_assert(strstr(s, "unknown placement algorithm 'tsp'"), "%s", s);
	free(s);
	cr_assert_eq(run("-a greedy,refine x.h5 -o y.h5", "pattern"), 2);
	cr_assert_eq(run("-a greedy --sparse x.h5 -o y.h5", "sparse"), 2);
	cr_assert_eq(run("-j 0 x.h5 -o y.h5", "threads"), 2);
	cr_assert_eq(run("eval --traces t.h5", "noplace"), 2);
	cr_assert_eq(run("eval --placement p.h5", "notrace"), 2);
	/* a missing input is a failure, not a usage error */
	cr_assert_eq(run("missing.h5 -o y.h5", "missing"), 1);
}

/* Writes a small co-activation file and a trace with the format library. */
static int write_inputs(void)
{
	const uint32_t n = 24, layers = 3, n_tokens = 200;
	struct nl_coact_meta cm;
	struct nl_trace_meta tm;
	struct nl_coact_writer *cw = NULL;
	struct nl_trace_writer *tw = NULL;
	struct nl_h5_opts h5 = { .compress = NL_COMPRESS_DEFLATE, .level = 0 };
	char path[512];
	uint32_t ids[3][24], nact[3];
	const uint32_t *idp[3] = { ids[0], ids[1], ids[2] };
	struct nl_coact_layer st[3];
	int err;

	memset(&cm, 0, sizeof(cm));
	memset(&tm, 0, sizeof(tm));
	snprintf(cm.model.name, sizeof(cm.model.name), "tiny");
	cm.model.n_layers = layers;
	cm.model.d_model = 8;
	cm.model.n_neurons = n;
	tm.model = cm.model;
	snprintf(cm.dataset, sizeof(cm.dataset), "unit");
	snprintf(tm.dataset, sizeof(tm.dataset), "unit");
	cm.layer_first = 0;
	cm.layer_count = layers;
	cm.n_tokens = n_tokens;
	cm.has_pairs = true;
	cm.k = 4;
	for (uint32_t l = 0; l < layers; l++) {
		memset(&st[l], 0, sizeof(st[l]));
		st[l].n_neurons = n;
		st[l].n_tokens = n_tokens;
		st[l].count = calloc(n, sizeof(uint64_t));
		st[l].pairs = calloc(nl_tri_size(n), sizeof(uint32_t));
	}
	snprintf(path, sizeof(path), "%s/trace.h5", tmpdir);
	err = nl_trace_create(&tw, path, &tm, &h5);
	if (err)
		return err;
	rng_state = 12345;
	for (uint32_t t = 0; t < n_tokens; t++) {
		for (uint32_t l = 0; l < layers; l++) {
			uint32_t g = rnd() % 3;

			nact[l] = 0;
			for (uint32_t i = 0; i < n; i++)
				if ((i * 5 % 3 == g && rnd() % 4) || rnd() % 8 == 0)
					ids[l][nact[l]++] = i;
			for (uint32_t a = 0; a < nact[l]; a++) {
				st[l].count[ids[l][a]]++;
				for (uint32_t b = a + 1; b < nact[l]; b++)
					st[l].pairs[nl_tri_index(n, ids[l][a], ids[l][b])]++;
			}
		}
		err = nl_trace_append(tw, idp, nact, 0);
		if (err)
			return err;
	}
	err = nl_trace_finish(tw, NULL);
	if (err)
		return err;
	snprintf(path, sizeof(path), "%s/coact.h5", tmpdir);
	err = nl_coact_create(&cw, path, &cm, &h5);
	if (err)
		return err;
	for (uint32_t l = 0; l < layers; l++) {
		if (!err)
			err = nl_place_topk_from_pairs(&st[l], 4);
		if (!err)
			err = nl_coact_write_layer(cw, l, &st[l]);
		layer_free(&st[l]);
	}
	if (err) {
		nl_coact_abort(cw);
		return err;
	}
	return nl_coact_finish(cw);
}

/* A trace of 24 x 3 neurons like write_inputs()'s, but of another model. */
static int write_other_model_trace(const char *name, const char *model)
{
	const uint32_t n = 24, layers = 3;
	struct nl_trace_meta tm;
	struct nl_trace_writer *tw = NULL;
	struct nl_h5_opts h5 = { .compress = NL_COMPRESS_DEFLATE, .level = 0 };
	uint32_t ids[24], nact[3];
	const uint32_t *idp[3] = { ids, ids, ids };
	char path[512];
	int err;

	memset(&tm, 0, sizeof(tm));
	snprintf(tm.model.name, sizeof(tm.model.name), "%s", model);
	tm.model.n_layers = layers;
	tm.model.d_model = 8;
	tm.model.n_neurons = n;
	snprintf(tm.dataset, sizeof(tm.dataset), "unit");
	for (uint32_t i = 0; i < n; i++)
		ids[i] = i;
	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	err = nl_trace_create(&tw, path, &tm, &h5);
	if (err)
		return err;
	for (uint32_t t = 0; t < 10 && !err; t++) {
		for (uint32_t l = 0; l < layers; l++)
			nact[l] = 1 + (t + l) % n;
		err = nl_trace_append(tw, idp, nact, 0);
	}
	if (err) {
		nl_trace_abort(tw);
		return err;
	}
	return nl_trace_finish(tw, NULL);
}

static void read_perm(const char *name, uint32_t layer, struct nl_placement_layer *pl)
{
	struct nl_placement_reader *r;
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	cr_assert_eq(nl_placement_open(&r, path), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_placement_read_layer(r, layer, pl), 0, "%s", nl_diag_msg());
	nl_placement_close(r);
}

Test(placer, cli_run_and_eval, .init = cli_setup, .fini = cli_teardown)
{
	int err = write_inputs();
	char *s;

	if (err)
		cr_skip_test("the HDF5 formats are not available in this build (%s)", nl_diag_msg());
	cr_assert_eq(run("-q -j 1 -a identity,frequency,greedy,greedy-sparse,refine coact.h5 "
			 "-o 'j1-{algo}.h5'", "run1"), 0, "%s", slurp("run1.err"));
	cr_assert_eq(run("-q -j 3 -a identity,frequency,greedy,greedy-sparse,refine coact.h5 "
			 "-o 'j3-{algo}.h5' --json", "run3"), 0, "%s", slurp("run3.err"));
	s = slurp("run3.out");
	cr_assert(strstr(s, "\"algo\": \"refine\"") || strstr(s, "\"algo\":\"refine\""), "%s", s);
	free(s);
	/* independent of -j */
	for (unsigned a = 0; a < NL_PLACE_N_ALGOS; a++) {
		for (uint32_t l = 0; l < 3; l++) {
			struct nl_placement_layer p1, p3;
			char n1[64], n3[64];

			snprintf(n1, sizeof(n1), "j1-%s.h5", nl_place_algo_name((enum nl_place_algo)a));
			snprintf(n3, sizeof(n3), "j3-%s.h5", nl_place_algo_name((enum nl_place_algo)a));
			read_perm(n1, l, &p1);
			read_perm(n3, l, &p3);
			cr_assert_eq(p1.n_neurons, 24);
			assert_perm(p1.perm, p1.inv, 24);
			cr_assert_arr_eq(p1.perm, p3.perm, 24 * sizeof(uint32_t));
			cr_assert_str_eq(p1.algo, nl_place_algo_name((enum nl_place_algo)a));
			placement_free(&p1);
			placement_free(&p3);
		}
	}
	{
		char cmd[1024];

		snprintf(cmd, sizeof(cmd), "cmp -s '%s/j1-refine.h5' '%s/j3-refine.h5'", tmpdir, tmpdir);
		/* same input, same bytes, whatever -j */
		cr_assert_eq(system(cmd), 0, "j1-refine.h5 and j3-refine.h5 differ byte-wise");
		snprintf(cmd, sizeof(cmd), "cmp -s '%s/j1-greedy-sparse.h5' '%s/j3-greedy-sparse.h5'",
			 tmpdir, tmpdir);
		cr_assert_eq(system(cmd), 0, "greedy-sparse outputs differ byte-wise");
	}
	/* refuses to overwrite */
	cr_assert_eq(run("-q -a greedy coact.h5 -o j1-greedy.h5", "over"), 1);
	cr_assert_eq(run("-q -f -a greedy coact.h5 -o j1-greedy.h5", "over2"), 0);
	/* refine alone (runs its own greedy) equals refine reusing greedy's result */
	cr_assert_eq(run("-q -a refine coact.h5 -o alone.h5", "alone"), 0, "%s", slurp("alone.err"));
	for (uint32_t l = 0; l < 3; l++) {
		struct nl_placement_layer p1, p2;

		read_perm("alone.h5", l, &p1);
		read_perm("j1-refine.h5", l, &p2);
		cr_assert_arr_eq(p1.perm, p2.perm, 24 * sizeof(uint32_t));
		cr_assert_float_eq(p1.objective, p2.objective, 1e-12);
		placement_free(&p1);
		placement_free(&p2);
	}
	/* candidates ranked by normalised co-activation */
	cr_assert_eq(run("-q -a greedy-sparse,refine --rank norm -k 3 coact.h5 -o 'norm-{algo}.h5'",
			 "norm"), 0, "%s", slurp("norm.err"));
	{
		struct nl_placement_layer p;

		read_perm("norm-refine.h5", 0, &p);
		assert_perm(p.perm, p.inv, 24);
		cr_assert(strstr(p.params, "candidates=norm"), "%s", p.params);
		placement_free(&p);
	}
	cr_assert_eq(run("-q -a refine --rank fancy coact.h5 -o x.h5", "rankbad"), 2);
	/* layer range */
	cr_assert_eq(run("-q -a greedy --layers 1-2 coact.h5 -o part.h5", "part"), 0);
	cr_assert_eq(run("-q -a greedy --layers 2-5 coact.h5 -o bad.h5", "badpart"), 1);
	/* eval */
	cr_assert_eq(run("eval -q -p j1-identity.h5 -p j1-greedy.h5 -p j1-refine.h5 -t trace.h5",
			 "eval"), 0, "%s", slurp("eval.err"));
	s = slurp("eval.out");
	cr_assert(strstr(s, "reads / token") && strstr(s, "mean run"), "%s", s);
	free(s);
	cr_assert_eq(run("eval -q --json -p j1-identity.h5 -p part.h5 -t trace.h5", "evalj"), 0,
		     "%s", slurp("evalj.err"));
	s = slurp("evalj.out");
	cr_assert(strstr(s, "reads_per_token") && strstr(s, "\"layer_first\""), "%s", s);
	free(s);
	cr_assert_eq(run("eval -q -p j1-identity.h5 -t coact.h5", "evalbad"), 1);
	/* same width, another model: refused, naming both models */
	cr_assert_eq(write_other_model_trace("other.h5", "other"), 0, "%s", nl_diag_msg());
	cr_assert_eq(write_other_model_trace("same.h5", "tiny"), 0, "%s", nl_diag_msg());
	cr_assert_eq(run("eval -q -p j1-identity.h5 -t same.h5", "evalsame"), 0, "%s",
		     slurp("evalsame.err"));
	cr_assert_eq(run("eval -q -p j1-identity.h5 -t other.h5", "evalother"), 1);
	s = slurp("evalother.err");
	cr_assert(strstr(s, "'tiny'") && strstr(s, "'other'"), "%s", s);
	free(s);
}
