/*
 * Placer benchmark at OPT-6.7B shape (32 layers x 16384 neurons) on synthetic
 * statistics: nl_synth_layer() traces counted by the coact library, then per
 * algorithm the wall time to place every layer with -j threads (layers in
 * parallel, as nl-place does), the objective reached, and ratios against
 * baselines measured in the same run: one sequential pass over the pair
 * triangle (the memory floor of anything that reads every pair) and full
 * greedy. Synthetic data: timings only, never quality claims.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nl_cli.h"
#include "nl_coact.h"
#include "nl_place.h"
#include "nl_profile.h"

static const char usage[] =
	"Usage: bench-place [--layers L] [--shape opt-6.7b|LxN] [--tokens T] [--density D]\n"
	"                   [-k K] [-j THREADS] [--no-full] [--moves N]\n";

enum phase {
	PH_SCAN = 0,        /* baseline: sum the triangle once */
	PH_FREQUENCY,
	PH_SPARSE,          /* greedy-sparse */
	PH_SPARSE_REFINE,   /* greedy-sparse + refine on top-K weights (never reads the triangle) */
	PH_NORM_LISTS,      /* top-K lists ranked by f(i,j)/sqrt(f(i)f(j)), from the triangle */
	PH_SPARSE_NORM,     /* greedy-sparse on those lists */
	PH_SPARSE_NORM_REFINE,
	PH_GREEDY,          /* full greedy, Algorithm 1 */
	PH_GREEDY_REFINE,   /* refine on exact weights after full greedy (local search time only) */
	PH_N,
};

static const char *const phase_name[PH_N] = {
	"triangle scan (baseline)", "frequency", "greedy-sparse (nl-coact --rank count lists)",
	"greedy-sparse+refine (count lists)", "norm top-K lists (nl-coact default ranking)",
	"greedy-sparse (norm lists)", "greedy-sparse+refine (norm lists)",
	"greedy (full)", "refine after greedy (norm candidates)",
};

struct job {
	struct nl_coact_layer *stats;
	struct nl_coact_layer *norm;  /* lists of PH_NORM_LISTS (shares count and pairs) */
	enum phase phase;
	uint32_t k;
	uint64_t moves;
	uint32_t *greedy_perm;   /* in: for PH_GREEDY_REFINE; out of PH_GREEDY */
	uint64_t weight;
	uint64_t sink;
	double seconds;
	struct nl_place_stats st;
	int err;
	char msg[512];
};

static void *run_job(void *arg)
{
	struct job *j = arg;
	struct nl_coact_layer *s = j->stats;
	struct nl_placement_layer pl;
	struct nl_place_opts opts;
	double t0 = nl_now();

	nl_place_opts_default(&opts);
	opts.k = j->k;
	opts.move_budget = j->moves;
	memset(&pl, 0, sizeof(pl));
	switch (j->phase) {
	case PH_SCAN: {
		uint64_t sum = 0;

		for (uint64_t x = 0, m = nl_tri_size(s->n_neurons); x < m; x++)
			sum += s->pairs[x];
		j->sink = sum;
		break;
	}
	case PH_NORM_LISTS:
		*j->norm = *s;
		j->norm->topk_ids = NULL;
		j->norm->topk_counts = NULL;
		j->norm->k = 0;
		j->err = nl_coact_topk_ranked(j->norm, j->k, NL_COACT_RANK_NORM, 1);
		break;
	case PH_FREQUENCY:
	case PH_SPARSE:
	case PH_SPARSE_REFINE:
	case PH_SPARSE_NORM:
	case PH_SPARSE_NORM_REFINE: {
		struct nl_coact_layer sparse = j->phase >= PH_SPARSE_NORM ? *j->norm : *s;

		sparse.pairs = NULL;  /* these never touch the triangle */
		opts.algo = j->phase == PH_FREQUENCY ? NL_PLACE_FREQUENCY :
			j->phase == PH_SPARSE || j->phase == PH_SPARSE_NORM ?
			NL_PLACE_GREEDY_SPARSE : NL_PLACE_REFINE;
		opts.sparse = true;
		j->err = nl_place_layer(&sparse, &opts, &pl, &j->st);
		break;
	}
	case PH_GREEDY:
		j->err = nl_place_greedy(s, 0, j->greedy_perm, &j->st);
		break;
	case PH_GREEDY_REFINE:
		j->err = nl_place_refine(s, &opts, j->greedy_perm, &j->st);
		break;
	default:
		break;
	}
	j->seconds = nl_now() - t0;
	if (j->err) {
		snprintf(j->msg, sizeof(j->msg), "%s", nl_diag_msg());
		return NULL;
	}
	/* exact objective of what was produced */
	if (j->phase != PH_SCAN && j->phase != PH_NORM_LISTS) {
		const uint32_t *perm = pl.perm ? pl.perm : j->greedy_perm;
		uint64_t w = 0;

		for (uint32_t p = 0; p + 1 < s->n_neurons; p++) {
			uint32_t a = perm[p], b = perm[p + 1];

			w += s->pairs[a < b ? nl_tri_index(s->n_neurons, a, b) : nl_tri_index(s->n_neurons, b, a)];
		}
		j->weight = w;
	}
	nl_placement_layer_free(&pl);
	return NULL;
}

int main(int argc, char **argv)
{
	enum { OPT_LAYERS = 256, OPT_SHAPE, OPT_TOKENS, OPT_DENSITY, OPT_NOFULL, OPT_MOVES };
	static const struct option longopts[] = {
		{ "layers", required_argument, NULL, OPT_LAYERS },
		{ "shape", required_argument, NULL, OPT_SHAPE },
		{ "tokens", required_argument, NULL, OPT_TOKENS },
		{ "density", required_argument, NULL, OPT_DENSITY },
		{ "topk", required_argument, NULL, 'k' },
		{ "threads", required_argument, NULL, 'j' },
		{ "no-full", no_argument, NULL, OPT_NOFULL },
		{ "moves", required_argument, NULL, OPT_MOVES },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct nl_synth_params sp;
	struct nl_coact_opts co;
	const char *shape = "opt-6.7b";
	uint32_t layers = 0, k = 16, threads = 2;
	uint64_t moves = 0;
	bool full = true;
	double wall[PH_N] = { 0 }, cpu[PH_N] = { 0 }, stats_s = 0;
	uint64_t weight[PH_N] = { 0 }, moves_done = 0, bands = 0, tokens_total = 0;
	double density_sum = 0;
	int opt, err;

	nl_cli_init("bench-place");
	nl_synth_defaults(&sp);
	sp.n_tokens = 100000;
	while ((opt = getopt_long(argc, argv, "k:j:h", longopts, NULL)) != -1) {
		switch (opt) {
		case OPT_LAYERS:
			layers = (uint32_t)nl_parse_u64(usage, "--layers", optarg);
			break;
		case OPT_SHAPE:
			shape = optarg;
			break;
		case OPT_TOKENS:
			sp.n_tokens = nl_parse_u64(usage, "--tokens", optarg);
			break;
		case OPT_DENSITY:
			sp.density = nl_parse_double(usage, "--density", optarg);
			break;
		case 'k':
			k = (uint32_t)nl_parse_u64(usage, "--topk", optarg);
			break;
		case 'j':
			threads = (uint32_t)nl_parse_u64(usage, "--threads", optarg);
			break;
		case OPT_NOFULL:
			full = false;
			break;
		case OPT_MOVES:
			moves = nl_parse_u64(usage, "--moves", optarg);
			break;
		case 'h':
			printf("%s", usage);
			return 0;
		default:
			nl_usage_error(usage, "unknown option");
		}
	}
	if (threads < 1 || threads > 64 || k < 1)
		nl_usage_error(usage, "need 1 <= -j <= 64 and -k >= 1");
	err = nl_synth_shape(&sp.model, shape);
	if (err)
		nl_die_err(err, "--shape");
	if (layers == 0 || layers > sp.model.n_layers)
		layers = sp.model.n_layers;
	nl_coact_opts_default(&co);
	co.n_threads = threads;
	co.k = k;
	co.keep_pairs = true;
	co.rank = NL_COACT_RANK_COUNT;   /* nl-coact --rank count; the norm lists are PH_NORM_LISTS */

	printf("placer benchmark: %u of %u layers x %u neurons (synthetic %s, %" PRIu64
	       " tokens, density %.3f, zipf %g, group %u, coherence %g, noise %g), k=%u, %u threads, "
	       "refine moves %s\n", layers, sp.model.n_layers, sp.model.n_neurons, shape, sp.n_tokens,
	       sp.density, sp.zipf_s, sp.group_size, sp.coherence, sp.noise, k, threads,
	       moves ? "bounded" : "to local optimum");
	for (uint32_t l0 = 0; l0 < layers; l0 += threads) {
		uint32_t batch = layers - l0 < threads ? layers - l0 : threads;
		struct nl_coact_layer stats[64], norm[64];
		uint32_t *gperm[64];
		double t0 = nl_now();

		for (uint32_t b = 0; b < batch; b++) {
			struct nl_csr csr;

			memset(&csr, 0, sizeof(csr));
			err = nl_synth_layer(&sp, l0 + b, &csr);
			if (err)
				nl_die_err(err, "synthetic layer");
			for (uint64_t t = 0; t < csr.n_tokens; t++)
				density_sum += (double)(csr.indptr[t + 1] - csr.indptr[t]) / csr.n_neurons;
			tokens_total += csr.n_tokens;
			err = nl_coact_count_layer(&csr, &co, &stats[b], NULL);
			nl_csr_free(&csr);
			if (err)
				nl_die_err(err, "counting");
			gperm[b] = malloc((size_t)stats[b].n_neurons * sizeof(uint32_t));
			if (!gperm[b])
				nl_die("out of memory");
		}
		stats_s += nl_now() - t0;
		for (int ph = 0; ph < PH_N; ph++) {
			struct job jobs[64];
			pthread_t tid[64];

			if (!full && (ph == PH_GREEDY || ph == PH_GREEDY_REFINE))
				continue;
			t0 = nl_now();
			for (uint32_t b = 0; b < batch; b++) {
				memset(&jobs[b], 0, sizeof(jobs[b]));
				jobs[b].stats = &stats[b];
				jobs[b].norm = &norm[b];
				jobs[b].phase = (enum phase)ph;
				jobs[b].k = k;
				jobs[b].moves = moves;
				jobs[b].greedy_perm = gperm[b];
				if (pthread_create(&tid[b], NULL, run_job, &jobs[b]))
					nl_die("cannot start a thread");
			}
			for (uint32_t b = 0; b < batch; b++)
				pthread_join(tid[b], NULL);
			wall[ph] += nl_now() - t0;
			for (uint32_t b = 0; b < batch; b++) {
				if (jobs[b].err)
					nl_die("layer %u, %s: %s", l0 + b, phase_name[ph], jobs[b].msg);
				cpu[ph] += jobs[b].seconds;
				weight[ph] += jobs[b].weight;
				if (ph == PH_GREEDY)
					bands += jobs[b].st.bands;
				if (ph == PH_SPARSE_REFINE)
					moves_done += jobs[b].st.moves_2opt + jobs[b].st.moves_oropt;
			}
		}
		for (uint32_t b = 0; b < batch; b++) {
			free(norm[b].topk_ids);
			free(norm[b].topk_counts);
			nl_coact_layer_free(&stats[b]);
			free(gperm[b]);
		}
		fprintf(stderr, "bench-place: %u/%u layers done\n", l0 + batch, layers);
	}
	printf("statistics (synth + count, not placement): %.1f s; achieved density %.4f\n",
	       stats_s, density_sum / (double)tokens_total);
	printf("\n| phase | wall s (%u layers) | projected wall s (%u layers) | cpu s/layer | "
	       "x triangle scan | objective (pairs/token, sum over layers) |\n", layers,
	       sp.model.n_layers);
	printf("|---|---:|---:|---:|---:|---:|\n");
	for (int ph = 0; ph < PH_N; ph++) {
		double proj = wall[ph] * (double)sp.model.n_layers / (double)layers;

		if (!full && (ph == PH_GREEDY || ph == PH_GREEDY_REFINE))
			continue;
		printf("| %s | %.2f | %.1f | %.3f | %.1f | ", phase_name[ph], wall[ph], proj,
		       cpu[ph] / layers, wall[PH_SCAN] > 0 ? wall[ph] / wall[PH_SCAN] : 0);
		if (ph == PH_SCAN || ph == PH_NORM_LISTS)
			printf("- |\n");
		else
			printf("%.2f |\n", (double)weight[ph] / (double)sp.n_tokens);
	}
	printf("\ngreedy-sparse + refine, whole model (projected): %.1f s with count lists, "
	       "%.1f s with norm lists (nl-coact's default; ranking them from the triangle: "
	       "%.1f s, done by nl-coact count) (target < 60 s)\n",
	       wall[PH_SPARSE_REFINE] * sp.model.n_layers / layers,
	       wall[PH_SPARSE_NORM_REFINE] * sp.model.n_layers / layers,
	       wall[PH_NORM_LISTS] * sp.model.n_layers / layers);
	if (full) {
		printf("full greedy, whole model (projected): %.1f s (target < 300 s; paper 104 s on 64 cores)\n",
		       wall[PH_GREEDY] * sp.model.n_layers / layers);
		printf("full greedy: %.1f sort bands per layer; of greedy's objective: greedy-sparse "
		       "%.1f%% (count lists), %.1f%% (norm lists); greedy-sparse+refine "
		       "%.1f%% (count lists), %.1f%% (norm lists); greedy+refine %.2f%%\n",
		       (double)bands / layers,
		       100.0 * (double)weight[PH_SPARSE] / (double)weight[PH_GREEDY],
		       100.0 * (double)weight[PH_SPARSE_NORM] / (double)weight[PH_GREEDY],
		       100.0 * (double)weight[PH_SPARSE_REFINE] / (double)weight[PH_GREEDY],
		       100.0 * (double)weight[PH_SPARSE_NORM_REFINE] / (double)weight[PH_GREEDY],
		       100.0 * (double)weight[PH_GREEDY_REFINE] / (double)weight[PH_GREEDY]);
	}
	printf("refine moves per layer (sparse): %.0f\n", (double)moves_done / layers);
	return 0;
}
