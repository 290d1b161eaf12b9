/*
 * bench-synth: speed of the synthetic trace generator (nl_synth_layer) at 7B
 * shapes against the straightforward generator measured in the same run: one
 * Bernoulli draw per neuron per token with the same per-neuron probabilities
 * (xoshiro256**, rows sorted by construction).
 *
 *   bench-synth [--tokens T] [--reps R]
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nl_cli.h"
#include "nl_profile.h"
#include "nl_rng.h"

static const char usage[] = "Usage: bench-synth [--tokens T] [--reps R]\n";

/*
 * Baseline: the per-neuron probabilities of the generated layer, then one
 * Bernoulli draw per neuron per token, writing the same CSR output (fresh
 * arrays, like the generator) so both pay for storing the ids.
 */
static double baseline(const struct nl_csr *ref, uint64_t n_tokens, uint64_t *ids_out)
{
	uint32_t n = ref->n_neurons;
	uint64_t *thr = calloc(n, sizeof(*thr)), used = 0;
	uint64_t cap = ref->indptr[ref->n_tokens] + (uint64_t)n * 16;
	uint64_t *indptr;
	uint32_t *indices;
	struct nl_rng rng;
	double t0, dt;

	for (uint64_t i = 0; i < ref->indptr[ref->n_tokens]; i++)
		thr[ref->indices[i]]++;
	for (uint32_t i = 0; i < n; i++)
		thr[i] = (uint64_t)((double)thr[i] / (double)ref->n_tokens * 0x1.0p53);
	nl_rng_seed(&rng, 1, 2, 3);
	t0 = nl_now();
	indptr = malloc((n_tokens + 1) * sizeof(*indptr));
	indices = malloc(cap * sizeof(*indices));
	if (!indptr || !indices)
		nl_die("out of memory");
	indptr[0] = 0;
	for (uint64_t t = 0; t < n_tokens; t++) {
		if (used + n > cap) {
			cap = cap * 3 / 2 + n;
			indices = realloc(indices, cap * sizeof(*indices));
			if (!indices)
				nl_die("out of memory");
		}
		for (uint32_t i = 0; i < n; i++)
			if ((nl_rng_next(&rng) >> 11) < thr[i])
				indices[used++] = i;
		indptr[t + 1] = used;
	}
	dt = nl_now() - t0;
	*ids_out = used;
	free(indptr);
	free(indices);
	free(thr);
	return dt;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "tokens", required_argument, NULL, 't' },
		{ "reps", required_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static const struct { const char *shape; double density; } cases[] = {
		{ "opt-6.7b", 0.03 },
		{ "opt-6.7b", 0.10 },
		{ "llama-2-7b", 0.25 },
	};
	uint64_t n_tokens = 100000, reps = 3;
	int c;

	nl_cli_init("bench-synth");
	while ((c = getopt_long(argc, argv, "t:r:h", longopts, NULL)) != -1) {
		switch (c) {
		case 't': n_tokens = nl_parse_u64(usage, "--tokens", optarg); break;
		case 'r': reps = nl_parse_u64(usage, "--reps", optarg); break;
		case 'h': printf("%s", usage); return 0;
		default: nl_usage_error(usage, "unknown option");
		}
	}
	if (!n_tokens || !reps)
		nl_usage_error(usage, "--tokens and --reps must be positive");
	printf("one layer, %" PRIu64 " tokens, best of %" PRIu64 "\n", n_tokens, reps);
	printf("%-11s %7s %12s %11s %11s %13s %8s\n", "shape", "density", "active ids", "synth s",
	       "dense s", "synth Mids/s", "speedup");
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct nl_synth_params p;
		struct nl_csr csr = { 0 };
		double best = INFINITY, base = INFINITY;
		uint64_t base_ids = 0;

		nl_synth_defaults(&p);
		nl_synth_shape(&p.model, cases[k].shape);
		p.n_tokens = n_tokens;
		p.density = cases[k].density;
		for (uint64_t r = 0; r < reps; r++) {
			double t0 = nl_now(), dt;
			int err;

			nl_csr_free(&csr);
			err = nl_synth_layer(&p, 0, &csr);
			dt = nl_now() - t0;
			if (err)
				nl_die_err(err, NULL);
			if (dt < best)
				best = dt;
		}
		for (uint64_t r = 0; r < reps; r++) {
			double dt = baseline(&csr, n_tokens, &base_ids);

			if (dt < base)
				base = dt;
		}
		printf("%-11s %7.2f %12" PRIu64 " %11.3f %11.3f %13.1f %7.1fx\n", cases[k].shape, cases[k].density,
		       csr.indptr[csr.n_tokens], best, base, (double)csr.indptr[csr.n_tokens] / best / 1e6,
		       base / best);
		nl_csr_free(&csr);
	}
	return 0;
}
