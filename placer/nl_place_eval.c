/*
 * Judging a placement on a trace: reads per token (contiguous runs of active
 * neurons in placement order), run lengths (paper Figure 11), and the effect
 * of access collapse (section 5.1): runs separated by at most g inactive
 * neurons are read as one, at the price of reading the g neurons between.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "nl_place.h"
#include "nl_place_internal.h"

uint64_t nl_place_run_bucket_lo(unsigned b)
{
	if (b == 0)
		return 1;
	return ((uint64_t)1 << (b - 1)) + 1;
}

static unsigned run_bucket(uint64_t len)
{
	unsigned b = 0;

	/* smallest b with len <= 2^b */
	while (b + 1 < NL_PLACE_RUN_BUCKETS && ((uint64_t)1 << b) < len)
		b++;
	return b;
}

void nl_place_eval_add(struct nl_place_eval *dst, const struct nl_place_eval *src)
{
	dst->n_tokens += src->n_tokens;
	dst->active += src->active;
	dst->runs += src->runs;
	if (src->max_run > dst->max_run)
		dst->max_run = src->max_run;
	for (unsigned b = 0; b < NL_PLACE_RUN_BUCKETS; b++)
		dst->run_hist[b] += src->run_hist[b];
	for (unsigned g = 0; g <= NL_PLACE_GAP_MAX; g++) {
		dst->reads_collapsed[g] += src->reads_collapsed[g];
		dst->extra_collapsed[g] += src->extra_collapsed[g];
	}
}

int nl_place_eval_layer(const struct nl_csr *trace, const struct nl_placement_layer *pl,
			struct nl_place_eval *acc)
{
	const uint32_t n = pl->n_neurons;
	const uint64_t words = ((uint64_t)n + 63) / 64;
	uint64_t gap_count[NL_PLACE_GAP_MAX + 1] = { 0 };
	uint64_t runs = 0, active = 0, max_run = acc->max_run;
	uint64_t *bm;
	int err = 0;

	if (trace->n_neurons != n)
		return nl_diag(NL_E_MISMATCH, "trace has %" PRIu32 " neurons per layer, the placement "
			       "%" PRIu32 "; use a placement computed for this model", trace->n_neurons, n);
	if (!pl->inv)
		return nl_diag(NL_E_INVAL, "placement has no inverse permutation");
	bm = calloc(words ? words : 1, sizeof(*bm));
	if (!bm)
		return -ENOMEM;
	for (uint64_t t = 0; t < trace->n_tokens; t++) {
		uint64_t lo = trace->indptr[t], hi = trace->indptr[t + 1];
		uint64_t wmin = words, wmax = 0, last = 0, run = 0;
		bool any = false;

		for (uint64_t x = lo; x < hi; x++) {
			uint32_t id = trace->indices[x], q;

			if (id >= n) {
				err = nl_diag(NL_E_FORMAT, "trace token %" PRIu64 " names neuron %" PRIu32
					      ", expected < %" PRIu32 "; the trace is damaged, re-run "
					      "nl-profile", t, id, n);
				goto out_free;
			}
			q = pl->inv[id];
			if (q >= n) {
				err = nl_diag(NL_E_FORMAT, "placement puts neuron %" PRIu32 " at %" PRIu32
					      ", expected < %" PRIu32, id, q, n);
				goto out_free;
			}
			bm[q >> 6] |= (uint64_t)1 << (q & 63);
			if (q >> 6 < wmin)
				wmin = q >> 6;
			if (q >> 6 > wmax)
				wmax = q >> 6;
		}
		for (uint64_t wi = wmin; wi <= wmax && wi < words; wi++) {
			uint64_t bits = bm[wi];

			bm[wi] = 0;
			while (bits) {
				uint64_t q = wi * 64 + (uint64_t)__builtin_ctzll(bits);

				bits &= bits - 1;
				active++;
				if (any && q == last + 1) {
					run++;
				} else {
					if (any) {
						uint64_t gap = q - last - 1;

						acc->run_hist[run_bucket(run)]++;
						if (run > max_run)
							max_run = run;
						if (gap <= NL_PLACE_GAP_MAX)
							gap_count[gap]++;
					}
					runs++;
					run = 1;
					any = true;
				}
				last = q;
			}
		}
		if (any) {
			acc->run_hist[run_bucket(run)]++;
			if (run > max_run)
				max_run = run;
		}
	}
	acc->n_tokens += trace->n_tokens;
	acc->active += active;
	acc->runs += runs;
	acc->max_run = max_run;
	{
		uint64_t merged = 0, extra = 0;

		for (unsigned g = 0; g <= NL_PLACE_GAP_MAX; g++) {
			merged += gap_count[g];
			extra += (uint64_t)g * gap_count[g];
			acc->reads_collapsed[g] += runs - merged;
			acc->extra_collapsed[g] += extra;
		}
	}

out_free:
	free(bm);
	return err;
}
