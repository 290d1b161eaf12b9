/*
 * Placer library: orders the FFN neurons of one layer so that neurons that are
 * often active together sit next to each other in flash (Neuralink sections
 * 4.2-4.3), and judges placements on held-out traces (section 5.1, Figure 11).
 *
 * Objective. For a placement perm, the expected number of adjacent co-active
 * pairs per token is  sum_p f(perm[p], perm[p+1]) / n_tokens. A token whose
 * active set has A neurons forming R contiguous runs needs R reads and has
 * A - R adjacent co-active pairs, so the expected reads per token are
 * sum_i P(i) - objective: maximising the objective minimises reads. This is
 * the shortest Hamiltonian path under dist(i, j) = 1 - P(ij) (equation 3).
 *
 * All functions are deterministic: the same input gives the same output,
 * whatever the thread count (the library itself is single-threaded per layer;
 * callers place layers in parallel). Ties are broken by neuron id, see
 * docs/placement.md. Nothing here prints.
 */
#ifndef NL_PLACE_H
#define NL_PLACE_H

#include <stdbool.h>
#include <stdint.h>

#include "nl_formats.h"

enum nl_place_algo {
	NL_PLACE_IDENTITY = 0,      /* model order */
	NL_PLACE_FREQUENCY = 1,     /* f(i) descending, ties by id ("Neuralink-S") */
	NL_PLACE_GREEDY = 2,        /* Algorithm 1 over every pair (needs the triangle) */
	NL_PLACE_GREEDY_SPARSE = 3, /* Algorithm 1 over the top-K candidate edges only */
	NL_PLACE_REFINE = 4,        /* greedy, then Or-opt / 2-opt local search */
	NL_PLACE_N_ALGOS = 5,
};

/* "identity", "frequency", "greedy", "greedy-sparse", "refine"; "?" when out of range. */
const char *nl_place_algo_name(enum nl_place_algo algo);
/* Parses one of the names above; NL_E_INVAL with a diagnostic listing them otherwise. */
int nl_place_algo_parse(enum nl_place_algo *out, const char *name);

/* Default number of candidate neighbours when the statistics carry no top-K lists. */
#define NL_PLACE_DEFAULT_K 16

struct nl_place_opts {
	enum nl_place_algo algo;
	/*
	 * Candidate neighbours per neuron for greedy-sparse and refine: the
	 * first k entries of each top-K list (0 = all the statistics carry).
	 * When the statistics have no lists they are computed from the
	 * triangle (k, or NL_PLACE_DEFAULT_K when k is 0).
	 */
	uint32_t k;
	/*
	 * refine: start from greedy-sparse and weigh moves with the top-K
	 * lists only, even when the triangle is present.
	 */
	bool sparse;
	/* refine: at most this many improving moves (0 = until a local optimum). */
	uint64_t move_budget;
	/*
	 * refine: stop after this many seconds (0 = no limit). A safety bound:
	 * when it triggers, the result depends on timing (stats.time_limit_hit).
	 */
	double time_limit;
	/* greedy: pairs collected and sorted per band (0 = 16M, 128 MB). */
	uint64_t band_pairs;
	/*
	 * refine: the greedy placement to start from when the caller has it
	 * already (it must be what greedy, or greedy-sparse when the triangle is
	 * absent or sparse is set, returns for these statistics); NULL = run it.
	 */
	const uint32_t *start;
};
void nl_place_opts_default(struct nl_place_opts *opts);

/* What a placement run did (for --json and the benchmarks). */
struct nl_place_stats {
	uint64_t candidate_edges;  /* edges sorted (greedy: f > 0 pairs it looked at) */
	uint32_t bands;            /* greedy: sort bands used */
	uint64_t links;            /* links made from co-active edges */
	uint64_t joins;            /* links made when joining leftover paths (f = 0 or unknown) */
	uint64_t moves_2opt;       /* refine: improving 2-opt moves applied */
	uint64_t moves_oropt;      /* refine: improving Or-opt moves applied */
	uint64_t weight_before;    /* refine: path weight (sum of f) before the local search */
	uint64_t weight;           /* path weight of the result: sum f(perm[p], perm[p+1]) */
	bool weight_exact;         /* weight from the triangle (else a top-K lower bound) */
	bool time_limit_hit;
	bool move_budget_hit;
	double seconds;
};

/*
 * Places one layer. stats must have count[] and, as the algorithm needs, the
 * triangle (greedy; refine unless opts->sparse) or top-K lists (greedy-sparse,
 * refine; computed from the triangle when absent). On success out holds newly
 * allocated perm and inv (free with nl_placement_layer_free()), objective,
 * algo and params; st (may be NULL) is filled. Returns 0, NL_E_INVAL for bad
 * options, NL_E_MISSING when the statistics lack what the algorithm needs,
 * NL_E_FORMAT for inconsistent statistics, -ENOMEM.
 */
int nl_place_layer(const struct nl_coact_layer *stats, const struct nl_place_opts *opts,
		   struct nl_placement_layer *out, struct nl_place_stats *st);

/* ---- the algorithms one by one; perm has stats->n_neurons entries ---- */

/* Sorts by f(i) descending, ties by id ascending. */
int nl_place_frequency(const struct nl_coact_layer *stats, uint32_t *perm);

/*
 * Algorithm 1 over all pairs: edges by f(i,j) descending, ties by (i, j)
 * ascending; a union-find refuses cycles and degree counts a third link.
 * Pairs are counting-sorted in bands of at most band_pairs (0 = default),
 * skipping pairs whose ends already have two links; once few neurons are
 * still open the pairs among them are gathered and sorted at once. When the pairs
 * with f > 0 run out, the remaining paths (all joins tie at distance 1) are
 * concatenated by total f(i) descending, ties by smaller end id, each walked
 * from its end with the smaller id.
 */
int nl_place_greedy(const struct nl_coact_layer *stats, uint64_t band_pairs,
		    uint32_t *perm, struct nl_place_stats *st);

/*
 * The same greedy over the union of the first k entries (0 = all) of the
 * top-K lists (computed from the triangle when the statistics have none);
 * the leftover paths are joined as in nl_place_greedy().
 */
int nl_place_greedy_sparse(const struct nl_coact_layer *stats, uint32_t k,
			   uint32_t *perm, struct nl_place_stats *st);

/*
 * Local search on perm (in place): Or-opt (move a segment of 1-3 neurons,
 * possibly reversed, next to a candidate neighbour) and 2-opt (reverse a
 * segment so that a neuron lands next to a candidate neighbour), with
 * don't-look bits. Every applied move strictly increases the path weight
 * computed with the triangle when present (and !opts->sparse), else with the
 * top-K weights (f(i,j) when j is in i's list or i in j's, else 0). Candidate
 * neighbours are the first opts->k entries of the top-K lists (computed from
 * the triangle when absent). Bounded by opts->move_budget and time_limit.
 */
int nl_place_refine(const struct nl_coact_layer *stats, const struct nl_place_opts *opts,
		    uint32_t *perm, struct nl_place_stats *st);

/*
 * Path weight sum_p f(perm[p], perm[p+1]): exact from the triangle when
 * present (*exact = true), else the top-K lower bound. exact may be NULL.
 */
int nl_place_path_weight(const struct nl_coact_layer *stats, const uint32_t *perm,
			 uint64_t *weight, bool *exact);

/*
 * Fills stats->topk_ids/topk_counts (newly allocated, stats->k = k) from the
 * triangle with the ranking stats->rank, on the calling thread: the coact
 * library's nl_coact_topk_ranked(), the same lists nl-coact writes (only
 * pairs with count > 0; unused slots: id UINT32_MAX, count 0). Replaces (and
 * frees) lists already there. Needs the triangle.
 */
int nl_place_topk_from_pairs(struct nl_coact_layer *stats, uint32_t k);

/* Checks count[], the top-K lists and their sizes; names `what` in the diagnostic. */
int nl_place_check_stats(const struct nl_coact_layer *stats, const char *what);

/* ---- judging placements on traces (section 5.1, Figure 11) ---- */

#define NL_PLACE_GAP_MAX 8        /* collapse gaps of up to 0..8 neurons */
#define NL_PLACE_RUN_BUCKETS 16   /* run lengths 1, 2, 3-4, 5-8, ..., >= 2^14+1 */

/*
 * Counters of one layer (or a sum of layers) for one placement on one trace.
 * A run is a maximal set of active neurons at consecutive positions; each run
 * is one read. Collapsing gaps of up to g inactive neurons merges runs
 * separated by at most g positions, at the cost of reading those neurons.
 */
struct nl_place_eval {
	uint64_t n_tokens;
	uint64_t active;          /* active neurons summed over tokens */
	uint64_t runs;            /* reads without collapsing */
	uint64_t max_run;         /* longest run, neurons */
	uint64_t run_hist[NL_PLACE_RUN_BUCKETS]; /* bucket b: 1 (b=0), 2^(b-1)+1 .. 2^b */
	uint64_t reads_collapsed[NL_PLACE_GAP_MAX + 1]; /* [g]: reads with gaps <= g merged */
	uint64_t extra_collapsed[NL_PLACE_GAP_MAX + 1]; /* [g]: inactive neurons read */
};

/* Lower bound of run-length bucket b (1, 2, 3, 5, 9, ...). */
uint64_t nl_place_run_bucket_lo(unsigned b);

/*
 * Adds the counters of one trace layer under one placement to acc (zero it
 * first). NL_E_MISMATCH when the neuron counts differ.
 */
int nl_place_eval_layer(const struct nl_csr *trace, const struct nl_placement_layer *pl,
			struct nl_place_eval *acc);
/* dst += src (max for max_run). */
void nl_place_eval_add(struct nl_place_eval *dst, const struct nl_place_eval *src);

#endif
