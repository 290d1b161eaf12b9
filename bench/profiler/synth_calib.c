/*
 * synth-calib: the statistics of a trace that matter for neuron placement,
 * to compare synthetic traces (nl-profile synth) with real ones
 * (docs/profiling.md, "Calibration of the synthetic generator").
 *
 *   synth-calib [--sample N] [--layers L] [--min-count C] TRACE.h5...
 *
 * Per layer, over the neurons:
 *  - density: mean active fraction per token;
 *  - frequency skew: Gini coefficient of the per-neuron activation counts,
 *    and the share of all activations held by the hottest 10% of neurons;
 *  - co-activation concentration: for a seeded sample of neurons i (active in
 *    at least C tokens), the share of i's co-activation mass sum_j f(i,j) held
 *    by its top-8 partners, and the same share expected if neurons fired
 *    independently (f(i,j) proportional to f(j)); their ratio is the "lift".
 *    At high density this share is dominated by the frequencies (saturated
 *    hot neurons), so also: the mean phi coefficient (correlation of the 0/1
 *    activations) of i with its 8 most correlated partners; near 0 (~ the
 *    noise level, a few / sqrt(tokens)) when neurons fire independently.
 *    Placement can only gain where co-activation is concentrated.
 * Prints one line per trace: the mean over layers and the range [min, max].
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nl_cli.h"
#include "nl_profile.h"

#define TOP 8

struct layer_stats {
	double density, gini, top10_share, top8_share, top8_indep, lift, phi8;
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
	if (!n)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Sum of the k largest values of v[0..n) except index skip. */
static double top_sum(const double *v, uint32_t n, uint32_t skip, int k)
{
	double best[TOP] = { 0 };
	double s = 0;

	for (uint32_t j = 0; j < n; j++) {
		double x = v[j];

		if (j == skip || x <= best[k - 1])
			continue;
		/* Insertion into the small descending list. */
		int p = k - 1;

		while (p > 0 && best[p - 1] < x) {
			best[p] = best[p - 1];
			p--;
		}
		best[p] = x;
	}
	for (int i = 0; i < k; i++)
		s += best[i];
	return s;
}

static int layer_stats(const struct nl_csr *c, uint32_t n_sample, uint64_t min_count, uint64_t seed,
		       struct layer_stats *st)
{
	uint32_t n = c->n_neurons;
	uint64_t *count = calloc(n, sizeof(*count)), *sorted = malloc(n * sizeof(*sorted));
	int32_t *slot = malloc(n * sizeof(*slot));
	uint32_t *cand = malloc(n * sizeof(*cand)), n_cand = 0, s_n;
	double *pairs = NULL, *row = malloc(n * sizeof(*row)), *shares, *indeps, *lifts, *phis;
	double *phi_row = malloc(n * sizeof(*phi_row)), T = (double)c->n_tokens;
	uint64_t total = c->indptr[c->n_tokens], top10 = 0;
	double wsum = 0;

	if (!count || !sorted || !slot || !cand || !row)
		return -1;
	for (uint64_t i = 0; i < total; i++)
		count[c->indices[i]]++;
	memcpy(sorted, count, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_u64);
	for (uint32_t i = 0; i < n; i++)
		wsum += (double)(i + 1) * (double)sorted[i];
	st->density = (double)total / ((double)c->n_tokens * n);
	st->gini = total ? 2 * wsum / ((double)n * (double)total) - (double)(n + 1) / n : 0;
	for (uint32_t i = n - (n + 9) / 10; i < n; i++)
		top10 += sorted[i];
	st->top10_share = total ? (double)top10 / (double)total : 0;

	/* Seeded sample of the neurons active often enough to have a co-activation profile. */
	for (uint32_t i = 0; i < n; i++)
		if (count[i] >= min_count)
			cand[n_cand++] = i;
	for (uint32_t i = 0; i + 1 < n_cand; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		uint32_t j = i + (uint32_t)((seed >> 33) % (n_cand - i));
		uint32_t t = cand[i];

		cand[i] = cand[j];
		cand[j] = t;
	}
	s_n = n_cand < n_sample ? n_cand : n_sample;
	for (uint32_t i = 0; i < n; i++)
		slot[i] = -1;
	for (uint32_t s = 0; s < s_n; s++)
		slot[cand[s]] = (int32_t)s;
	pairs = calloc((size_t)s_n * n + 1, sizeof(*pairs));
	shares = malloc((s_n + 1) * sizeof(*shares));
	indeps = malloc((s_n + 1) * sizeof(*indeps));
	lifts = malloc((s_n + 1) * sizeof(*lifts));
	phis = malloc((s_n + 1) * sizeof(*phis));
	if (!pairs || !shares || !indeps || !lifts || !phis || !phi_row)
		return -1;
	for (uint64_t t = 0; t < c->n_tokens; t++) {
		for (uint64_t a = c->indptr[t]; a < c->indptr[t + 1]; a++) {
			int32_t s = slot[c->indices[a]];

			if (s < 0)
				continue;
			double *pr = pairs + (size_t)s * n;

			for (uint64_t b = c->indptr[t]; b < c->indptr[t + 1]; b++)
				pr[c->indices[b]] += 1;
		}
	}
	for (uint32_t j = 0; j < n; j++)
		row[j] = (double)count[j];
	for (uint32_t s = 0; s < s_n; s++) {
		uint32_t i = cand[s];
		double *pr = pairs + (size_t)s * n;
		double mass = 0, fmass = 0;

		for (uint32_t j = 0; j < n; j++) {
			if (j == i)
				continue;
			mass += pr[j];
			fmass += row[j];
		}
		shares[s] = mass > 0 ? top_sum(pr, n, i, TOP) / mass : 0;
		indeps[s] = fmass > 0 ? top_sum(row, n, i, TOP) / fmass : 0;
		lifts[s] = indeps[s] > 0 ? shares[s] / indeps[s] : 0;
		/* Phi coefficient (correlation of the 0/1 activations) with every partner. */
		{
			double pi = row[i] / T;

			for (uint32_t j = 0; j < n; j++) {
				double pj = row[j] / T, den = pi * (1 - pi) * pj * (1 - pj);

				phi_row[j] = j != i && den > 0 ? (pr[j] / T - pi * pj) / sqrt(den) : 0;
			}
			phis[s] = top_sum(phi_row, n, i, TOP) / TOP;
		}
	}
	st->phi8 = median(phis, s_n);
	st->top8_share = median(shares, s_n);
	st->top8_indep = median(indeps, s_n);
	st->lift = median(lifts, s_n);
	free(count);
	free(sorted);
	free(slot);
	free(cand);
	free(pairs);
	free(row);
	free(shares);
	free(indeps);
	free(lifts);
	free(phis);
	free(phi_row);
	return 0;
}

static const char usage[] = "Usage: synth-calib [--sample N] [--layers L] [--min-count C] TRACE.h5...\n";

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "sample", required_argument, NULL, 's' },
		{ "layers", required_argument, NULL, 'l' },
		{ "min-count", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	uint64_t n_sample = 256, max_layers = 8, min_count = 20;
	int c;

	nl_cli_init("synth-calib");
	while ((c = getopt_long(argc, argv, "s:l:c:h", longopts, NULL)) != -1) {
		switch (c) {
		case 's': n_sample = nl_parse_u64(usage, "--sample", optarg); break;
		case 'l': max_layers = nl_parse_u64(usage, "--layers", optarg); break;
		case 'c': min_count = nl_parse_u64(usage, "--min-count", optarg); break;
		case 'h': printf("%s", usage); return 0;
		default: nl_usage_error(usage, "unknown option");
		}
	}
	if (optind >= argc)
		nl_usage_error(usage, "no trace given");
	printf("mean over layers (min-max)\n%-30s %3s %6s %7s | %-19s | %-18s | %-18s | %-18s | %-18s | %s\n",
	       "trace", "lay", "neur", "tokens", "density", "gini(freq)", "hot10% share", "top-8 share",
	       "top-8 share/indep", "top-8 phi");
	for (int a = optind; a < argc; a++) {
		struct nl_trace_reader *r;
		const struct nl_trace_meta *m;
		struct layer_stats sum = { 0 }, lo = { 0 }, hi = { 0 };
		uint32_t n_layers, step;
		int err = nl_trace_open(&r, argv[a]);
		uint32_t used = 0;

		if (err)
			nl_die_err(err, NULL);
		m = nl_trace_get_meta(r);
		n_layers = m->model.n_layers;
		step = n_layers > max_layers ? (n_layers + (uint32_t)max_layers - 1) / (uint32_t)max_layers : 1;
		for (uint32_t l = 0; l < n_layers; l += step) {
			struct nl_csr csr;
			struct layer_stats st;

			err = nl_trace_read_layer(r, l, &csr);
			if (err)
				nl_die_err(err, NULL);
			if (layer_stats(&csr, (uint32_t)n_sample, min_count, 0x5eed + l, &st))
				nl_die("out of memory");
			nl_csr_free(&csr);
			if (!used) {
				lo = st;
				hi = st;
			}
#define ACC(f)                                   \
			sum.f += st.f;                   \
			lo.f = st.f < lo.f ? st.f : lo.f; \
			hi.f = st.f > hi.f ? st.f : hi.f;
			ACC(density) ACC(gini) ACC(top10_share) ACC(top8_share) ACC(lift) ACC(phi8)
#undef ACC
			used++;
		}
		{
			const char *name = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];

			printf("%-30.30s %3u %6u %7" PRIu64, name, used, m->model.n_neurons, m->n_tokens);
			printf(" | %5.3f (%.3f-%.3f)", sum.density / used, lo.density, hi.density);
			printf(" | %5.3f (%.2f-%.2f)", sum.gini / used, lo.gini, hi.gini);
			printf(" | %5.3f (%.2f-%.2f)", sum.top10_share / used, lo.top10_share, hi.top10_share);
			printf(" | %5.3f (%.2f-%.2f)", sum.top8_share / used, lo.top8_share, hi.top8_share);
			printf(" | %5.2f (%.2f-%.2f)", sum.lift / used, lo.lift, hi.lift);
			printf(" | %5.3f (%.3f-%.3f)\n", sum.phi8 / used, lo.phi8, hi.phi8);
		}
		nl_trace_close(r);
	}
	return 0;
}
