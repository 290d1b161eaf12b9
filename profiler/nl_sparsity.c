/*
 * What "active" means: the sparsity rules that turn one token's FFN gate
 * activations into the increasing list of active neuron ids, and the
 * per-layer threshold calibration of the CATS-style rule.
 *
 * Neuron i's gate, up and down rows are one unit (Neuralink section 4.1): the
 * rules look at the gate activation act(x W_gate)_i only.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nl_profile.h"

uint32_t nl_active_relu(const float *act, uint32_t n, uint32_t *ids)
{
	uint32_t k = 0;

	/* NaN compares false: a broken activation never counts as active. */
	for (uint32_t i = 0; i < n; i++)
		if (act[i] > 0.0f)
			ids[k++] = i;
	return k;
}

uint32_t nl_active_threshold(const float *act, uint32_t n, double threshold, uint32_t *ids)
{
	uint32_t k = 0;

	for (uint32_t i = 0; i < n; i++)
		if ((double)fabsf(act[i]) > threshold)
			ids[k++] = i;
	return k;
}

uint32_t nl_topk_count(double density, uint32_t n)
{
	double k;

	if (!(density > 0))
		return 0;
	if (density >= 1)
		return n;
	k = floor(density * n + 0.5);
	if (k < 1)
		k = 1;
	return k > n ? n : (uint32_t)k;
}

/*
 * Sort key of neuron i: larger |act| first, then lower id first. The bits of a
 * non-negative float order like the float; +1 leaves key 0 for NaN, which
 * therefore ranks below every number. The low word is ~i so that among equal
 * magnitudes the lower id has the larger key. Keys are distinct.
 */
static inline uint64_t topk_key(float a, uint32_t i)
{
	uint32_t bits;
	float m = fabsf(a);

	memcpy(&bits, &m, sizeof(bits));
	if (isnan(a))
		bits = 0;
	else
		bits += 1;
	return ((uint64_t)bits << 32) | (uint64_t)(UINT32_MAX - i);
}

/* The k-th largest of keys[0..n) (1 <= k <= n); reorders keys. */
static uint64_t select_kth_largest(uint64_t *keys, uint32_t n, uint32_t k)
{
	uint32_t lo = 0, hi = n - 1, want = k - 1;
	uint64_t state = 0x9e3779b97f4a7c15ull ^ n;

	while (lo < hi) {
		uint32_t span = hi - lo + 1, store = lo, p;
		uint64_t pivot, t;

		/* Deterministic pseudo-random pivot: no quadratic case from sorted input. */
		state ^= state << 13;
		state ^= state >> 7;
		state ^= state << 17;
		p = lo + (uint32_t)(state % span);
		pivot = keys[p];
		keys[p] = keys[hi];
		keys[hi] = pivot;
		/* Lomuto partition, descending; keys are distinct so the pivot lands alone. */
		for (uint32_t i = lo; i < hi; i++) {
			if (keys[i] > pivot) {
				t = keys[i];
				keys[i] = keys[store];
				keys[store++] = t;
			}
		}
		keys[hi] = keys[store];
		keys[store] = pivot;
		if (want == store)
			return pivot;
		if (want < store)
			hi = store - 1;
		else
			lo = store + 1;
	}
	return keys[want];
}

uint32_t nl_active_topk(const float *act, uint32_t n, uint32_t k, uint32_t *ids, uint64_t *scratch)
{
	uint64_t kth;
	uint32_t m = 0;

	if (k == 0 || n == 0)
		return 0;
	if (k >= n) {
		for (uint32_t i = 0; i < n; i++)
			ids[i] = i;
		return n;
	}
	for (uint32_t i = 0; i < n; i++)
		scratch[i] = topk_key(act[i], i);
	kth = select_kth_largest(scratch, n, k);
	/* Keys are distinct, so exactly k ids pass; scanning in id order sorts them. */
	for (uint32_t i = 0; i < n; i++)
		if (topk_key(act[i], i) >= kth)
			ids[m++] = i;
	return m;
}

/* ---- threshold calibration ---- */

/*
 * Histogram of |act| over the profiling tokens of every layer, by the top bits
 * of the float: the exponent and NL_THRESH_MANT_BITS bits of mantissa, so a bin
 * spans a relative width of 2^-10 (~0.1%). Bins order like the values.
 */
#define NL_THRESH_MANT_BITS 10
#define NL_THRESH_SHIFT (23 - NL_THRESH_MANT_BITS)
#define NL_THRESH_BINS (1u << (31 - NL_THRESH_SHIFT))

struct nl_thresh_hist {
	uint32_t n_layers;
	uint64_t *bins;   /* [n_layers][NL_THRESH_BINS]; NaN and inf land in the top bins, never chosen */
	uint64_t *total;  /* [n_layers] values counted */
};

int nl_thresh_hist_create(struct nl_thresh_hist **out, uint32_t n_layers)
{
	struct nl_thresh_hist *h;

	*out = NULL;
	if (!n_layers || n_layers > NL_MAX_LAYERS)
		return nl_diag(NL_E_INVAL, "threshold histogram: %u layers, expected 1..%d", n_layers, NL_MAX_LAYERS);
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->n_layers = n_layers;
	h->bins = calloc((size_t)n_layers * NL_THRESH_BINS, sizeof(*h->bins));
	h->total = calloc(n_layers, sizeof(*h->total));
	if (!h->bins || !h->total) {
		nl_thresh_hist_free(h);
		return -ENOMEM;
	}
	*out = h;
	return 0;
}

void nl_thresh_hist_free(struct nl_thresh_hist *h)
{
	if (!h)
		return;
	free(h->bins);
	free(h->total);
	free(h);
}

void nl_thresh_hist_add(struct nl_thresh_hist *h, uint32_t layer, const float *act, size_t n)
{
	uint64_t *bins = h->bins + (size_t)layer * NL_THRESH_BINS;

	for (size_t i = 0; i < n; i++) {
		float m = fabsf(act[i]);
		uint32_t bits;

		memcpy(&bits, &m, sizeof(bits));
		bins[bits >> NL_THRESH_SHIFT]++;
	}
	h->total[layer] += n;
}

int nl_thresh_hist_merge(struct nl_thresh_hist *dst, const struct nl_thresh_hist *src)
{
	if (dst->n_layers != src->n_layers)
		return nl_diag(NL_E_MISMATCH, "threshold histograms: %u layers vs %u", dst->n_layers, src->n_layers);
	for (size_t i = 0; i < (size_t)dst->n_layers * NL_THRESH_BINS; i++)
		dst->bins[i] += src->bins[i];
	for (uint32_t l = 0; l < dst->n_layers; l++)
		dst->total[l] += src->total[l];
	return 0;
}

static double bin_low(uint32_t b)
{
	uint32_t bits = b << NL_THRESH_SHIFT;
	float f;

	memcpy(&f, &bits, sizeof(f));
	return f;
}

int nl_thresh_hist_threshold(const struct nl_thresh_hist *h, uint32_t layer, double density,
			     double *threshold)
{
	const uint64_t *bins;
	/* Finite values only: the bins of inf and NaN start at exponent 255. */
	uint32_t top = 255u << (23 - NL_THRESH_SHIFT);
	double target, above = 0;

	*threshold = 0;
	if (layer >= h->n_layers)
		return nl_diag(NL_E_INVAL, "threshold: layer %u out of range (%u layers)", layer, h->n_layers);
	if (!(density > 0 && density <= 1))
		return nl_diag(NL_E_INVAL, "threshold: density %g out of range, expected 0 < density <= 1", density);
	if (!h->total[layer])
		return nl_diag(NL_E_INVAL, "threshold: no activations of layer %u were seen; profile at least one token",
			       layer);
	bins = h->bins + (size_t)layer * NL_THRESH_BINS;
	target = density * (double)h->total[layer];
	/* Walk down from the largest finite values until `target` lie above t. */
	for (uint32_t b = top; b-- > 0;) {
		double c = (double)bins[b];

		if (above + c >= target && c > 0) {
			double lo = bin_low(b), hi = bin_low(b + 1);
			/* Values are taken as spread evenly over the bin. */
			double frac = (target - above) / c;

			*threshold = hi - frac * (hi - lo);
			if (*threshold < lo)
				*threshold = lo;
			/* |act| > t with t below the bin's smallest value would take it all. */
			if (b == 0)
				*threshold = 0;
			return 0;
		}
		above += c;
	}
	/* Fewer non-zero values than the target: everything non-zero is active. */
	*threshold = 0;
	return 0;
}
