/*
 * nl-place: computes neuron placements from co-activation statistics
 * (`nl-place [run]`) and judges placements on held-out traces
 * (`nl-place eval`). All the work is in the placer library (nl_place.h).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nl_cli.h"
#include "nl_formats.h"
#include "nl_coact.h"
#include "nl_place.h"

static const char run_usage[] =
	"Usage: nl-place [run] [OPTIONS] COACT.h5 -o PLACEMENT.h5\n"
	"       nl-place eval --placement A.h5 [--placement B.h5 ...] --traces HELDOUT.h5\n";

static void run_help(void)
{
	printf("%s", run_usage);
	printf("\n"
	       "Orders the FFN neurons of every layer so that co-activated neurons are\n"
	       "adjacent (Neuralink sections 4.2-4.3) and writes a placement file.\n"
	       "\n"
	       "Options of run:\n"
	       "  -a, --algo LIST        comma-separated: identity, frequency, greedy,\n"
	       "                         greedy-sparse, refine (default greedy). With several\n"
	       "                         algorithms, -o must contain {algo}, e.g. out/{algo}.h5\n"
	       "  -o, --output PATH      placement file to write\n"
	       "  -k, --topk K           candidate neighbours per neuron for greedy-sparse and\n"
	       "                         refine (default: all the file's lists carry; %d when\n"
	       "                         computed from the pair triangle, as refine does)\n"
	       "      --rank count|norm  candidate lists ranked by f(i,j) or f(i,j)/sqrt(f(i)f(j));\n"
	       "                         default: the file's lists as nl-coact ranked them\n"
	       "                         (norm since coact format 1.1). Given, and the file's\n"
	       "                         lists are ranked otherwise (or shorter than -k), they\n"
	       "                         are recomputed from the pair triangle. refine with the\n"
	       "                         triangle always uses norm candidates\n"
	       "      --sparse           never read the pair triangle: refine starts from\n"
	       "                         greedy-sparse and weighs moves with the top-K lists\n"
	       "      --moves N          refine: at most N improving moves per layer\n"
	       "                         (default 0: run to a local optimum; deterministic)\n"
	       "      --time-limit S     refine: stop a layer after S seconds (default 0: none);\n"
	       "                         a safety bound: when it hits, output depends on timing\n"
	       "  -j, --threads N        layers placed in parallel (default: online CPUs)\n"
	       "      --layers A-B       only layers A..B (inclusive)\n"
	       "      --compress SPEC    zstd[:L], deflate[:L] or none (default deflate)\n"
	       "  -f, --force            overwrite existing outputs\n"
	       "  -q, --quiet            no progress line\n"
	       "      --json             summary as JSON on stdout\n"
	       "  -h, --help             this help\n"
	       "  -V, --version          version\n"
	       "\n"
	       "Options of eval (nl-place eval --help for details):\n"
	       "  -p, --placement PATH   a placement to judge (repeat to compare several)\n"
	       "  -t, --traces PATH      held-out traces (nl-profile output)\n"
	       "\n"
	       "Exit status: 0 ok, 1 failure, 2 usage error.\n", NL_PLACE_DEFAULT_K);
}

/* ---- run ---- */

struct layer_result {
	bool done;
	struct nl_placement_layer pl[NL_PLACE_N_ALGOS];
	struct nl_place_stats st[NL_PLACE_N_ALGOS];
};

struct run_ctx {
	/* options */
	enum nl_place_algo algos[NL_PLACE_N_ALGOS];
	unsigned n_algos;
	struct nl_place_opts base;
	bool use_pairs;
	bool rank_given;       /* --rank */
	enum nl_coact_rank rank;
	bool rebuild;          /* recompute the lists from the triangle with `rank` */
	/* shared state, under lock */
	pthread_mutex_t lock;
	struct nl_coact_reader *reader;
	const char *input;
	struct nl_placement_writer *writers[NL_PLACE_N_ALGOS];
	uint32_t first, count;
	uint32_t next_take, next_write, n_done;
	struct layer_result *results;
	/* summary per algorithm and layer, kept for --json */
	struct nl_place_stats *summary;   /* [count * n_algos] */
	double *objective;                /* [count * n_algos] */
	struct nl_progress progress;
	int err;
	char errmsg[1024];
};

static void record_error(struct run_ctx *c, int err, const char *what)
{
	if (c->err)
		return;
	c->err = err;
	snprintf(c->errmsg, sizeof(c->errmsg), "%s: %s", what,
		 nl_diag_msg()[0] ? nl_diag_msg() : nl_strerror(err));
}

/* Writes finished layers in layer order (under lock), so output never depends on -j. */
static void flush_in_order(struct run_ctx *c)
{
	while (!c->err && c->next_write < c->count && c->results[c->next_write].done) {
		struct layer_result *res = &c->results[c->next_write];
		uint32_t layer = c->first + c->next_write;

		for (unsigned a = 0; a < c->n_algos; a++) {
			int err = nl_placement_write_layer(c->writers[a], layer, &res->pl[a]);

			if (err) {
				char what[64];

				snprintf(what, sizeof(what), "layer %" PRIu32, layer);
				record_error(c, err, what);
			}
			nl_placement_layer_free(&res->pl[a]);
		}
		c->next_write++;
	}
}

static void *run_worker(void *arg)
{
	struct run_ctx *c = arg;

	for (;;) {
		struct nl_coact_layer stats;
		struct layer_result *res;
		uint32_t idx, layer;
		char what[64];
		int err;

		pthread_mutex_lock(&c->lock);
		if (c->err || c->next_take >= c->count) {
			pthread_mutex_unlock(&c->lock);
			break;
		}
		idx = c->next_take++;
		layer = c->first + idx;
		snprintf(what, sizeof(what), "'%s' layer %" PRIu32, c->input, layer);
		memset(&stats, 0, sizeof(stats));
		/* the HDF5 library is the serial build: one reader call at a time */
		err = nl_coact_read_layer(c->reader, layer, c->use_pairs, &stats);
		if (err) {
			record_error(c, err, what);
			pthread_mutex_unlock(&c->lock);
			break;
		}
		pthread_mutex_unlock(&c->lock);

		res = &c->results[idx];
		if (c->rebuild) {
			stats.rank = c->rank;
			err = nl_place_topk_from_pairs(&stats, c->base.k ? c->base.k :
						       (stats.k ? stats.k : NL_PLACE_DEFAULT_K));
		}
		for (unsigned a = 0; a < c->n_algos && !err; a++) {
			struct nl_place_opts opts = c->base;

			opts.algo = c->algos[a];
			/* refine starts from the greedy placement computed just before */
			for (unsigned b = 0; b < a && opts.algo == NL_PLACE_REFINE; b++) {
				enum nl_place_algo start = stats.pairs && !opts.sparse ?
					NL_PLACE_GREEDY : NL_PLACE_GREEDY_SPARSE;

				if (c->algos[b] == start)
					opts.start = res->pl[b].perm;
			}
			err = nl_place_layer(&stats, &opts, &res->pl[a], &res->st[a]);
		}
		nl_coact_layer_free(&stats);

		pthread_mutex_lock(&c->lock);
		if (err) {
			record_error(c, err, what);
		} else {
			for (unsigned a = 0; a < c->n_algos; a++) {
				c->summary[(uint64_t)idx * c->n_algos + a] = res->st[a];
				c->objective[(uint64_t)idx * c->n_algos + a] = res->pl[a].objective;
			}
			res->done = true;
			c->n_done++;
			nl_progress_update(&c->progress, c->n_done);
			flush_in_order(c);
		}
		pthread_mutex_unlock(&c->lock);
		if (err)
			break;
	}
	return NULL;
}

/* Replaces {algo} in pattern. */
static void output_path(char *buf, size_t size, const char *pattern, const char *algo)
{
	const char *at = strstr(pattern, "{algo}");

	if (!at) {
		snprintf(buf, size, "%s", pattern);
		return;
	}
	snprintf(buf, size, "%.*s%s%s", (int)(at - pattern), pattern, algo, at + 6);
}

static void parse_algos(struct run_ctx *c, const char *list)
{
	char *copy = strdup(list), *save = NULL;

	if (!copy)
		nl_die("out of memory");
	c->n_algos = 0;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		enum nl_place_algo algo;

		if (nl_place_algo_parse(&algo, tok))
			nl_usage_error(run_usage, "%s", nl_diag_msg());
		for (unsigned a = 0; a < c->n_algos; a++)
			if (c->algos[a] == algo)
				nl_usage_error(run_usage, "algorithm '%s' given twice", tok);
		c->algos[c->n_algos++] = algo;
	}
	free(copy);
	if (c->n_algos == 0)
		nl_usage_error(run_usage, "--algo needs at least one algorithm");
	/* canonical order, so that refine comes after the greedy it can reuse */
	for (unsigned a = 1; a < c->n_algos; a++)
		for (unsigned b = a; b > 0 && c->algos[b] < c->algos[b - 1]; b--) {
			enum nl_place_algo t = c->algos[b];

			c->algos[b] = c->algos[b - 1];
			c->algos[b - 1] = t;
		}
}

static int cmd_run(int argc, char **argv)
{
	enum { OPT_SPARSE = 256, OPT_MOVES, OPT_TIME, OPT_LAYERS, OPT_COMPRESS, OPT_JSON, OPT_RANK };
	static const struct option longopts[] = {
		{ "algo", required_argument, NULL, 'a' },
		{ "output", required_argument, NULL, 'o' },
		{ "topk", required_argument, NULL, 'k' },
		{ "sparse", no_argument, NULL, OPT_SPARSE },
		{ "rank", required_argument, NULL, OPT_RANK },
		{ "moves", required_argument, NULL, OPT_MOVES },
		{ "time-limit", required_argument, NULL, OPT_TIME },
		{ "threads", required_argument, NULL, 'j' },
		{ "layers", required_argument, NULL, OPT_LAYERS },
		{ "compress", required_argument, NULL, OPT_COMPRESS },
		{ "force", no_argument, NULL, 'f' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct run_ctx c;
	struct nl_h5_opts h5 = { .compress = NL_COMPRESS_DEFLATE, .level = 0 };
	const struct nl_coact_meta *meta;
	const char *output = NULL, *algo_list = "greedy";
	char paths[NL_PLACE_N_ALGOS][4096];
	uint32_t lfirst = 0, lcount = 0;
	bool have_layers = false, force = false, quiet = false, json = false;
	long threads = nl_online_cpus();
	pthread_t *tids = NULL;
	double t0 = nl_now();
	int opt, err;

	memset(&c, 0, sizeof(c));
	nl_place_opts_default(&c.base);
	while ((opt = getopt_long(argc, argv, "a:o:k:j:fqhV", longopts, NULL)) != -1) {
		switch (opt) {
		case 'a':
			algo_list = optarg;
			break;
		case 'o':
			output = optarg;
			break;
		case 'k':
			c.base.k = (uint32_t)nl_parse_u64_in(run_usage, "--topk", optarg, 1, 4096);
			break;
		case OPT_SPARSE:
			c.base.sparse = true;
			break;
		case OPT_RANK:
			if (nl_coact_rank_parse(&c.rank, optarg))
				nl_usage_error(run_usage, "--rank %s: expected count or norm", optarg);
			c.rank_given = true;
			break;
		case OPT_MOVES:
			c.base.move_budget = nl_parse_u64(run_usage, "--moves", optarg);
			break;
		case OPT_TIME:
			c.base.time_limit = nl_parse_double(run_usage, "--time-limit", optarg);
			if (c.base.time_limit < 0)
				nl_usage_error(run_usage, "--time-limit %s: expected seconds >= 0", optarg);
			break;
		case 'j':
			threads = (long)nl_parse_u64_in(run_usage, "--threads", optarg, 1, 256);
			break;
		case OPT_LAYERS:
			nl_parse_range(run_usage, "--layers", optarg, &lfirst, &lcount);
			have_layers = true;
			break;
		case OPT_COMPRESS:
			if (nl_h5_opts_parse(&h5, optarg))
				nl_usage_error(run_usage, "--compress %s: %s", optarg, nl_diag_msg());
			break;
		case 'f':
			force = true;
			break;
		case 'q':
			quiet = true;
			break;
		case OPT_JSON:
			json = true;
			break;
		case 'h':
			run_help();
			return 0;
		case 'V':
			nl_print_version();
			return 0;
		default:
			nl_usage_error(run_usage, "unknown or incomplete option");
		}
	}
	if (optind >= argc)
		nl_usage_error(run_usage, "missing the co-activation statistics file (nl-coact output)");
	if (optind + 1 < argc)
		nl_usage_error(run_usage, "unexpected argument '%s'", argv[optind + 1]);
	if (!output)
		nl_usage_error(run_usage, "missing -o/--output");
	parse_algos(&c, algo_list);
	if (c.n_algos > 1 && !strstr(output, "{algo}"))
		nl_usage_error(run_usage, "several algorithms need {algo} in -o, e.g. -o out/{algo}.h5");
	for (unsigned a = 0; a < c.n_algos; a++) {
		if (c.algos[a] == NL_PLACE_GREEDY && c.base.sparse)
			nl_usage_error(run_usage, "greedy reads every pair; it cannot run with --sparse");
		output_path(paths[a], sizeof(paths[a]), output, nl_place_algo_name(c.algos[a]));
		for (unsigned b = 0; b < a; b++)
			if (strcmp(paths[a], paths[b]) == 0)
				nl_usage_error(run_usage, "two algorithms would write '%s'", paths[a]);
		nl_check_output(paths[a], force);
	}
	c.input = argv[optind];
	err = nl_coact_open(&c.reader, c.input);
	if (err)
		nl_die_err(err, NULL);
	meta = nl_coact_get_meta(c.reader);
	c.first = meta->layer_first;
	c.count = meta->layer_count;
	if (have_layers) {
		if (lfirst < meta->layer_first || lfirst + lcount > meta->layer_first + meta->layer_count)
			nl_die("--layers %" PRIu32 "-%" PRIu32 ": '%s' holds layers %" PRIu32 "-%" PRIu32
			       "; choose a range inside it", lfirst, lfirst + lcount - 1, c.input,
			       meta->layer_first, meta->layer_first + meta->layer_count - 1);
		c.first = lfirst;
		c.count = lcount;
	}
	/* what to read: the triangle only when an algorithm needs it */
	for (unsigned a = 0; a < c.n_algos; a++) {
		enum nl_place_algo algo = c.algos[a];

		if (algo == NL_PLACE_GREEDY && !meta->has_pairs)
			nl_die("'%s' has no pair triangle, which greedy needs; re-run nl-coact with "
			       "pairs, or use greedy-sparse", c.input);
		if (algo == NL_PLACE_GREEDY ||
		    (algo == NL_PLACE_REFINE && !c.base.sparse && meta->has_pairs))
			c.use_pairs = true;
		if ((algo == NL_PLACE_GREEDY_SPARSE || algo == NL_PLACE_REFINE) && meta->k == 0) {
			if (!meta->has_pairs)
				nl_die("'%s' has neither top-K lists nor the pair triangle, which %s needs; "
				       "re-run nl-coact with --topk", c.input, nl_place_algo_name(algo));
			if (c.base.sparse)
				nl_die("'%s' has no top-K lists, so --sparse cannot avoid the pair "
				       "triangle; re-run nl-coact with --topk", c.input);
			c.use_pairs = true;
		}
	}
	/* --rank: the file's lists are used as they are when they already fit */
	c.rebuild = c.rank_given && (meta->k == 0 || meta->rank != c.rank || c.base.k > meta->k);
	if (c.rebuild) {
		if (!meta->has_pairs || c.base.sparse)
			nl_die("--rank %s: the top-K lists of '%s' are ranked by %s (k = %u), so they "
			       "must be recomputed from the pair triangle, which %s; re-run nl-coact "
			       "count --rank %s", nl_coact_rank_name(c.rank), c.input,
			       nl_coact_rank_name(meta->rank), meta->k,
			       c.base.sparse ? "--sparse forbids" : "the file does not have",
			       nl_coact_rank_name(c.rank));
		c.use_pairs = true;
	}
	if (c.base.time_limit > 0)
		nl_warn("--time-limit %g: a layer that hits it gives a result that depends on timing; "
			"use --moves for a reproducible bound", c.base.time_limit);
	for (unsigned a = 0; a < c.n_algos; a++) {
		struct nl_placement_meta pm;

		memset(&pm, 0, sizeof(pm));
		pm.model = meta->model;
		snprintf(pm.dataset, sizeof(pm.dataset), "%s", meta->dataset);
		pm.layer_first = c.first;
		pm.layer_count = c.count;
		err = nl_placement_create(&c.writers[a], paths[a], &pm, &h5);
		if (err) {
			for (unsigned b = 0; b < a; b++)
				nl_placement_abort(c.writers[b]);
			nl_die_err(err, NULL);
		}
	}
	c.results = calloc(c.count, sizeof(*c.results));
	c.summary = calloc((size_t)c.count * c.n_algos, sizeof(*c.summary));
	c.objective = calloc((size_t)c.count * c.n_algos, sizeof(*c.objective));
	if ((long)c.count < threads)
		threads = c.count ? c.count : 1;
	tids = calloc((size_t)threads, sizeof(*tids));
	if (!c.results || !c.summary || !c.objective || !tids)
		nl_die("out of memory");
	pthread_mutex_init(&c.lock, NULL);
	nl_progress_init(&c.progress, "nl-place", c.count, "layers", quiet);
	for (long t = 0; t < threads; t++) {
		if (pthread_create(&tids[t], NULL, run_worker, &c)) {
			pthread_mutex_lock(&c.lock);
			record_error(&c, -EAGAIN, "starting threads");
			pthread_mutex_unlock(&c.lock);
			threads = t;
			break;
		}
	}
	for (long t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
	if (!c.err)
		nl_progress_done(&c.progress, c.n_done);
	for (unsigned a = 0; a < c.n_algos; a++) {
		if (c.err) {
			nl_placement_abort(c.writers[a]);
			continue;
		}
		err = nl_placement_finish(c.writers[a]);
		if (err)
			record_error(&c, err, paths[a]);
	}
	for (uint32_t l = 0; l < c.count; l++)
		for (unsigned a = 0; a < c.n_algos; a++)
			nl_placement_layer_free(&c.results[l].pl[a]);
	nl_coact_close(c.reader);
	if (c.err) {
		fprintf(stderr, "nl-place: error: %s\n", c.errmsg);
		return 1;
	}
	if (json) {
		struct nl_json j;

		nl_json_init(&j, stdout);
		nl_json_obj_begin(&j, NULL);
		nl_json_str(&j, "input", c.input);
		nl_json_u64(&j, "layer_first", c.first);
		nl_json_u64(&j, "layer_count", c.count);
		nl_json_double(&j, "seconds", nl_now() - t0);
		nl_json_arr_begin(&j, "placements");
		for (unsigned a = 0; a < c.n_algos; a++) {
			double total_obj = 0, total_s = 0;

			nl_json_obj_begin(&j, NULL);
			nl_json_str(&j, "algo", nl_place_algo_name(c.algos[a]));
			nl_json_str(&j, "output", paths[a]);
			nl_json_arr_begin(&j, "layers");
			for (uint32_t l = 0; l < c.count; l++) {
				const struct nl_place_stats *s = &c.summary[(uint64_t)l * c.n_algos + a];

				total_obj += c.objective[(uint64_t)l * c.n_algos + a];
				total_s += s->seconds;
				nl_json_obj_begin(&j, NULL);
				nl_json_u64(&j, "layer", c.first + l);
				nl_json_double(&j, "objective", c.objective[(uint64_t)l * c.n_algos + a]);
				nl_json_bool(&j, "objective_exact", s->weight_exact);
				nl_json_double(&j, "seconds", s->seconds);
				nl_json_u64(&j, "candidate_edges", s->candidate_edges);
				nl_json_u64(&j, "bands", s->bands);
				nl_json_u64(&j, "links", s->links);
				nl_json_u64(&j, "joins", s->joins);
				nl_json_u64(&j, "moves_2opt", s->moves_2opt);
				nl_json_u64(&j, "moves_oropt", s->moves_oropt);
				nl_json_u64(&j, "weight_before_refine", s->weight_before);
				nl_json_u64(&j, "weight", s->weight);
				nl_json_bool(&j, "time_limit_hit", s->time_limit_hit);
				nl_json_bool(&j, "move_budget_hit", s->move_budget_hit);
				nl_json_obj_end(&j);
			}
			nl_json_arr_end(&j);
			nl_json_double(&j, "objective_sum", total_obj);
			nl_json_double(&j, "cpu_seconds", total_s);
			nl_json_obj_end(&j);
		}
		nl_json_arr_end(&j);
		nl_json_obj_end(&j);
		nl_json_end(&j);
	}
	for (unsigned a = 0; a < c.n_algos && !quiet; a++) {
		double total_obj = 0;
		unsigned hits = 0;

		for (uint32_t l = 0; l < c.count; l++) {
			total_obj += c.objective[(uint64_t)l * c.n_algos + a];
			hits += c.summary[(uint64_t)l * c.n_algos + a].time_limit_hit;
		}
		fprintf(stderr, "nl-place: %s -> '%s': %" PRIu32 " layers, objective %.4f adjacent "
			"co-active pairs per token (sum over layers)%s\n", nl_place_algo_name(c.algos[a]),
			paths[a], c.count, total_obj, hits ? "; time limit hit" : "");
	}
	pthread_mutex_destroy(&c.lock);
	free(tids);
	free(c.results);
	free(c.summary);
	free(c.objective);
	return 0;
}

/* ---- eval ---- */

static const char eval_usage[] =
	"Usage: nl-place eval --placement A.h5 [--placement B.h5 ...] --traces HELDOUT.h5\n"
	"                     [--layers A-B] [--per-layer] [--json] [-q]\n";

static void eval_help(void)
{
	printf("%s", eval_usage);
	printf("\n"
	       "Judges placements on traces (use traces the statistics were NOT computed\n"
	       "from): per placement, reads per token (contiguous runs of active neurons in\n"
	       "placement order, summed over layers), mean and max run length, the run\n"
	       "length distribution, the effect of collapsing gaps of up to g = 0..%d\n"
	       "neurons (reads and extra neurons read per token, paper section 5.1), and\n"
	       "the objective (adjacent co-active pairs per token) on these traces.\n"
	       "\n"
	       "  -p, --placement PATH   placement file (repeat; compared side by side)\n"
	       "  -t, --traces PATH      trace file (nl-profile output)\n"
	       "      --layers A-B       only layers A..B\n"
	       "      --per-layer        also print reads per token per layer\n"
	       "      --json             results as JSON on stdout instead of the table\n"
	       "  -q, --quiet            no progress line\n"
	       "  -h, --help             this help\n"
	       "  -V, --version          version\n", NL_PLACE_GAP_MAX);
}

#define MAX_PLACEMENTS 16

struct eval_input {
	const char *path;
	struct nl_placement_reader *reader;
	char algo[32];
	double profile_objective;
	struct nl_place_eval total;
	struct nl_place_eval *per_layer;
};

static void print_row_u(const char *name, struct eval_input *in, unsigned np,
			double (*f)(const struct eval_input *, const void *), const void *arg)
{
	printf("%-28s", name);
	for (unsigned p = 0; p < np; p++)
		printf(" %14.4f", f(&in[p], arg));
	printf("\n");
}

static double m_reads(const struct eval_input *e, const void *arg)
{
	(void)arg;
	return e->total.n_tokens ? (double)e->total.runs / (double)e->total.n_tokens : 0;
}

static double m_active(const struct eval_input *e, const void *arg)
{
	(void)arg;
	return e->total.n_tokens ? (double)e->total.active / (double)e->total.n_tokens : 0;
}

static double m_mean_run(const struct eval_input *e, const void *arg)
{
	(void)arg;
	return e->total.runs ? (double)e->total.active / (double)e->total.runs : 0;
}

static double m_max_run(const struct eval_input *e, const void *arg)
{
	(void)arg;
	return (double)e->total.max_run;
}

static double m_objective(const struct eval_input *e, const void *arg)
{
	(void)arg;
	return e->total.n_tokens ?
		(double)(e->total.active - e->total.runs) / (double)e->total.n_tokens : 0;
}

static double m_profile_obj(const struct eval_input *e, const void *arg)
{
	(void)arg;
	return e->profile_objective;
}

static double m_hist(const struct eval_input *e, const void *arg)
{
	unsigned b = *(const unsigned *)arg;

	return e->total.runs ? 100.0 * (double)e->total.run_hist[b] / (double)e->total.runs : 0;
}

static double m_collapse_reads(const struct eval_input *e, const void *arg)
{
	unsigned g = *(const unsigned *)arg;

	return e->total.n_tokens ?
		(double)e->total.reads_collapsed[g] / (double)e->total.n_tokens : 0;
}

static double m_collapse_extra(const struct eval_input *e, const void *arg)
{
	unsigned g = *(const unsigned *)arg;

	return e->total.n_tokens ?
		(double)e->total.extra_collapsed[g] / (double)e->total.n_tokens : 0;
}

static void json_eval(struct nl_json *j, const char *key, const struct nl_place_eval *e)
{
	double tok = e->n_tokens ? (double)e->n_tokens : 1;

	nl_json_obj_begin(j, key);
	nl_json_u64(j, "tokens", e->n_tokens);
	nl_json_double(j, "active_per_token", (double)e->active / tok);
	nl_json_double(j, "reads_per_token", (double)e->runs / tok);
	nl_json_double(j, "mean_run", e->runs ? (double)e->active / (double)e->runs : 0);
	nl_json_u64(j, "max_run", e->max_run);
	nl_json_double(j, "objective", (double)(e->active - e->runs) / tok);
	nl_json_arr_begin(j, "run_hist");
	for (unsigned b = 0; b < NL_PLACE_RUN_BUCKETS; b++) {
		nl_json_obj_begin(j, NULL);
		nl_json_u64(j, "min_len", nl_place_run_bucket_lo(b));
		nl_json_u64(j, "runs", e->run_hist[b]);
		nl_json_obj_end(j);
	}
	nl_json_arr_end(j);
	nl_json_arr_begin(j, "collapse");
	for (unsigned g = 0; g <= NL_PLACE_GAP_MAX; g++) {
		nl_json_obj_begin(j, NULL);
		nl_json_u64(j, "gap", g);
		nl_json_double(j, "reads_per_token", (double)e->reads_collapsed[g] / tok);
		nl_json_double(j, "extra_neurons_per_token", (double)e->extra_collapsed[g] / tok);
		nl_json_obj_end(j);
	}
	nl_json_arr_end(j);
	nl_json_obj_end(j);
}

static int cmd_eval(int argc, char **argv)
{
	enum { OPT_LAYERS = 256, OPT_JSON, OPT_PER_LAYER };
	static const struct option longopts[] = {
		{ "placement", required_argument, NULL, 'p' },
		{ "traces", required_argument, NULL, 't' },
		{ "layers", required_argument, NULL, OPT_LAYERS },
		{ "per-layer", no_argument, NULL, OPT_PER_LAYER },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct eval_input in[MAX_PLACEMENTS];
	const char *traces = NULL;
	struct nl_trace_reader *tr = NULL;
	const struct nl_trace_meta *tm;
	struct nl_progress progress;
	uint32_t lfirst = 0, lcount = 0, first, last; /* last exclusive */
	unsigned np = 0;
	bool have_layers = false, json = false, quiet = false, per_layer = false;
	int opt, err;

	memset(in, 0, sizeof(in));
	while ((opt = getopt_long(argc, argv, "p:t:qhV", longopts, NULL)) != -1) {
		switch (opt) {
		case 'p':
			if (np == MAX_PLACEMENTS)
				nl_usage_error(eval_usage, "at most %d placements", MAX_PLACEMENTS);
			in[np++].path = optarg;
			break;
		case 't':
			traces = optarg;
			break;
		case OPT_LAYERS:
			nl_parse_range(eval_usage, "--layers", optarg, &lfirst, &lcount);
			have_layers = true;
			break;
		case OPT_PER_LAYER:
			per_layer = true;
			break;
		case OPT_JSON:
			json = true;
			break;
		case 'q':
			quiet = true;
			break;
		case 'h':
			eval_help();
			return 0;
		case 'V':
			nl_print_version();
			return 0;
		default:
			nl_usage_error(eval_usage, "unknown or incomplete option");
		}
	}
	if (optind < argc)
		nl_usage_error(eval_usage, "unexpected argument '%s'", argv[optind]);
	if (np == 0)
		nl_usage_error(eval_usage, "missing --placement");
	if (!traces)
		nl_usage_error(eval_usage, "missing --traces");
	err = nl_trace_open(&tr, traces);
	if (err)
		nl_die_err(err, NULL);
	tm = nl_trace_get_meta(tr);
	first = 0;
	last = tm->model.n_layers;
	for (unsigned p = 0; p < np; p++) {
		const struct nl_placement_meta *pm;

		err = nl_placement_open(&in[p].reader, in[p].path);
		if (err)
			nl_die_err(err, NULL);
		pm = nl_placement_get_meta(in[p].reader);
		if (pm->model.n_neurons != tm->model.n_neurons)
			nl_die("'%s' places %" PRIu32 " neurons per layer but the traces '%s' have %"
			       PRIu32 "; use a placement computed for model '%s'", in[p].path,
			       pm->model.n_neurons, traces, tm->model.n_neurons, tm->model.name);
		/* same width is not enough: stories260K and aidreams260K both have 172 */
		if (strcmp(pm->model.name, tm->model.name) != 0 ||
		    pm->model.n_layers != tm->model.n_layers || pm->model.d_model != tm->model.d_model)
			nl_die("'%s' is a placement of model '%s' (%" PRIu32 " layers, d_model %" PRIu32
			       ") but the traces '%s' are of '%s' (%" PRIu32 " layers, d_model %" PRIu32
			       "); use a placement computed for model '%s'", in[p].path, pm->model.name,
			       pm->model.n_layers, pm->model.d_model, traces, tm->model.name,
			       tm->model.n_layers, tm->model.d_model, tm->model.name);
		if (pm->layer_first > first)
			first = pm->layer_first;
		if (pm->layer_first + pm->layer_count < last)
			last = pm->layer_first + pm->layer_count;
	}
	if (have_layers) {
		if (lfirst < first || lfirst + lcount > last)
			nl_die("--layers %" PRIu32 "-%" PRIu32 ": the placements and traces have layers "
			       "%" PRIu32 "-%" PRIu32 " in common", lfirst, lfirst + lcount - 1,
			       first, last - 1);
		first = lfirst;
		last = lfirst + lcount;
	}
	if (first >= last)
		nl_die("the placements and the traces '%s' have no layer in common", traces);
	for (unsigned p = 0; p < np; p++) {
		in[p].per_layer = calloc(last - first, sizeof(struct nl_place_eval));
		if (!in[p].per_layer)
			nl_die("out of memory");
	}
	nl_progress_init(&progress, "nl-place eval", last - first, "layers", quiet);
	for (uint32_t l = first; l < last; l++) {
		struct nl_csr csr;
		char what[512];

		snprintf(what, sizeof(what), "'%s' layer %" PRIu32, traces, l);
		memset(&csr, 0, sizeof(csr));
		err = nl_trace_read_layer(tr, l, &csr);
		if (!err)
			err = nl_csr_validate(&csr, what);
		if (err)
			nl_die_err(err, NULL);
		for (unsigned p = 0; p < np; p++) {
			struct nl_placement_layer pl;

			memset(&pl, 0, sizeof(pl));
			err = nl_placement_read_layer(in[p].reader, l, &pl);
			if (err)
				nl_die_err(err, NULL);
			err = nl_place_eval_layer(&csr, &pl, &in[p].per_layer[l - first]);
			if (err) {
				snprintf(what, sizeof(what), "'%s' on '%s' layer %" PRIu32,
					 in[p].path, traces, l);
				nl_die_err(err, what);
			}
			nl_place_eval_add(&in[p].total, &in[p].per_layer[l - first]);
			in[p].profile_objective += pl.objective;
			if (l == first)
				snprintf(in[p].algo, sizeof(in[p].algo), "%s", pl.algo);
			nl_placement_layer_free(&pl);
		}
		nl_csr_free(&csr);
		nl_progress_update(&progress, l - first + 1);
	}
	nl_progress_done(&progress, last - first);
	/* per-token figures are sums over layers; n_tokens counts tokens once */
	for (unsigned p = 0; p < np; p++)
		in[p].total.n_tokens = tm->n_tokens;

	if (json) {
		struct nl_json j;

		nl_json_init(&j, stdout);
		nl_json_obj_begin(&j, NULL);
		nl_json_str(&j, "traces", traces);
		nl_json_str(&j, "dataset", tm->dataset);
		nl_json_u64(&j, "tokens", tm->n_tokens);
		nl_json_u64(&j, "layer_first", first);
		nl_json_u64(&j, "layer_count", last - first);
		nl_json_arr_begin(&j, "placements");
		for (unsigned p = 0; p < np; p++) {
			nl_json_obj_begin(&j, NULL);
			nl_json_str(&j, "path", in[p].path);
			nl_json_str(&j, "algo", in[p].algo);
			nl_json_double(&j, "profile_objective", in[p].profile_objective);
			json_eval(&j, "total", &in[p].total);
			nl_json_arr_begin(&j, "layers");
			for (uint32_t l = first; l < last; l++) {
				nl_json_obj_begin(&j, NULL);
				nl_json_u64(&j, "layer", l);
				json_eval(&j, "eval", &in[p].per_layer[l - first]);
				nl_json_obj_end(&j);
			}
			nl_json_arr_end(&j);
			nl_json_obj_end(&j);
		}
		nl_json_arr_end(&j);
		nl_json_obj_end(&j);
		nl_json_end(&j);
	} else {
		char name[64];

		printf("traces '%s' (dataset '%s'), %" PRIu64 " tokens, layers %" PRIu32 "-%" PRIu32
		       "; per-token figures summed over layers\n", traces, tm->dataset, tm->n_tokens,
		       first, last - 1);
		printf("%-28s", "placement");
		for (unsigned p = 0; p < np; p++) {
			/* file name without ".h5", its last 14 characters when longer */
			const char *b = nl_base_name(in[p].path);
			size_t len = strlen(b);

			if (len > 3 && strcmp(b + len - 3, ".h5") == 0)
				len -= 3;
			if (len > 14) {
				b += len - 14;
				len = 14;
			}
			printf(" %14.*s", (int)len, b);
		}
		printf("\n%-28s", "algo");
		for (unsigned p = 0; p < np; p++)
			printf(" %14.14s", in[p].algo);
		printf("\n");
		print_row_u("active neurons / token", in, np, m_active, NULL);
		print_row_u("reads / token", in, np, m_reads, NULL);
		print_row_u("mean run (neurons)", in, np, m_mean_run, NULL);
		print_row_u("max run (neurons)", in, np, m_max_run, NULL);
		print_row_u("objective (these traces)", in, np, m_objective, NULL);
		print_row_u("objective (profile)", in, np, m_profile_obj, NULL);
		for (unsigned b = 0; b < NL_PLACE_RUN_BUCKETS; b++) {
			bool any = false;

			for (unsigned p = 0; p < np; p++)
				any |= in[p].total.run_hist[b] != 0;
			if (!any)
				continue;
			if (b == 0)
				snprintf(name, sizeof(name), "%% runs of length 1");
			else if (b == NL_PLACE_RUN_BUCKETS - 1)
				snprintf(name, sizeof(name), "%% runs of length >= %" PRIu64,
					 nl_place_run_bucket_lo(b));
			else if (b == 1)
				snprintf(name, sizeof(name), "%% runs of length 2");
			else
				snprintf(name, sizeof(name), "%% runs of length %" PRIu64 "-%" PRIu64,
					 nl_place_run_bucket_lo(b), nl_place_run_bucket_lo(b + 1) - 1);
			print_row_u(name, in, np, m_hist, &b);
		}
		for (unsigned g = 1; g <= NL_PLACE_GAP_MAX; g++) {
			snprintf(name, sizeof(name), "gap<=%u: reads / token", g);
			print_row_u(name, in, np, m_collapse_reads, &g);
			snprintf(name, sizeof(name), "gap<=%u: extra neurons/tok", g);
			print_row_u(name, in, np, m_collapse_extra, &g);
		}
		if (per_layer) {
			for (uint32_t l = first; l < last; l++) {
				printf("layer %-3" PRIu32 " reads / token     ", l);
				for (unsigned p = 0; p < np; p++) {
					const struct nl_place_eval *e = &in[p].per_layer[l - first];

					printf(" %14.4f", e->n_tokens ? (double)e->runs / (double)e->n_tokens : 0);
				}
				printf("\n");
			}
		}
	}
	for (unsigned p = 0; p < np; p++) {
		nl_placement_close(in[p].reader);
		free(in[p].per_layer);
	}
	nl_trace_close(tr);
	return 0;
}

int main(int argc, char **argv)
{
	nl_cli_init("nl-place");
	if (argc > 1 && strcmp(argv[1], "eval") == 0) {
		nl_cli_init("nl-place eval");
		return cmd_eval(argc - 1, argv + 1);
	}
	if (argc > 1 && strcmp(argv[1], "run") == 0)
		return cmd_run(argc - 1, argv + 1);
	return cmd_run(argc, argv);
}
