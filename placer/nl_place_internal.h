/* Internal helpers shared by the placer's sources. Not installed. */
#ifndef NL_PLACE_INTERNAL_H
#define NL_PLACE_INTERNAL_H

#include <stdint.h>

#include "nl_place.h"

#define NL_PLACE_NONE UINT32_MAX

/*
 * Symmetric lookup of f(i, j): the triangle when present, else the union of the
 * top-K lists (f(i,j) when j is in i's first k entries or i in j's, else 0) as
 * sorted adjacency rows searched by bisection.
 */
struct nl_place_weights {
	uint32_t n;
	const uint32_t *pairs;   /* triangle, or NULL */
	uint64_t *row_start;     /* [n + 1] adjacency rows when pairs is NULL */
	uint32_t *row_ids;       /* sorted ids */
	uint32_t *row_counts;
};

int nl_place_weights_init(struct nl_place_weights *w, const struct nl_coact_layer *stats,
			  uint32_t k, bool use_pairs);
void nl_place_weights_free(struct nl_place_weights *w);

static inline uint32_t nl_place_weight(const struct nl_place_weights *w, uint32_t i, uint32_t j)
{
	uint64_t lo, hi;

	if (i >= w->n || j >= w->n || i == j)
		return 0;
	if (w->pairs) {
		if (i > j) {
			uint32_t t = i;

			i = j;
			j = t;
		}
		return w->pairs[nl_tri_index(w->n, i, j)];
	}
	lo = w->row_start[i];
	hi = w->row_start[i + 1];
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (w->row_ids[mid] < j)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < w->row_start[i + 1] && w->row_ids[lo] == j ? w->row_counts[lo] : 0;
}

/*
 * Union-find + degree bookkeeping of Algorithm 1 (lines 4-18) and the walk
 * (lines 19-24, as intended).
 */
struct nl_place_linker {
	uint32_t n;
	uint32_t *parent;
	uint32_t *nbr;           /* [2n], NL_PLACE_NONE when free */
	uint8_t *deg;
	uint64_t links;
};

int nl_place_linker_init(struct nl_place_linker *lk, uint32_t n);
void nl_place_linker_free(struct nl_place_linker *lk);
/* Links i and j when both have fewer than two links and lie on different paths. */
bool nl_place_linker_try(struct nl_place_linker *lk, uint32_t i, uint32_t j);
/*
 * Walks every path from its end with the smaller id (Algorithm 1 lines 19-24
 * as intended) and concatenates the paths by total f(i) descending (count may
 * be NULL: all 0), ties by that end id, into perm. *joins (may be NULL) gets
 * the number of paths - 1.
 */
int nl_place_linker_walk(const struct nl_place_linker *lk, const uint64_t *count,
			 uint32_t *perm, uint64_t *joins);

/* Monotonic seconds. */
double nl_place_now(void);

#endif
