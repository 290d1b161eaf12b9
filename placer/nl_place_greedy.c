/*
 * Algorithm 1 of Neuralink (section 4.3): greedy edge matching. Edges are
 * taken by distance 1 - P(ij) ascending, i.e. by f(i,j) descending, ties by
 * (i, j) ascending; an edge is refused when an end already has two links
 * (line 11) or both ends are on the same path (union-find, lines 13-14).
 *
 * Instead of a priority queue over all n^2/2 pairs (134M for n = 16384), the
 * pairs are visited in bands of counts, highest first: a histogram of the
 * counts chooses bands of at most band_pairs pairs, and each band is
 * counting-sorted by one scan of the triangle in (i, j) order that scatters
 * every pair straight to its slot, which yields exactly the order (f desc,
 * i asc, j asc). Counts of 2^20 and more (a million tokens) fall back to
 * coarse buckets sorted with qsort.
 * Pairs with an end that already has two links can never be taken, so later
 * bands skip them while scanning. Pairs with f = 0 all tie at distance 1 and
 * are never sorted: the paths left then are joined by nl_place_linker_walk().
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nl_place.h"
#include "nl_place_internal.h"

#define DEFAULT_BAND_PAIRS (16u << 20)  /* 128 MB of slots */

/* ---- union-find and links ---- */

int nl_place_linker_init(struct nl_place_linker *lk, uint32_t n)
{
	memset(lk, 0, sizeof(*lk));
	lk->n = n;
	lk->parent = malloc((size_t)n * sizeof(uint32_t));
	lk->nbr = malloc(2 * (size_t)n * sizeof(uint32_t));
	lk->deg = calloc(n, 1);
	if (!lk->parent || !lk->nbr || !lk->deg) {
		nl_place_linker_free(lk);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		lk->parent[i] = i;
		lk->nbr[2 * i] = NL_PLACE_NONE;
		lk->nbr[2 * i + 1] = NL_PLACE_NONE;
	}
	return 0;
}

void nl_place_linker_free(struct nl_place_linker *lk)
{
	free(lk->parent);
	free(lk->nbr);
	free(lk->deg);
	memset(lk, 0, sizeof(*lk));
}

static uint32_t uf_find(uint32_t *parent, uint32_t x)
{
	uint32_t root = x;

	while (parent[root] != root)
		root = parent[root];
	while (parent[x] != root) {
		uint32_t next = parent[x];

		parent[x] = root;
		x = next;
	}
	return root;
}

bool nl_place_linker_try(struct nl_place_linker *lk, uint32_t i, uint32_t j)
{
	uint32_t ri, rj;

	if (lk->deg[i] >= 2 || lk->deg[j] >= 2)
		return false;
	ri = uf_find(lk->parent, i);
	rj = uf_find(lk->parent, j);
	if (ri == rj)
		return false;
	/* the smaller root id wins: deterministic, and paths stay shallow enough
	 * with path compression */
	if (ri < rj)
		lk->parent[rj] = ri;
	else
		lk->parent[ri] = rj;
	lk->nbr[2 * i + lk->deg[i]++] = j;
	lk->nbr[2 * j + lk->deg[j]++] = i;
	lk->links++;
	return true;
}

struct path_desc {
	uint64_t freq;    /* sum of f(i) over the path */
	uint32_t end;     /* its end with the smaller id; the walk starts there */
	uint32_t first;   /* offset of its neurons in the walk buffer */
	uint32_t len;
};

static int path_cmp(const void *a, const void *b)
{
	const struct path_desc *x = a, *y = b;

	if (x->freq != y->freq)
		return x->freq > y->freq ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

int nl_place_linker_walk(const struct nl_place_linker *lk, const uint64_t *count,
			 uint32_t *perm, uint64_t *joins)
{
	const uint32_t n = lk->n;
	uint32_t *walk = malloc((size_t)n * sizeof(uint32_t));
	struct path_desc *paths = malloc((size_t)n * sizeof(*paths));
	uint8_t *seen = calloc(n, 1);
	uint32_t n_paths = 0, filled = 0;
	int err = 0;

	if (!walk || !paths || !seen) {
		err = -ENOMEM;
		goto out_free;
	}
	/*
	 * Algorithm 1 lines 19-24 as intended: start at an end of a path (a
	 * neuron with fewer than two links), append, step to the linked neuron
	 * we did not come from, until the other end. Scanning ids upwards finds
	 * each path first at its end with the smaller id.
	 */
	for (uint32_t i = 0; i < n; i++) {
		uint32_t prev = NL_PLACE_NONE, cur = i;
		struct path_desc *pd;

		if (seen[i] || lk->deg[i] >= 2)
			continue;
		pd = &paths[n_paths++];
		pd->end = i;
		pd->first = filled;
		pd->freq = 0;
		while (cur != NL_PLACE_NONE) {
			uint32_t a = lk->nbr[2 * cur], b = lk->nbr[2 * cur + 1];
			uint32_t nx = a != prev ? a : b;

			if (seen[cur] || filled == n) {
				err = nl_diag(NL_E_INVAL, "placer: links revisit neuron %u", cur);
				goto out_free;
			}
			seen[cur] = 1;
			walk[filled++] = cur;
			pd->freq += count ? count[cur] : 0;
			prev = cur;
			cur = nx;
		}
		pd->len = filled - pd->first;
	}
	if (filled != n) {
		err = nl_diag(NL_E_INVAL, "placer: the links form a cycle (%u of %u neurons on paths)",
			      filled, n);
		goto out_free;
	}
	/*
	 * When the co-active edges run out, several paths remain (singletons
	 * too). They are concatenated by total activation frequency descending,
	 * ties by their smaller end id, each walked from that end. Every pair
	 * left has f = 0 (or is unknown, for greedy-sparse), so all of these
	 * joins tie at distance 1 in Algorithm 1 and this is one of its valid
	 * tie-breaks; it puts hot paths near each other, which helps access
	 * collapse (section 5.1).
	 */
	qsort(paths, n_paths, sizeof(*paths), path_cmp);
	filled = 0;
	for (uint32_t x = 0; x < n_paths; x++) {
		memcpy(perm + filled, walk + paths[x].first, paths[x].len * sizeof(uint32_t));
		filled += paths[x].len;
	}
	if (joins)
		*joins = n_paths ? n_paths - 1 : 0;

out_free:
	free(walk);
	free(paths);
	free(seen);
	return err;
}

/* ---- full greedy ---- */

struct band_edge {
	uint32_t count, i, j;
};

static int edge_cmp(const void *a, const void *b)
{
	const struct band_edge *x = a, *y = b;

	if (x->count != y->count)
		return x->count > y->count ? -1 : 1;
	if (x->i != y->i)
		return x->i < y->i ? -1 : 1;
	return x->j < y->j ? -1 : x->j > y->j;
}

/*
 * When the pairs among the neurons with fewer than two links fit in max_pairs,
 * collects those with 0 < f <= hi_c, sorts them (f desc, i, j), links, and
 * returns 1; returns 0 (nothing done) when there are too many, -ENOMEM.
 */
static int finish_among_open(struct nl_place_linker *lk, const uint32_t *pairs,
			     uint64_t max_pairs, uint32_t hi_c, struct nl_place_stats *st)
{
	const uint32_t n = lk->n;
	uint32_t *open = NULL, n_open = 0;
	struct band_edge *e = NULL;
	uint64_t m = 0;

	for (uint32_t i = 0; i < n; i++)
		n_open += lk->deg[i] < 2;
	if ((uint64_t)n_open * (n_open - (n_open > 0)) / 2 > max_pairs ||
	    (uint64_t)n_open * 16 > n)  /* gathers only pay off when few rows remain */
		return 0;
	open = malloc(((size_t)n_open + 1) * sizeof(*open));
	e = malloc(((uint64_t)n_open * n_open / 2 + 1) * sizeof(*e));
	if (!open || !e) {
		free(open);
		free(e);
		return -ENOMEM;
	}
	n_open = 0;
	for (uint32_t i = 0; i < n; i++)
		if (lk->deg[i] < 2)
			open[n_open++] = i;
	for (uint32_t a = 0; a + 1 < n_open; a++) {
		uint32_t i = open[a];
		const uint32_t *row = pairs + nl_tri_index(n, i, i + 1);

		for (uint32_t b = a + 1; b < n_open; b++) {
			uint32_t j = open[b], c = row[j - i - 1];

			if (c && c <= hi_c)
				e[m++] = (struct band_edge){ c, i, j };
		}
	}
	qsort(e, m, sizeof(*e), edge_cmp);
	for (uint64_t x = 0; x < m && lk->links + 1 < n; x++)
		nl_place_linker_try(lk, e[x].i, e[x].j);
	if (st) {
		st->bands++;
		st->candidate_edges += m;
	}
	free(open);
	free(e);
	return 1;
}

/* Exact histogram up to this count; larger counts use coarse buckets + qsort. */
#define EXACT_COUNTS (1u << 20)
#define EMPTY_SLOT UINT64_MAX

int nl_place_greedy(const struct nl_coact_layer *stats, uint64_t band_pairs,
		    uint32_t *perm, struct nl_place_stats *st)
{
	const uint32_t n = stats->n_neurons;
	const uint32_t *pairs = stats->pairs;
	struct nl_place_linker lk;
	uint64_t *slots = NULL;            /* exact mode: packed (i << 32 | j) in final order */
	struct band_edge *edges = NULL;    /* coarse mode */
	uint64_t *hist = NULL, *offset = NULL, cap = 0;
	uint32_t maxc = 0, shift = 0, nb;
	int64_t hi_b;
	int err;

	if (!pairs)
		return nl_diag(NL_E_MISSING, "greedy needs the pair triangle f(i,j), which is not "
			       "loaded; re-run nl-coact with pairs, or use greedy-sparse");
	if (!band_pairs)
		band_pairs = DEFAULT_BAND_PAIRS;
	err = nl_place_linker_init(&lk, n);
	if (err)
		return err;
	for (uint64_t x = 0, m = nl_tri_size(n); x < m; x++)
		if (pairs[x] > maxc)
			maxc = pairs[x];
	while ((maxc >> shift) >= EXACT_COUNTS)
		shift++;
	nb = (maxc >> shift) + 1;
	hist = calloc(nb, sizeof(*hist));
	offset = malloc((size_t)nb * sizeof(*offset));
	if (!hist || !offset) {
		err = -ENOMEM;
		goto out_free;
	}
	for (uint64_t x = 0, m = nl_tri_size(n); x < m; x++)
		if (pairs[x])
			hist[pairs[x] >> shift]++;

	for (hi_b = (int64_t)nb - 1; hi_b >= 0 && maxc > 0 && lk.links + 1 < n;) {
		int64_t lo_b = hi_b;
		uint64_t want = hist[hi_b], m = 0;
		uint32_t lo_c, hi_c, span;

		if (hi_b < (int64_t)nb - 1) {
			/*
			 * Once few neurons still have fewer than two links, one
			 * gather over the pairs among them replaces the remaining
			 * band scans: every pair with a higher count has been
			 * processed, and every pair with a saturated end is dead.
			 */
			int done = finish_among_open(&lk, pairs, band_pairs,
						     (uint32_t)((((uint64_t)hi_b + 1) << shift) - 1), st);

			if (done < 0) {
				err = done;
				goto out_free;
			}
			if (done)
				break;
		}

		while (lo_b > 0 && want + hist[lo_b - 1] <= band_pairs)
			want += hist[--lo_b];
		lo_c = (uint32_t)((uint64_t)lo_b << shift);
		if (lo_c == 0)
			lo_c = 1;
		hi_c = (uint32_t)((((uint64_t)hi_b + 1) << shift) - 1);
		if (hi_c > maxc)
			hi_c = maxc;
		span = hi_c - lo_c;
		hi_b = lo_b - 1;
		if (want == 0 || lo_c > hi_c)
			continue;
		if (want > cap) {
			free(slots);
			free(edges);
			slots = NULL;
			edges = NULL;
			cap = want;
			if (shift == 0)
				slots = malloc(cap * sizeof(*slots));
			else
				edges = malloc(cap * sizeof(*edges));
			if (!slots && !edges) {
				err = -ENOMEM;
				goto out_free;
			}
		}
		if (shift == 0) {
			/*
			 * Counting sort in one scatter: offset[c] is where the next
			 * pair of count c goes (counts descending); the scan runs
			 * in (i, j) order, so equal counts stay in (i, j) order.
			 * Pairs skipped for saturated ends leave empty slots.
			 */
			uint64_t sum = 0;

			for (int64_t c = hi_c; c >= (int64_t)lo_c; c--) {
				offset[c] = sum;
				sum += hist[c];
			}
			memset(slots, 0xff, want * sizeof(*slots));
		}
		for (uint32_t i = 0; i + 1 < n; i++) {
			const uint32_t *row;

			if (lk.deg[i] >= 2)
				continue;
			row = pairs + nl_tri_index(n, i, i + 1);
			for (uint32_t j = i + 1; j < n; j++) {
				uint32_t c = row[j - i - 1];

				if (c - lo_c > span || lk.deg[j] >= 2)
					continue;
				if (shift == 0)
					slots[offset[c]++] = (uint64_t)i << 32 | j;
				else
					edges[m] = (struct band_edge){ c, i, j };
				m++;
			}
		}
		if (st) {
			st->bands++;
			st->candidate_edges += m;
		}
		if (m == 0)
			continue;
		if (shift == 0) {
			for (uint64_t x = 0; x < want && lk.links + 1 < n; x++)
				if (slots[x] != EMPTY_SLOT)
					nl_place_linker_try(&lk, (uint32_t)(slots[x] >> 32),
							    (uint32_t)slots[x]);
		} else {
			qsort(edges, m, sizeof(*edges), edge_cmp);
			for (uint64_t x = 0; x < m && lk.links + 1 < n; x++)
				nl_place_linker_try(&lk, edges[x].i, edges[x].j);
		}
	}
	if (st)
		st->links = lk.links;
	err = nl_place_linker_walk(&lk, stats->count, perm, st ? &st->joins : NULL);

out_free:
	free(slots);
	free(edges);
	free(hist);
	free(offset);
	nl_place_linker_free(&lk);
	return err;
}

/* ---- sparse greedy ---- */

int nl_place_greedy_sparse(const struct nl_coact_layer *stats, uint32_t k,
			   uint32_t *perm, struct nl_place_stats *st)
{
	struct nl_coact_layer copy = *stats;
	const struct nl_coact_layer *src = stats;
	const uint32_t n = stats->n_neurons;
	struct nl_place_linker lk;
	struct band_edge *edges = NULL;
	uint64_t m = 0;
	int err;

	if (!stats->k) {
		/* no lists stored: derive them from the triangle */
		copy.topk_ids = NULL;
		copy.topk_counts = NULL;
		copy.k = 0;
		err = nl_place_topk_from_pairs(&copy, k ? k : NL_PLACE_DEFAULT_K);
		if (err == NL_E_MISSING)
			err = nl_diag(NL_E_MISSING, "greedy-sparse needs top-K lists or the pair "
				      "triangle; neither is loaded; re-run nl-coact with --topk");
		if (err)
			return err;
		src = &copy;
	}
	if (k == 0 || k > src->k)
		k = src->k;
	err = nl_place_linker_init(&lk, n);
	if (err)
		goto out_copy;
	edges = malloc(((size_t)n * k + 1) * sizeof(*edges));
	if (!edges) {
		err = -ENOMEM;
		goto out_free;
	}
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t r = 0; r < k; r++) {
			uint32_t j = src->topk_ids[(uint64_t)i * src->k + r];
			uint32_t c = src->topk_counts[(uint64_t)i * src->k + r];

			if (c == 0 || j >= n || j == i)
				continue;
			edges[m++] = (struct band_edge){ c, i < j ? i : j, i < j ? j : i };
		}
	}
	/* (f desc, i, j); a pair listed by both ends is tried twice, the second
	 * time refused by the union-find */
	qsort(edges, m, sizeof(*edges), edge_cmp);
	for (uint64_t x = 0; x < m && lk.links + 1 < n; x++)
		nl_place_linker_try(&lk, edges[x].i, edges[x].j);
	if (st) {
		st->candidate_edges = m;
		st->links = lk.links;
	}
	err = nl_place_linker_walk(&lk, stats->count, perm, st ? &st->joins : NULL);

out_free:
	free(edges);
	nl_place_linker_free(&lk);
out_copy:
	if (src == &copy) {
		free(copy.topk_ids);
		free(copy.topk_counts);
	}
	return err;
}
