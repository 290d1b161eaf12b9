/*
 * nl-coact: co-activation statistics from activation traces (Neuralink
 * section 4.1). Subcommands: count (traces -> statistics), merge (sum
 * shards), heatmap (PNG of one layer, Figure 5). Only argument parsing and
 * printing live here; the work is in the nlcoact library.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nl_cli.h"
#include "nl_coact.h"
#include "nl_formats.h"

static const char usage_short[] =
	"Usage: nl-coact count TRACES.h5 -o COACT.h5 [options]\n"
	"       nl-coact merge A.h5 B.h5 ... -o ALL.h5 [options]\n"
	"       nl-coact heatmap COACT.h5 --layer L -o LAYER.png [options]\n";

static const char usage_long[] =
	"Usage: nl-coact count TRACES.h5 -o COACT.h5 [options]\n"
	"       nl-coact merge A.h5 B.h5 ... -o ALL.h5 [options]\n"
	"       nl-coact heatmap COACT.h5 --layer L -o LAYER.png [options]\n"
	"\n"
	"Co-activation statistics (Neuralink section 4.1): per layer f(i), f(i,j)\n"
	"and the token count, plus top-K neighbour lists for the sparse placer.\n"
	"\n"
	"count: count every layer of a trace file (one layer in memory at a time).\n"
	"  -o, --output FILE     statistics file to write (required)\n"
	"  -k, --topk K          neighbours per neuron in the top-K lists (default 32, 0 = none)\n"
	"      --rank NAME       top-K ranking: norm, f(i,j)/sqrt(f(i)f(j)) (default), or\n"
	"                        count, f(i,j); ties by count, then id\n"
	"      --layers A-B      only layers A..B (inclusive), e.g. 0-15 or 7\n"
	"      --kernel NAME     auto (cost model), sparse or bitset (default auto)\n"
	"      --simd NAME       bitset code path: auto, scalar, avx2, avx512 (default auto)\n"
	"      --no-pairs        do not store the f(i,j) triangle (top-K lists only;\n"
	"                        such files cannot be merged exactly)\n"
	"  -j, --threads N       worker threads (default: all CPUs)\n"
	"      --compress SPEC   zstd, zstd:LEVEL, deflate, deflate:LEVEL or none (default zstd)\n"
	"\n"
	"merge: add statistics of shards counted on different tokens of the same\n"
	"layers and/or on different layer ranges of the same model.\n"
	"  -o, --output FILE     merged file (required)\n"
	"  -k, --topk K          top-K of the output (default: that of the inputs)\n"
	"      --rank NAME       top-K ranking of the output, norm or count (default: that\n"
	"                        of the inputs; norm when they differ)\n"
	"      --no-pairs        do not store the merged triangle\n"
	"      --compress SPEC   as for count\n"
	"\n"
	"heatmap: PNG of one layer's co-activation matrix (paper Figure 5).\n"
	"  -o, --output FILE     PNG to write (required)\n"
	"  -l, --layer L         layer to draw (required)\n"
	"  -p, --placement FILE  order rows and columns by this placement (nl-place output)\n"
	"      --value NAME      norm: f(i,j)/sqrt(f(i)f(j)) (default); prob: P(ij), equation 2\n"
	"      --scale NAME      gamma (default) or log (4 decades)\n"
	"      --gamma G         exponent of the gamma scale (default 0.5)\n"
	"      --size PX         at most PX pixels a side, blocks averaged (default 1024)\n"
	"\n"
	"Common options:\n"
	"  -f, --force           overwrite the output file\n"
	"      --json            print a JSON summary on stdout\n"
	"  -q, --quiet           no progress line\n"
	"  -h, --help            this help\n"
	"  -V, --version         version\n"
	"\n"
	"Exit status: 0 ok, 1 failure, 2 usage error.\n";

enum {
	OPT_LAYERS = 256,
	OPT_KERNEL,
	OPT_SIMD,
	OPT_NO_PAIRS,
	OPT_COMPRESS,
	OPT_JSON,
	OPT_VALUE,
	OPT_SCALE,
	OPT_GAMMA,
	OPT_SIZE,
	OPT_RANK,
};

static const struct option long_opts[] = {
	{ "output", required_argument, NULL, 'o' },
	{ "topk", required_argument, NULL, 'k' },
	{ "layers", required_argument, NULL, OPT_LAYERS },
	{ "layer", required_argument, NULL, 'l' },
	{ "kernel", required_argument, NULL, OPT_KERNEL },
	{ "simd", required_argument, NULL, OPT_SIMD },
	{ "no-pairs", no_argument, NULL, OPT_NO_PAIRS },
	{ "threads", required_argument, NULL, 'j' },
	{ "compress", required_argument, NULL, OPT_COMPRESS },
	{ "placement", required_argument, NULL, 'p' },
	{ "value", required_argument, NULL, OPT_VALUE },
	{ "scale", required_argument, NULL, OPT_SCALE },
	{ "gamma", required_argument, NULL, OPT_GAMMA },
	{ "size", required_argument, NULL, OPT_SIZE },
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "force", no_argument, NULL, 'f' },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "quiet", no_argument, NULL, 'q' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

struct args {
	const char *cmd;
	const char *output;
	const char **inputs;
	int n_inputs;
	struct nl_coact_opts copts;
	bool k_given;
	bool rank_given;
	bool layers_given;
	uint32_t layer_first, layer_count;
	bool no_pairs;
	struct nl_h5_opts h5;
	bool force, json, quiet;
	/* heatmap */
	bool layer_given;
	uint32_t layer;
	const char *placement;
	struct nl_coact_heat_opts heat;
};

/* Which options each subcommand accepts (a misplaced option is a usage error). */
static bool option_allowed(const char *cmd, int c)
{
	bool count = strcmp(cmd, "count") == 0, merge = strcmp(cmd, "merge") == 0;
	bool heat = strcmp(cmd, "heatmap") == 0;

	switch (c) {
	case 'k': case OPT_NO_PAIRS: case OPT_COMPRESS: case OPT_RANK:
		return count || merge;
	case OPT_LAYERS: case OPT_KERNEL: case OPT_SIMD: case 'j':
		return count;
	case 'l': case 'p': case OPT_VALUE: case OPT_SCALE: case OPT_GAMMA: case OPT_SIZE:
		return heat;
	default:
		return true;
	}
}

static void parse_args(struct args *a, int argc, char **argv)
{
	int c;

	memset(a, 0, sizeof(*a));
	nl_coact_opts_default(&a->copts);
	nl_coact_heat_opts_default(&a->heat);
	a->h5.compress = NL_COMPRESS_ZSTD;
	if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(usage_long, stdout);
		exit(0);
	}
	if (argc >= 2 && (strcmp(argv[1], "-V") == 0 || strcmp(argv[1], "--version") == 0)) {
		nl_print_version();
		exit(0);
	}
	if (argc < 2)
		nl_usage_error(usage_short, "missing subcommand (count, merge or heatmap)");
	a->cmd = argv[1];
	if (strcmp(a->cmd, "count") && strcmp(a->cmd, "merge") && strcmp(a->cmd, "heatmap"))
		nl_usage_error(usage_short, "unknown subcommand '%s', expected count, merge or heatmap", a->cmd);
	argc--;
	argv++;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":o:k:l:j:p:fqhV", long_opts, NULL)) != -1) {
		if (c == '?') {
			if (optopt)
				nl_usage_error(usage_short, "unknown option '-%c'", optopt);
			nl_usage_error(usage_short, "unknown option '%s'", argv[optind - 1]);
		}
		if (c == ':')
			nl_usage_error(usage_short, "option '%s' needs a value", argv[optind - 1]);
		if (!option_allowed(a->cmd, c))
			nl_usage_error(usage_short, "option '%s' does not apply to '%s'",
				       argv[optind - 1], a->cmd);
		switch (c) {
		case 'o':
			a->output = optarg;
			break;
		case 'k':
			a->copts.k = (uint32_t)nl_parse_u64_in(usage_short, "--topk", optarg, 0, 65536);
			a->k_given = true;
			break;
		case OPT_LAYERS:
			nl_parse_range(usage_short, "--layers", optarg, &a->layer_first, &a->layer_count);
			a->layers_given = true;
			break;
		case 'l':
			a->layer = (uint32_t)nl_parse_u64_in(usage_short, "--layer", optarg, 0,
							     NL_MAX_LAYERS - 1);
			a->layer_given = true;
			break;
		case OPT_KERNEL:
			if (nl_coact_kernel_parse(&a->copts.kernel, optarg) < 0)
				nl_usage_error(usage_short, "--kernel: %s", nl_diag_msg());
			break;
		case OPT_SIMD:
			if (nl_coact_simd_parse(&a->copts.simd, optarg) < 0)
				nl_usage_error(usage_short, "--simd: %s", nl_diag_msg());
			if (!nl_coact_simd_supported(a->copts.simd))
				nl_die("--simd %s: this CPU does not support it; use --simd auto", optarg);
			break;
		case OPT_NO_PAIRS:
			a->no_pairs = true;
			break;
		case OPT_RANK:
			if (nl_coact_rank_parse(&a->copts.rank, optarg) < 0)
				nl_usage_error(usage_short, "--rank: %s", nl_diag_msg());
			a->rank_given = true;
			break;
		case 'j':
			a->copts.n_threads = (uint32_t)nl_parse_u64_in(usage_short, "--threads", optarg,
								       1, 1024);
			break;
		case OPT_COMPRESS:
			if (nl_h5_opts_parse(&a->h5, optarg) < 0)
				nl_usage_error(usage_short, "--compress: %s", nl_diag_msg());
			break;
		case 'p':
			a->placement = optarg;
			break;
		case OPT_VALUE:
			if (strcmp(optarg, "norm") == 0)
				a->heat.value = NL_COACT_HEAT_NORM;
			else if (strcmp(optarg, "prob") == 0)
				a->heat.value = NL_COACT_HEAT_PROB;
			else
				nl_usage_error(usage_short, "--value: '%s', expected norm or prob", optarg);
			break;
		case OPT_SCALE:
			if (strcmp(optarg, "gamma") == 0)
				a->heat.scale = NL_COACT_HEAT_GAMMA;
			else if (strcmp(optarg, "log") == 0)
				a->heat.scale = NL_COACT_HEAT_LOG;
			else
				nl_usage_error(usage_short, "--scale: '%s', expected gamma or log", optarg);
			break;
		case OPT_GAMMA:
			a->heat.gamma = nl_parse_double(usage_short, "--gamma", optarg);
			if (!(a->heat.gamma > 0 && a->heat.gamma <= 10))
				nl_usage_error(usage_short, "--gamma: %s, expected a number in (0, 10]", optarg);
			break;
		case OPT_SIZE:
			a->heat.max_px = (uint32_t)nl_parse_u64_in(usage_short, "--size", optarg, 1,
								   16384);
			break;
		case 'f':
			a->force = true;
			break;
		case OPT_JSON:
			a->json = true;
			break;
		case 'q':
			a->quiet = true;
			break;
		case 'h':
			fputs(usage_long, stdout);
			exit(0);
		case 'V':
			nl_print_version();
			exit(0);
		}
	}
	a->inputs = (const char **)argv + optind;
	a->n_inputs = argc - optind;
	if (!a->output)
		nl_usage_error(usage_short, "%s: missing -o/--output", a->cmd);
	if (a->n_inputs == 0)
		nl_usage_error(usage_short, "%s: missing input file", a->cmd);
	if (strcmp(a->cmd, "merge") && a->n_inputs != 1)
		nl_usage_error(usage_short, "%s takes one input file, got %d", a->cmd, a->n_inputs);
	if (strcmp(a->cmd, "heatmap") == 0 && !a->layer_given)
		nl_usage_error(usage_short, "heatmap: missing --layer");
	for (int i = 0; i < a->n_inputs; i++)
		if (strcmp(a->inputs[i], a->output) == 0)
			nl_usage_error(usage_short, "'%s' is both an input and the output", a->output);
}

/* ---- count ---- */

struct layer_report {
	uint32_t layer;
	struct nl_coact_info info;
	double seconds_read, seconds_write;
};

static void json_layer(struct nl_json *j, const struct layer_report *r)
{
	double pps = r->info.seconds_count > 0 ? (double)r->info.pair_increments / r->info.seconds_count : 0;

	nl_json_obj_begin(j, NULL);
	nl_json_u64(j, "layer", r->layer);
	nl_json_str(j, "kernel", nl_coact_kernel_name(r->info.kernel));
	if (r->info.kernel == NL_COACT_KERNEL_BITSET)
		nl_json_str(j, "simd", nl_coact_simd_name(r->info.simd));
	nl_json_double(j, "seconds_read", r->seconds_read);
	nl_json_double(j, "seconds_count", r->info.seconds_count);
	nl_json_double(j, "seconds_topk", r->info.seconds_topk);
	nl_json_double(j, "seconds_write", r->seconds_write);
	nl_json_u64(j, "pair_increments", r->info.pair_increments);
	nl_json_double(j, "pairs_per_second", pps);
	nl_json_double(j, "cost_sparse", r->info.cost_sparse);
	nl_json_double(j, "cost_bitset", r->info.cost_bitset);
	nl_json_obj_end(j);
}

static int cmd_count(struct args *a)
{
	const char *in = a->inputs[0];
	struct nl_trace_reader *r = NULL;
	struct nl_coact_writer *w = NULL;
	const struct nl_trace_meta *tm;
	struct nl_coact_meta cm;
	struct layer_report *reports;
	struct nl_progress prog;
	double t_start = nl_now();
	int ret;

	nl_check_output(a->output, a->force);
	ret = nl_trace_open(&r, in);
	if (ret < 0)
		nl_die_err(ret, NULL);
	tm = nl_trace_get_meta(r);
	if (!a->layers_given) {
		a->layer_first = 0;
		a->layer_count = tm->model.n_layers;
	}
	if ((uint64_t)a->layer_first + a->layer_count > tm->model.n_layers)
		nl_die("--layers %u-%u: '%s' has %u layers (0-%u)", a->layer_first,
		       a->layer_first + a->layer_count - 1, in, tm->model.n_layers,
		       tm->model.n_layers - 1);
	if (tm->n_tokens > UINT32_MAX)
		nl_die("'%s' has %llu tokens: pair counts are u32 and exact only up to %u tokens; profile shards and merge fewer of them",
		       in, (unsigned long long)tm->n_tokens, UINT32_MAX);

	if (a->copts.k >= tm->model.n_neurons) {
		uint32_t k = tm->model.n_neurons ? tm->model.n_neurons - 1 : 0;

		if (a->k_given)
			nl_warn("--topk %u: a neuron has only %u others; using %u", a->copts.k, k, k);
		a->copts.k = k;
	}
	memset(&cm, 0, sizeof(cm));
	cm.model = tm->model;
	memcpy(cm.dataset, tm->dataset, sizeof(cm.dataset));
	cm.layer_first = a->layer_first;
	cm.layer_count = a->layer_count;
	cm.n_tokens = tm->n_tokens;
	cm.has_pairs = !a->no_pairs;
	cm.k = a->copts.k;
	cm.rank = a->copts.rank;
	a->copts.keep_pairs = cm.has_pairs;

	reports = calloc(a->layer_count ? a->layer_count : 1, sizeof(*reports));
	if (!reports)
		nl_die("out of memory");
	ret = nl_coact_create(&w, a->output, &cm, &a->h5);
	if (ret < 0)
		nl_die_err(ret, NULL);

	/* One result for all layers: its triangle buffer is recycled. */
	struct nl_coact_layer stats = { 0 };

	nl_progress_init(&prog, "count", (uint64_t)a->layer_count * tm->n_tokens, "tokens", a->quiet);
	for (uint32_t q = 0; q < a->layer_count; q++) {
		uint32_t layer = a->layer_first + q;
		struct layer_report *rep = &reports[q];
		struct nl_csr csr = { 0 };
		double t0 = nl_now();

		rep->layer = layer;
		ret = nl_trace_read_layer(r, layer, &csr);
		if (ret < 0)
			goto out_fail;
		rep->seconds_read = nl_now() - t0;
		ret = nl_coact_count_layer(&csr, &a->copts, &stats, &rep->info);
		nl_csr_free(&csr);
		if (ret < 0) {
			nl_diag_prefix(ret, "'%s': layer %u: ", in, layer);
			goto out_fail;
		}
		t0 = nl_now();
		ret = nl_coact_write_layer(w, layer, &stats);
		if (ret < 0)
			goto out_fail;
		rep->seconds_write = nl_now() - t0;
		nl_progress_update(&prog, (uint64_t)(q + 1) * tm->n_tokens);
	}
	nl_coact_layer_free(&stats);
	ret = nl_coact_finish(w);
	w = NULL;
	if (ret < 0)
		goto out_fail;
	nl_progress_done(&prog, (uint64_t)a->layer_count * tm->n_tokens);

	if (a->json) {
		struct nl_json j;
		uint64_t incs = 0;
		double count_s = 0;

		for (uint32_t q = 0; q < a->layer_count; q++) {
			incs += reports[q].info.pair_increments;
			count_s += reports[q].info.seconds_count;
		}
		nl_json_init(&j, stdout);
		nl_json_obj_begin(&j, NULL);
		nl_json_str(&j, "command", "count");
		nl_json_str(&j, "input", in);
		nl_json_str(&j, "output", a->output);
		nl_json_u64(&j, "n_tokens", tm->n_tokens);
		nl_json_u64(&j, "n_neurons", tm->model.n_neurons);
		nl_json_u64(&j, "k", a->copts.k);
		nl_json_str(&j, "topk_rank", nl_coact_rank_name(cm.rank));
		nl_json_bool(&j, "pairs_stored", cm.has_pairs);
		nl_json_double(&j, "seconds_total", nl_now() - t_start);
		nl_json_double(&j, "seconds_count", count_s);
		nl_json_u64(&j, "pair_increments", incs);
		nl_json_double(&j, "pairs_per_second", count_s > 0 ? (double)incs / count_s : 0);
		nl_json_arr_begin(&j, "layers");
		for (uint32_t q = 0; q < a->layer_count; q++)
			json_layer(&j, &reports[q]);
		nl_json_arr_end(&j);
		nl_json_obj_end(&j);
		nl_json_end(&j);
	}
	free(reports);
	nl_trace_close(r);
	return 0;

out_fail:
	nl_coact_abort(w);
	nl_die_err(ret, NULL);
}

/* ---- merge ---- */

static bool same_model(const struct nl_model_id *x, const struct nl_model_id *y)
{
	return strcmp(x->name, y->name) == 0 && x->n_layers == y->n_layers &&
	       x->d_model == y->d_model && x->n_neurons == y->n_neurons;
}

static int cmd_merge(struct args *a)
{
	int n_in = a->n_inputs;
	struct nl_coact_reader **rd = calloc(n_in, sizeof(*rd));
	const struct nl_coact_meta **meta = calloc(n_in, sizeof(*meta));
	struct nl_coact_writer *w = NULL;
	struct nl_coact_meta out;
	uint32_t first = UINT32_MAX, end = 0, k_out;
	bool all_pairs = true, k_agree = true, rank_agree = true;
	struct nl_progress prog;
	double t_start = nl_now();
	int ret = 0;

	if (!rd || !meta)
		nl_die("out of memory");
	nl_check_output(a->output, a->force);
	for (int i = 0; i < n_in; i++) {
		ret = nl_coact_open(&rd[i], a->inputs[i]);
		if (ret < 0)
			nl_die_err(ret, NULL);
		meta[i] = nl_coact_get_meta(rd[i]);
		const struct nl_model_id *m0 = &meta[0]->model, *mi = &meta[i]->model;

		if (!same_model(m0, mi))
			nl_die("'%s' describes model '%s' (%u layers, d_model %u, %u neurons) but '%s' describes '%s' (%u layers, d_model %u, %u neurons); only statistics of the same model can be merged",
			       a->inputs[i], mi->name, mi->n_layers, mi->d_model, mi->n_neurons,
			       a->inputs[0], m0->name, m0->n_layers, m0->d_model, m0->n_neurons);
		if (meta[i]->layer_first < first)
			first = meta[i]->layer_first;
		if (meta[i]->layer_first + meta[i]->layer_count > end)
			end = meta[i]->layer_first + meta[i]->layer_count;
		all_pairs &= meta[i]->has_pairs;
		k_agree &= meta[i]->k == meta[0]->k;
		rank_agree &= meta[i]->rank == meta[0]->rank;
	}
	/* Output token count: per layer, the sum over the inputs holding it. */
	uint64_t tokens0 = 0;
	for (uint32_t l = first; l < end; l++) {
		uint64_t tokens = 0;
		int holders = 0;

		for (int i = 0; i < n_in; i++)
			if (l >= meta[i]->layer_first && l < meta[i]->layer_first + meta[i]->layer_count) {
				tokens += meta[i]->n_tokens;
				holders++;
			}
		if (holders == 0)
			nl_die("no input holds layer %u, the merged layers %u-%u would have a gap; add the shard with layer %u",
			       l, first, end - 1, l);
		if (l == first)
			tokens0 = tokens;
		else if (tokens != tokens0)
			nl_die("after merging, layer %u would count %llu tokens but layer %u %llu; the shards cover the layers unevenly (each layer needs the same token shards)",
			       l, (unsigned long long)tokens, first, (unsigned long long)tokens0);
		if (tokens > UINT32_MAX)
			nl_die("layer %u would count %llu tokens: pair counts are u32 and exact only up to %u tokens; merge fewer shards",
			       l, (unsigned long long)tokens, UINT32_MAX);
		if (holders > 1)
			for (int i = 0; i < n_in; i++)
				if (l >= meta[i]->layer_first &&
				    l < meta[i]->layer_first + meta[i]->layer_count && !meta[i]->has_pairs)
					nl_die("'%s' has no pair counts f(i,j) (counted with --no-pairs) and layer %u is also in another input: counts add but top-K lists cannot be merged exactly; re-run nl-coact count without --no-pairs",
					       a->inputs[i], l);
	}
	k_out = a->k_given ? a->copts.k : meta[0]->k;
	if (!a->k_given && !k_agree) {
		k_out = UINT32_MAX;
		for (int i = 0; i < n_in; i++)
			if (meta[i]->k < k_out)
				k_out = meta[i]->k;
		nl_warn("inputs have different top-K sizes; the output keeps the smallest, %u", k_out);
	}

	if (k_out >= meta[0]->model.n_neurons) {
		uint32_t k = meta[0]->model.n_neurons ? meta[0]->model.n_neurons - 1 : 0;

		nl_warn("--topk %u: a neuron has only %u others; using %u", k_out, k, k);
		k_out = k;
	}
	memset(&out, 0, sizeof(out));
	out.model = meta[0]->model;
	snprintf(out.dataset, sizeof(out.dataset), "%s", meta[0]->dataset);
	for (int i = 1; i < n_in; i++) {
		bool seen = false;

		for (int p = 0; p < i; p++)
			seen |= strcmp(meta[p]->dataset, meta[i]->dataset) == 0;
		if (!seen) {
			size_t len = strlen(out.dataset);

			snprintf(out.dataset + len, sizeof(out.dataset) - len, "+%s", meta[i]->dataset);
		}
	}
	out.layer_first = first;
	out.layer_count = end - first;
	out.n_tokens = tokens0;
	out.has_pairs = all_pairs && !a->no_pairs;
	out.k = k_out;
	/* Lists are recomputed from the merged pairs, so inputs ranked
	 * differently only matter for a layer whose lists are reused as they
	 * are (one input, no pairs): that layer fails below. */
	out.rank = a->rank_given ? a->copts.rank : rank_agree ? meta[0]->rank : NL_COACT_RANK_NORM;

	ret = nl_coact_create(&w, a->output, &out, &a->h5);
	if (ret < 0)
		nl_die_err(ret, NULL);
	nl_progress_init(&prog, "merge", out.layer_count, "layers", a->quiet);
	for (uint32_t l = first; l < end; l++) {
		struct nl_coact_layer acc = { 0 }, add = { 0 };
		int holders = 0, last = -1;

		for (int i = 0; i < n_in; i++) {
			if (l < meta[i]->layer_first || l >= meta[i]->layer_first + meta[i]->layer_count)
				continue;
			/* pairs are needed to add, to recompute top-K, or to store */
			bool want = meta[i]->has_pairs;

			ret = nl_coact_read_layer(rd[i], l, want, holders ? &add : &acc);
			if (ret < 0)
				goto out_fail;
			if (holders) {
				ret = nl_coact_layer_add(&acc, &add);
				nl_coact_layer_free(&add);
				if (ret < 0) {
					nl_diag_prefix(ret, "'%s': layer %u: ", a->inputs[i], l);
					goto out_fail;
				}
			}
			holders++;
			last = i;
		}
		if (k_out > 0 && (holders > 1 || acc.k != k_out || !acc.topk_ids ||
				  acc.rank != out.rank)) {
			if (acc.pairs) {
				ret = nl_coact_topk_ranked(&acc, k_out, out.rank, 0);
			} else if (acc.rank != out.rank) {
				ret = nl_diag(NL_E_MISSING,
					      "'%s': layer %u has top-K lists ranked by %s and no pair counts, they cannot be re-ranked by %s; pass --rank %s",
					      a->inputs[last], l, nl_coact_rank_name(acc.rank),
					      nl_coact_rank_name(out.rank), nl_coact_rank_name(acc.rank));
			} else if (acc.topk_ids && acc.k > k_out) {
				/* ranked lists: the first k_out entries are the top k_out */
				for (uint32_t i = 0; i < acc.n_neurons; i++) {
					memmove(acc.topk_ids + (size_t)i * k_out, acc.topk_ids + (size_t)i * acc.k,
						k_out * sizeof(uint32_t));
					memmove(acc.topk_counts + (size_t)i * k_out,
						acc.topk_counts + (size_t)i * acc.k, k_out * sizeof(uint32_t));
				}
				acc.k = k_out;
			} else {
				ret = nl_diag(NL_E_MISSING,
					      "'%s': layer %u has top-%u lists and no pair counts, top-%u cannot be computed; pass -k %u or less",
					      a->inputs[last], l, acc.k, k_out, acc.k);
			}
			if (ret < 0) {
				nl_coact_layer_free(&acc);
				goto out_fail;
			}
		}
		if (k_out == 0) {
			free(acc.topk_ids);
			free(acc.topk_counts);
			acc.topk_ids = acc.topk_counts = NULL;
			acc.k = 0;
		}
		if (!out.has_pairs) {
			free(acc.pairs);
			acc.pairs = NULL;
		}
		ret = nl_coact_write_layer(w, l, &acc);
		nl_coact_layer_free(&acc);
		if (ret < 0)
			goto out_fail;
		nl_progress_update(&prog, l - first + 1);
	}
	ret = nl_coact_finish(w);
	w = NULL;
	if (ret < 0)
		goto out_fail;
	nl_progress_done(&prog, out.layer_count);
	if (a->json) {
		struct nl_json j;

		nl_json_init(&j, stdout);
		nl_json_obj_begin(&j, NULL);
		nl_json_str(&j, "command", "merge");
		nl_json_arr_begin(&j, "inputs");
		for (int i = 0; i < n_in; i++)
			nl_json_str(&j, NULL, a->inputs[i]);
		nl_json_arr_end(&j);
		nl_json_str(&j, "output", a->output);
		nl_json_u64(&j, "layer_first", out.layer_first);
		nl_json_u64(&j, "layer_count", out.layer_count);
		nl_json_u64(&j, "n_tokens", out.n_tokens);
		nl_json_str(&j, "topk_rank", nl_coact_rank_name(out.rank));
		nl_json_u64(&j, "k", out.k);
		nl_json_bool(&j, "pairs_stored", out.has_pairs);
		nl_json_double(&j, "seconds_total", nl_now() - t_start);
		nl_json_obj_end(&j);
		nl_json_end(&j);
	}
	for (int i = 0; i < n_in; i++)
		nl_coact_close(rd[i]);
	free(rd);
	free(meta);
	return 0;

out_fail:
	nl_coact_abort(w);
	nl_die_err(ret, NULL);
}

/* ---- heatmap ---- */

static int cmd_heatmap(struct args *a)
{
	const char *in = a->inputs[0];
	struct nl_coact_reader *r = NULL;
	const struct nl_coact_meta *m;
	struct nl_coact_layer layer = { 0 };
	struct nl_placement_layer pl = { 0 };
	uint8_t *rgb = NULL;
	uint32_t side = 0;
	int ret;

	nl_check_output(a->output, a->force);
	ret = nl_coact_open(&r, in);
	if (ret < 0)
		nl_die_err(ret, NULL);
	m = nl_coact_get_meta(r);
	if (a->layer < m->layer_first || a->layer >= m->layer_first + m->layer_count)
		nl_die("--layer %u: '%s' holds layers %u-%u", a->layer, in, m->layer_first,
		       m->layer_first + m->layer_count - 1);
	if (!m->has_pairs)
		nl_die("'%s' stores no pair counts f(i,j) (counted with --no-pairs); the heatmap needs them, re-run nl-coact count without --no-pairs",
		       in);
	if (a->placement) {
		struct nl_placement_reader *pr = NULL;
		const struct nl_placement_meta *pm;

		ret = nl_placement_open(&pr, a->placement);
		if (ret < 0)
			nl_die_err(ret, NULL);
		pm = nl_placement_get_meta(pr);
		if (!same_model(&pm->model, &m->model))
			nl_die("'%s' is a placement of model '%s' (%u neurons) but '%s' holds statistics of '%s' (%u neurons)",
			       a->placement, pm->model.name, pm->model.n_neurons, in, m->model.name,
			       m->model.n_neurons);
		if (a->layer < pm->layer_first || a->layer >= pm->layer_first + pm->layer_count)
			nl_die("--layer %u: placement '%s' holds layers %u-%u", a->layer, a->placement,
			       pm->layer_first, pm->layer_first + pm->layer_count - 1);
		ret = nl_placement_read_layer(pr, a->layer, &pl);
		nl_placement_close(pr);
		if (ret < 0)
			nl_die_err(ret, NULL);
	}
	ret = nl_coact_read_layer(r, a->layer, true, &layer);
	if (ret < 0)
		nl_die_err(ret, NULL);
	if (pl.perm && pl.n_neurons != layer.n_neurons)
		nl_die("placement '%s' layer %u has %u neurons, statistics '%s' %u", a->placement,
		       a->layer, pl.n_neurons, in, layer.n_neurons);
	ret = nl_coact_heatmap(&layer, pl.perm, &a->heat, &rgb, &side);
	if (ret < 0)
		nl_die_err(ret, in);
	ret = nl_coact_png_write(a->output, rgb, side, side);
	if (ret < 0)
		nl_die_err(ret, NULL);
	if (a->json) {
		struct nl_json j;

		nl_json_init(&j, stdout);
		nl_json_obj_begin(&j, NULL);
		nl_json_str(&j, "command", "heatmap");
		nl_json_str(&j, "input", in);
		nl_json_str(&j, "output", a->output);
		nl_json_u64(&j, "layer", a->layer);
		nl_json_u64(&j, "n_neurons", layer.n_neurons);
		nl_json_u64(&j, "pixels", side);
		nl_json_bool(&j, "placement", a->placement != NULL);
		nl_json_obj_end(&j);
		nl_json_end(&j);
	} else if (!a->quiet) {
		fprintf(stderr, "%s: wrote %s (%ux%u, layer %u, %u neurons)\n", nl_cli_prog(), a->output,
			side, side, a->layer, layer.n_neurons);
	}
	free(rgb);
	nl_coact_layer_free(&layer);
	nl_placement_layer_free(&pl);
	nl_coact_close(r);
	return 0;
}

int main(int argc, char **argv)
{
	struct args a;

	nl_cli_init("nl-coact");
	parse_args(&a, argc, argv);
	if (strcmp(a.cmd, "count") == 0)
		return cmd_count(&a);
	if (strcmp(a.cmd, "merge") == 0)
		return cmd_merge(&a);
	return cmd_heatmap(&a);
}
