/*
 * nl-profile: activation traces (which FFN neurons every token activates in
 * every layer) from a model and a dataset, from NumPy files profiled
 * elsewhere, or synthetic ones at 7B shapes for benchmarks.
 *
 *   nl-profile run    -m MODEL -d DATASET ... -o trace.h5
 *   nl-profile import --layers 'dir/layer_%d.npy' ... -o trace.h5
 *   nl-profile synth  --shape opt-6.7b --tokens T ... -o trace.h5
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nl_cli.h"
#include "nl_profile.h"

static const char usage_main[] =
	"Usage: nl-profile run    -m MODEL -d DATASET [options] -o TRACE.h5\n"
	"       nl-profile import (--layers PATTERN | FILE.npy...) [options] -o TRACE.h5\n"
	"       nl-profile synth  --shape SHAPE --tokens T [options] -o TRACE.h5\n";

static const char usage_run[] =
	"Usage: nl-profile run -m MODEL [-t TOKENIZER] -d DATASET [--format FMT] [--fields F,..]\n"
	"         [--sparsity relu|threshold|topk] [--density D] [--samples N] [--max-tokens M]\n"
	"         [--seed S] [--split-role train|test|all] [-j N] -o TRACE.h5 [-f] [--json] [--quiet]\n";

static const char usage_import[] =
	"Usage: nl-profile import (-m MODEL | --d-model D) (--layers 'dir/layer_%d.npy' | FILE.npy...)\n"
	"         [--threshold T] [--sample-ids IDS.npy] [--model-name NAME] [--dataset NAME]\n"
	"         -o TRACE.h5 [-f] [--json]\n";

static const char usage_synth[] =
	"Usage: nl-profile synth --shape opt-6.7b|llama-2-7b|LxN --tokens T [--density D] [--seed S]\n"
	"         [--zipf S] [--group-size G] [--coherence C] [--noise N] [--token-seed S]\n         [-j N] -o TRACE.h5 [-f] [--json]\n";

static void help_main(void)
{
	printf("%s\n"
	       "Record which FFN neurons every token activates in every layer (traces, HDF5).\n\n"
	       "Commands:\n"
	       "  run      profile a llama2.c or GGUF model on a dataset (nl-profile run --help)\n"
	       "  import   convert NumPy .npy masks/activations from PyTorch into a trace\n"
	       "  synth    write a synthetic trace at a real model shape (benchmarks only)\n\n"
	       "  -h, --help     this help\n"
	       "  -V, --version  print the version\n\n"
	       "See docs/profiling.md.\n", usage_main);
}

static void help_run(void)
{
	printf("%s\n"
	       "Profile a model on a dataset and write its activation trace.\n\n"
	       "  -m, --model PATH         llama2.c .bin or GGUF model\n"
	       "  -t, --tokenizer PATH     llama2.c tokenizer.bin (GGUF models use their own vocabulary)\n"
	       "  -d, --dataset PATH       dataset file (.bz2 is decompressed with bzip2 -dc)\n"
	       "      --format FMT         text (blank-line paragraphs), lines, jsonl, json, hellaswag, ids;\n"
	       "                           default from the name: .jsonl, .json, .ids, else text\n"
	       "      --fields A,B         JSON fields joined with newlines (default: all string fields)\n"
	       "      --split SEP          text: split samples on SEP (e.g. '<|endoftext|>') not blank lines\n"
	       "      --sparsity RULE      relu: gate > 0; threshold: |gate| > t_l calibrated per layer;\n"
	       "                           topk: top fraction per token (default: relu with --ffn-act relu,\n"
	       "                           else threshold)\n"
	       "      --density D          target active fraction for threshold/topk (default 0.3)\n"
	       "      --ffn-act ACT        silu (SwiGLU, default) or relu (ReGLU)\n"
	       "      --samples N          samples to profile (default 1024; 0 = all)\n"
	       "      --max-tokens M       tokens per sample including BOS (default: model context)\n"
	       "      --seed S             which samples are picked (default 0)\n"
	       "      --split-role ROLE    train (default), test or all; samples of the train and test\n"
	       "      --test-fraction F    roles never overlap (default 0.2 in the test role)\n"
	       "  -j, --threads N          worker threads (default: online CPUs)\n"
	       "  -o, --output PATH        trace to write\n"
	       "  -f, --force              overwrite an existing output\n"
	       "      --compress C         zstd[:L] (default), deflate[:L] or none\n"
	       "      --json               JSON summary on stdout instead of the table\n"
	       "  -q, --quiet              no progress line\n"
	       "  -h, --help, -V, --version\n", usage_run);
}

static void help_import(void)
{
	printf("%s\n"
	       "Convert per-layer NumPy arrays [tokens, neurons] into a trace.\n"
	       "dtypes: bool and uint8 (active where non-zero), float16 and float32 (active where\n"
	       "|x| > --threshold). C order, format version 1-3.\n\n"
	       "  -m, --model PATH         the model profiled (identity stored in the trace; its layer\n"
	       "                           count and FFN size must match the files)\n"
	       "      --layers PATTERN     printf pattern with one %%d for the layer, e.g. 'out/layer_%%d.npy';\n"
	       "                           layers 0.. until the first missing file, or --n-layers\n"
	       "      --n-layers L         exact number of layers for --layers\n"
	       "      --threshold T        for float arrays (default 0: non-zero magnitude)\n"
	       "      --sample-ids FILE    1-D int32/int64 .npy: the sample of every token (optional)\n"
	       "      --model-name NAME    model name stored in the trace (default: the model's, or 'imported')\n"
	       "      --d-model D          hidden size, when no model file is at hand\n"
	       "      --dataset NAME       dataset description stored in the trace\n"
	       "  -o, --output PATH, -f, --force, --compress C, --json, -q, --quiet\n"
	       "  -h, --help, -V, --version\n", usage_import);
}

static void help_synth(void)
{
	printf("%s\n"
	       "Write a synthetic trace for benchmarks at 7B shapes. Synthetic traces are\n"
	       "labelled as such and never used for quality claims (docs/profiling.md).\n\n"
	       "      --shape S            opt-6.7b (32 x 16384), llama-2-7b (32 x 11008), LxN[xD]\n"
	       "      --tokens T           tokens (default 10000)\n"
	       "      --density D          mean active fraction (default 0.03)\n"
	       "      --seed S             (default 1)\n"
	       "      --zipf S             power-law exponent of neuron frequency (default 0.6)\n"
	       "      --group-size G       co-activation group size (default 8)\n"
	       "      --coherence C        P(member fires | group fires) (default 0.7)\n"
	       "      --noise N            share of independent activations (default 0.5)\n"
	       "      --token-seed S       seed of the token draws (default: --seed); the same\n"
	       "                           --seed with another token seed gives held-out tokens\n"
	       "                           of the same synthetic model\n"
	       "  -j, --threads N          layers generated in parallel\n"
	       "  -o, --output PATH, -f, --force, --compress C, --json, -q, --quiet\n"
	       "  -h, --help, -V, --version\n", usage_synth);
}

enum {
	OPT_FORMAT = 256, OPT_FIELDS, OPT_SPLIT, OPT_SPARSITY, OPT_DENSITY, OPT_FFN_ACT, OPT_SAMPLES,
	OPT_MAX_TOKENS, OPT_SEED, OPT_ROLE, OPT_TEST_FRACTION, OPT_COMPRESS, OPT_JSON, OPT_LAYERS,
	OPT_N_LAYERS, OPT_THRESHOLD, OPT_MODEL_NAME, OPT_D_MODEL, OPT_DATASET_NAME, OPT_SHAPE,
	OPT_TOKENS, OPT_ZIPF, OPT_GROUP, OPT_COHERENCE, OPT_NOISE, OPT_TOKEN_SEED, OPT_SAMPLE_IDS,
};

/* -j/--threads N: 1..1024, 0 for the default (the online CPUs). */
static uint32_t parse_threads(const char *usage, const char *s)
{
	uint64_t n = nl_parse_u64_in(usage, "-j/--threads", s, 0, 1024);

	return n ? (uint32_t)n : nl_online_cpus();
}

static void print_density_table(const double *density, const double *threshold, uint32_t n_layers)
{
	double sum = 0;

	printf("layer  active%s\n", threshold ? "   threshold" : "");
	for (uint32_t l = 0; l < n_layers; l++) {
		printf("%5u  %6.2f%%", l, 100 * density[l]);
		if (threshold)
			printf("  %10.6g", threshold[l]);
		printf("\n");
		sum += density[l];
	}
	printf(" mean  %6.2f%%\n", n_layers ? 100 * sum / n_layers : 0);
}

static void json_layers(struct nl_json *j, const double *density, const double *threshold, uint32_t n)
{
	double sum = 0;

	nl_json_arr_begin(j, "density");
	for (uint32_t l = 0; l < n; l++) {
		nl_json_double(j, NULL, density[l]);
		sum += density[l];
	}
	nl_json_arr_end(j);
	nl_json_double(j, "mean_density", n ? sum / n : 0);
	if (threshold) {
		nl_json_arr_begin(j, "threshold");
		for (uint32_t l = 0; l < n; l++)
			nl_json_double(j, NULL, threshold[l]);
		nl_json_arr_end(j);
	}
}

/* ---- run ---- */

struct progress_ctx {
	struct nl_progress p;
	int pass;
	bool quiet;
};

static void run_progress(void *ctx, int pass, uint64_t done, uint64_t total)
{
	struct progress_ctx *pc = ctx;

	if (pc->pass != pass) {
		if (pc->pass)
			nl_progress_done(&pc->p, pc->p.total);
		nl_progress_init(&pc->p, pass == 1 ? "calibrating thresholds" : "profiling", total, "tokens",
				 pc->quiet);
		pc->pass = pass;
	}
	if (done == total)
		return;
	nl_progress_update(&pc->p, done);
}

static int cmd_run(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "tokenizer", required_argument, NULL, 't' },
		{ "dataset", required_argument, NULL, 'd' },
		{ "format", required_argument, NULL, OPT_FORMAT },
		{ "fields", required_argument, NULL, OPT_FIELDS },
		{ "split", required_argument, NULL, OPT_SPLIT },
		{ "sparsity", required_argument, NULL, OPT_SPARSITY },
		{ "density", required_argument, NULL, OPT_DENSITY },
		{ "ffn-act", required_argument, NULL, OPT_FFN_ACT },
		{ "samples", required_argument, NULL, OPT_SAMPLES },
		{ "max-tokens", required_argument, NULL, OPT_MAX_TOKENS },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "split-role", required_argument, NULL, OPT_ROLE },
		{ "test-fraction", required_argument, NULL, OPT_TEST_FRACTION },
		{ "threads", required_argument, NULL, 'j' },
		{ "output", required_argument, NULL, 'o' },
		{ "force", no_argument, NULL, 'f' },
		{ "compress", required_argument, NULL, OPT_COMPRESS },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	const char *model_path = NULL, *tok_path = NULL, *ds_path = NULL, *out = NULL;
	const char *format = NULL, *sparsity = NULL, *compress = "zstd";
	struct nl_dataset_opts dso = { 0 };
	struct nl_select_opts sel = { .n_samples = 1024, .seed = 0, .role = NL_SPLIT_TRAIN, .test_fraction = 0.2 };
	struct nl_prof_opts po = { .density = 0.3, .act = NL_FFN_SWIGLU };
	struct nl_prof_result res;
	struct progress_ctx pc = { 0 };
	struct nl_model *model = NULL;
	struct nl_vocab *vocab = NULL;
	struct nl_dataset *ds = NULL;
	const struct nl_model_config *cfg;
	uint32_t *idx = NULL;
	size_t n_idx = 0;
	bool force = false, json = false, quiet = false, density_set = false;
	char dataset_name[NL_NAME_MAX];
	double t0;
	int c, err;

	po.n_threads = nl_online_cpus();
	while ((c = getopt_long(argc, argv, "m:t:d:j:o:fqhV", longopts, NULL)) != -1) {
		switch (c) {
		case 'm': model_path = optarg; break;
		case 't': tok_path = optarg; break;
		case 'd': ds_path = optarg; break;
		case OPT_FORMAT: format = optarg; break;
		case OPT_FIELDS: dso.fields = optarg; break;
		case OPT_SPLIT: dso.separator = optarg; break;
		case OPT_SPARSITY: sparsity = optarg; break;
		case OPT_DENSITY:
			po.density = nl_parse_double(usage_run, "--density", optarg);
			density_set = true;
			if (!(po.density > 0 && po.density <= 1))
				nl_usage_error(usage_run, "--density: %s is out of range, expected 0 < D <= 1", optarg);
			break;
		case OPT_FFN_ACT:
			if (!strcmp(optarg, "silu") || !strcmp(optarg, "swiglu"))
				po.act = NL_FFN_SWIGLU;
			else if (!strcmp(optarg, "relu") || !strcmp(optarg, "reglu"))
				po.act = NL_FFN_RELU;
			else
				nl_usage_error(usage_run, "--ffn-act: '%s' is not silu or relu", optarg);
			break;
		case OPT_SAMPLES: sel.n_samples = nl_parse_u64(usage_run, "--samples", optarg); break;
		case OPT_MAX_TOKENS:
			po.max_tokens = (uint32_t)nl_parse_u64_in(usage_run, "--max-tokens", optarg, 0,
								  UINT32_MAX);
			break;
		case OPT_SEED: sel.seed = nl_parse_u64(usage_run, "--seed", optarg); break;
		case OPT_ROLE:
			if (nl_split_role_parse(&sel.role, optarg))
				nl_usage_error(usage_run, "--split-role: '%s' is not train, test or all", optarg);
			break;
		case OPT_TEST_FRACTION:
			sel.test_fraction = nl_parse_double(usage_run, "--test-fraction", optarg);
			if (!(sel.test_fraction > 0 && sel.test_fraction < 1))
				nl_usage_error(usage_run, "--test-fraction: %s is out of range, expected 0 < F < 1", optarg);
			break;
		case 'j': po.n_threads = parse_threads(usage_run, optarg); break;
		case 'o': out = optarg; break;
		case 'f': force = true; break;
		case OPT_COMPRESS: compress = optarg; break;
		case OPT_JSON: json = true; break;
		case 'q': quiet = true; break;
		case 'h': help_run(); return 0;
		case 'V': nl_print_version(); return 0;
		default: nl_usage_error(usage_run, "unknown or incomplete option");
		}
	}
	if (optind < argc)
		nl_usage_error(usage_run, "unexpected argument '%s'", argv[optind]);
	if (!model_path)
		nl_usage_error(usage_run, "-m/--model is required");
	if (!ds_path)
		nl_usage_error(usage_run, "-d/--dataset is required");
	if (dso.separator && !*dso.separator)
		nl_usage_error(usage_run, "--split: the separator is empty");
	if (!out)
		nl_usage_error(usage_run, "-o/--output is required");
	if (nl_h5_opts_parse(&po.h5, compress))
		nl_usage_error(usage_run, "--compress: %s", nl_diag_msg());
	if (format) {
		if (nl_ds_format_parse(&dso.format, format))
			nl_usage_error(usage_run, "--format: %s", nl_diag_msg());
	} else {
		const char *b = nl_base_name(ds_path);

		dso.format = strstr(b, ".jsonl") ? NL_DS_JSONL : strstr(b, ".json") ? NL_DS_JSON :
			     strstr(b, ".ids") ? NL_DS_IDS : NL_DS_TEXT;
	}
	if (sparsity) {
		if (nl_sparsity_parse(&po.sparsity, sparsity) || po.sparsity == NL_SPARSITY_IMPORTED)
			nl_usage_error(usage_run, "--sparsity: '%s' is not relu, threshold or topk", sparsity);
	} else {
		po.sparsity = po.act == NL_FFN_RELU ? NL_SPARSITY_RELU : NL_SPARSITY_THRESHOLD;
	}
	if (po.sparsity == NL_SPARSITY_RELU && density_set)
		nl_usage_error(usage_run, "--density does not apply to --sparsity relu (the zeros decide)");
	nl_check_output(out, force);

	err = nl_model_open(&model, model_path);
	if (err)
		nl_die_err(err, NULL);
	cfg = nl_model_get_config(model);
	if (dso.format != NL_DS_IDS) {
		if (tok_path)
			err = nl_vocab_open_llama2c(&vocab, tok_path, cfg->vocab_size);
		else if (cfg->source == NL_MODEL_GGUF)
			err = nl_vocab_open_gguf(&vocab, model_path);
		else
			nl_usage_error(usage_run, "-t/--tokenizer is required for llama2.c models with text datasets");
		if (err)
			nl_die_err(err, NULL);
	}
	if (po.sparsity == NL_SPARSITY_RELU && po.act != NL_FFN_RELU && !quiet)
		nl_warn("--sparsity relu with a SwiGLU model counts gate pre-activations > 0 (about half the neurons); use --ffn-act relu for ReLU-fied models");
	err = nl_dataset_open(&ds, ds_path, &dso);
	if (err)
		nl_die_err(err, NULL);
	err = nl_dataset_select(ds, &sel, &idx, &n_idx);
	if (err)
		nl_die_err(err, NULL);
	if (sel.n_samples && n_idx < sel.n_samples && !quiet)
		nl_warn("'%s' has %zu samples in the %s role, fewer than --samples %" PRIu64,
			ds_path, n_idx, nl_split_role_name(sel.role), sel.n_samples);
	snprintf(dataset_name, sizeof(dataset_name), "%s [%s %zu, seed %" PRIu64 "]", nl_base_name(ds_path),
		 nl_split_role_name(sel.role), n_idx, sel.seed);
	po.dataset_name = dataset_name;
	pc.quiet = quiet;
	po.progress = run_progress;
	po.progress_ctx = &pc;

	t0 = nl_now();
	err = nl_prof_run(model, vocab, ds, idx, n_idx, &po, out, &res);
	if (err)
		nl_die_err(err, NULL);
	if (pc.pass)
		nl_progress_done(&pc.p, res.n_tokens);

	if (json) {
		struct nl_json j;
		double secs = nl_now() - t0;

		nl_json_init(&j, stdout);
		nl_json_obj_begin(&j, NULL);
		nl_json_str(&j, "output", out);
		nl_json_str(&j, "model", cfg->name);
		nl_json_str(&j, "dataset", ds_path);
		nl_json_str(&j, "format", nl_ds_format_name(dso.format));
		nl_json_str(&j, "split_role", nl_split_role_name(sel.role));
		nl_json_str(&j, "sparsity", nl_sparsity_name(po.sparsity));
		nl_json_double(&j, "target_density", po.sparsity == NL_SPARSITY_RELU ? 0 : po.density);
		nl_json_u64(&j, "samples", res.n_samples);
		nl_json_u64(&j, "tokens", res.n_tokens);
		nl_json_u64(&j, "truncated_samples", res.n_truncated);
		nl_json_u64(&j, "layers", res.n_layers);
		nl_json_u64(&j, "neurons", res.n_neurons);
		nl_json_double(&j, "seconds", secs);
		nl_json_double(&j, "tokens_per_second", secs > 0 ? (double)res.n_tokens / secs : 0);
		json_layers(&j, res.density, res.threshold, res.n_layers);
		nl_json_obj_end(&j);
		nl_json_end(&j);
	} else {
		printf("%s: %s on %s, %" PRIu64 " samples (%s), %" PRIu64 " tokens, sparsity %s",
		       out, cfg->name, nl_base_name(ds_path), res.n_samples, nl_split_role_name(sel.role),
		       res.n_tokens, nl_sparsity_name(po.sparsity));
		if (po.sparsity != NL_SPARSITY_RELU)
			printf(" (target %.2f%%)", 100 * po.density);
		printf("\n");
		print_density_table(res.density, res.threshold, res.n_layers);
	}
	nl_prof_result_free(&res);
	free(idx);
	nl_dataset_free(ds);
	nl_vocab_free(vocab);
	nl_model_free(model);
	return 0;
}

/* ---- import ---- */

static int cmd_import(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "layers", required_argument, NULL, OPT_LAYERS },
		{ "sample-ids", required_argument, NULL, OPT_SAMPLE_IDS },
		{ "n-layers", required_argument, NULL, OPT_N_LAYERS },
		{ "threshold", required_argument, NULL, OPT_THRESHOLD },
		{ "model-name", required_argument, NULL, OPT_MODEL_NAME },
		{ "d-model", required_argument, NULL, OPT_D_MODEL },
		{ "dataset", required_argument, NULL, OPT_DATASET_NAME },
		{ "output", required_argument, NULL, 'o' },
		{ "force", no_argument, NULL, 'f' },
		{ "compress", required_argument, NULL, OPT_COMPRESS },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	const char *pattern = NULL, *out = NULL, *compress = "zstd", *model_name = NULL, *model_path = NULL;
	const char *dataset = "imported .npy", *sample_ids = NULL;
	uint64_t n_layers = 0, d_model = 0;
	double threshold = 0;
	bool force = false, json = false, quiet = false;
	struct nl_trace_meta meta;
	struct nl_h5_opts h5;
	char **paths = NULL;
	double *density;
	uint32_t n_paths = 0;
	int c, err;

	while ((c = getopt_long(argc, argv, "m:o:fqhV", longopts, NULL)) != -1) {
		switch (c) {
		case 'm': model_path = optarg; break;
		case OPT_LAYERS: pattern = optarg; break;
		case OPT_SAMPLE_IDS: sample_ids = optarg; break;
		case OPT_N_LAYERS:
			n_layers = nl_parse_u64_in(usage_import, "--n-layers", optarg, 1, NL_MAX_LAYERS);
			break;
		case OPT_THRESHOLD:
			threshold = nl_parse_double(usage_import, "--threshold", optarg);
			if (threshold < 0)
				nl_usage_error(usage_import, "--threshold: %s is negative", optarg);
			break;
		case OPT_MODEL_NAME: model_name = optarg; break;
		case OPT_D_MODEL: d_model = nl_parse_u64_in(usage_import, "--d-model", optarg, 1, UINT32_MAX); break;
		case OPT_DATASET_NAME: dataset = optarg; break;
		case 'o': out = optarg; break;
		case 'f': force = true; break;
		case OPT_COMPRESS: compress = optarg; break;
		case OPT_JSON: json = true; break;
		case 'q': quiet = true; break;
		case 'h': help_import(); return 0;
		case 'V': nl_print_version(); return 0;
		default: nl_usage_error(usage_import, "unknown or incomplete option");
		}
	}
	if (!out)
		nl_usage_error(usage_import, "-o/--output is required");
	if (pattern && optind < argc)
		nl_usage_error(usage_import, "give either --layers PATTERN or files, not both");
	if (!pattern && optind >= argc)
		nl_usage_error(usage_import, "no input: give --layers PATTERN or .npy files");
	if (nl_h5_opts_parse(&h5, compress))
		nl_usage_error(usage_import, "--compress: %s", nl_diag_msg());
	if (!model_path && !d_model)
		nl_usage_error(usage_import, "give the model (-m MODEL) or its hidden size (--d-model D)");
	if ((model_name && strlen(model_name) >= NL_NAME_MAX) || strlen(dataset) >= NL_NAME_MAX)
		nl_usage_error(usage_import, "--model-name/--dataset: at most %d characters", NL_NAME_MAX - 1);
	nl_check_output(out, force);

	paths = calloc(NL_MAX_LAYERS, sizeof(*paths));
	if (!paths)
		nl_die("out of memory");
	if (pattern) {
		const char *pct = strstr(pattern, "%d");

		if (!pct || strchr(pct + 2, '%') || (strchr(pattern, '%') != pct))
			nl_usage_error(usage_import, "--layers: '%s' needs exactly one %%d and no other %%", pattern);
		for (uint32_t l = 0; l < (n_layers ? n_layers : NL_MAX_LAYERS); l++) {
			char buf[4096];

			snprintf(buf, sizeof(buf), pattern, (int)l);
			if (!n_layers && access(buf, F_OK) != 0)
				break;
			paths[n_paths] = strdup(buf);
			if (!paths[n_paths++])
				nl_die("out of memory");
		}
		if (!n_paths) {
			char buf[4096];

			snprintf(buf, sizeof(buf), pattern, 0);
			nl_die("'%s': no such file (layer 0 of --layers '%s')", buf, pattern);
		}
	} else {
		if (argc - optind > NL_MAX_LAYERS)
			nl_usage_error(usage_import, "%d files, at most %d layers", argc - optind, NL_MAX_LAYERS);
		for (int i = optind; i < argc; i++)
			paths[n_paths++] = argv[i];
	}

	memset(&meta, 0, sizeof(meta));
	if (model_path) {
		struct nl_model *model;

		/* Only the identity is needed; the layer count and FFN size are checked against the files. */
		err = nl_model_open(&model, model_path);
		if (err)
			nl_die_err(err, NULL);
		nl_model_get_id(model, &meta.model);
		nl_model_free(model);
	} else {
		snprintf(meta.model.name, sizeof(meta.model.name), "imported");
	}
	if (model_name)
		snprintf(meta.model.name, sizeof(meta.model.name), "%s", model_name);
	if (d_model)
		meta.model.d_model = (uint32_t)d_model;
	snprintf(meta.dataset, sizeof(meta.dataset), "%s", dataset);
	density = calloc(n_paths, sizeof(*density));
	if (!density)
		nl_die("out of memory");
	if (!quiet)
		fprintf(stderr, "%s: importing %u layers\n", nl_cli_prog(), n_paths);
	err = nl_npy_import((const char *const *)paths, n_paths, threshold, sample_ids, &meta, &h5, out,
			    density);
	if (err)
		nl_die_err(err, NULL);
	if (json) {
		struct nl_json j;

		nl_json_init(&j, stdout);
		nl_json_obj_begin(&j, NULL);
		nl_json_str(&j, "output", out);
		nl_json_u64(&j, "layers", n_paths);
		nl_json_double(&j, "threshold", threshold);
		json_layers(&j, density, NULL, n_paths);
		nl_json_obj_end(&j);
		nl_json_end(&j);
	} else {
		printf("%s: %u layers imported\n", out, n_paths);
		print_density_table(density, NULL, n_paths);
	}
	if (pattern)
		for (uint32_t l = 0; l < n_paths; l++)
			free(paths[l]);
	free(paths);
	free(density);
	return 0;
}

/* ---- synth ---- */

struct synth_job {
	const struct nl_synth_params *p;
	uint32_t layer;
	struct nl_csr csr;
	int err;
	char msg[512];
	pthread_t thread;
	bool started;
};

static void *synth_thread(void *arg)
{
	struct synth_job *job = arg;

	job->err = nl_synth_layer(job->p, job->layer, &job->csr);
	if (job->err)
		snprintf(job->msg, sizeof(job->msg), "%s", nl_diag_msg());
	return NULL;
}

static int cmd_synth(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "shape", required_argument, NULL, OPT_SHAPE },
		{ "tokens", required_argument, NULL, OPT_TOKENS },
		{ "density", required_argument, NULL, OPT_DENSITY },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "zipf", required_argument, NULL, OPT_ZIPF },
		{ "group-size", required_argument, NULL, OPT_GROUP },
		{ "coherence", required_argument, NULL, OPT_COHERENCE },
		{ "noise", required_argument, NULL, OPT_NOISE },
		{ "token-seed", required_argument, NULL, OPT_TOKEN_SEED },
		{ "threads", required_argument, NULL, 'j' },
		{ "output", required_argument, NULL, 'o' },
		{ "force", no_argument, NULL, 'f' },
		{ "compress", required_argument, NULL, OPT_COMPRESS },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	struct nl_synth_params p;
	const char *shape = "opt-6.7b", *out = NULL, *compress = "zstd";
	uint32_t n_threads = nl_online_cpus();
	bool force = false, json = false, quiet = false;
	struct nl_trace_writer *w = NULL;
	struct nl_trace_meta meta;
	struct nl_h5_opts h5;
	struct nl_progress prog;
	struct synth_job *jobs;
	double *density;
	int c, err;

	nl_synth_defaults(&p);
	while ((c = getopt_long(argc, argv, "j:o:fqhV", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_SHAPE: shape = optarg; break;
		case OPT_TOKENS:
			p.n_tokens = nl_parse_u64_in(usage_synth, "--tokens", optarg, 1, 1ull << 32);
			break;
		case OPT_DENSITY: p.density = nl_parse_double(usage_synth, "--density", optarg); break;
		case OPT_SEED: p.seed = nl_parse_u64(usage_synth, "--seed", optarg); break;
		case OPT_ZIPF: p.zipf_s = nl_parse_double(usage_synth, "--zipf", optarg); break;
		case OPT_GROUP:
			p.group_size = (uint32_t)nl_parse_u64_in(usage_synth, "--group-size", optarg, 1,
								 UINT32_MAX);
			break;
		case OPT_COHERENCE: p.coherence = nl_parse_double(usage_synth, "--coherence", optarg); break;
		case OPT_NOISE: p.noise = nl_parse_double(usage_synth, "--noise", optarg); break;
		case OPT_TOKEN_SEED:
			p.token_seed = nl_parse_u64(usage_synth, "--token-seed", optarg);
			break;
		case 'j': n_threads = parse_threads(usage_synth, optarg); break;
		case 'o': out = optarg; break;
		case 'f': force = true; break;
		case OPT_COMPRESS: compress = optarg; break;
		case OPT_JSON: json = true; break;
		case 'q': quiet = true; break;
		case 'h': help_synth(); return 0;
		case 'V': nl_print_version(); return 0;
		default: nl_usage_error(usage_synth, "unknown or incomplete option");
		}
	}
	if (optind < argc)
		nl_usage_error(usage_synth, "unexpected argument '%s'", argv[optind]);
	if (!out)
		nl_usage_error(usage_synth, "-o/--output is required");
	if (nl_synth_shape(&p.model, shape))
		nl_usage_error(usage_synth, "--shape: %s", nl_diag_msg());
	if (nl_h5_opts_parse(&h5, compress))
		nl_usage_error(usage_synth, "--compress: %s", nl_diag_msg());
	/* Validate every parameter before touching the output. */
	{
		struct nl_synth_params probe = p;
		struct nl_csr csr;

		probe.n_tokens = 1;
		if ((err = nl_synth_layer(&probe, 0, &csr)))
			nl_usage_error(usage_synth, "%s", nl_diag_msg());
		nl_csr_free(&csr);
	}
	nl_check_output(out, force);

	memset(&meta, 0, sizeof(meta));
	meta.model = p.model;
	snprintf(meta.dataset, sizeof(meta.dataset),
		 "synthetic (seed %" PRIu64 ", token seed %" PRIu64 ", density %g, zipf %g, group %u, "
		 "coherence %g, noise %g)", p.seed, p.token_seed ? p.token_seed : p.seed, p.density,
		 p.zipf_s, p.group_size, p.coherence, p.noise);
	meta.sparsity = NL_SPARSITY_IMPORTED;
	meta.target_density = p.density;
	jobs = calloc(n_threads, sizeof(*jobs));
	density = calloc(p.model.n_layers, sizeof(*density));
	if (!jobs || !density)
		nl_die("out of memory");
	err = nl_trace_create(&w, out, &meta, &h5);
	if (err)
		nl_die_err(err, NULL);
	nl_progress_init(&prog, "synthesizing", p.model.n_layers, "layers", quiet);
	/* Batches of n_threads layers in parallel, written in layer order. */
	for (uint32_t l0 = 0; l0 < p.model.n_layers; l0 += n_threads) {
		uint32_t n = p.model.n_layers - l0 < n_threads ? p.model.n_layers - l0 : n_threads;

		for (uint32_t i = 0; i < n; i++) {
			jobs[i].p = &p;
			jobs[i].layer = l0 + i;
			jobs[i].started = !pthread_create(&jobs[i].thread, NULL, synth_thread, &jobs[i]);
			if (!jobs[i].started)
				synth_thread(&jobs[i]);
		}
		for (uint32_t i = 0; i < n; i++)
			if (jobs[i].started)
				pthread_join(jobs[i].thread, NULL);
		for (uint32_t i = 0; i < n; i++) {
			struct nl_csr *csr = &jobs[i].csr;

			if (!err && jobs[i].err) {
				err = jobs[i].err;
				nl_diag(err, "%s", jobs[i].msg);
			}
			if (!err) {
				density[l0 + i] = (double)csr->indptr[csr->n_tokens] /
						  ((double)csr->n_tokens * csr->n_neurons);
				err = nl_trace_write_layer(w, l0 + i, csr);
			}
			nl_csr_free(csr);
		}
		if (err) {
			nl_trace_abort(w);
			nl_die_err(err, NULL);
		}
		nl_progress_update(&prog, l0 + n);
	}
	err = nl_trace_finish(w, NULL);
	if (err)
		nl_die_err(err, NULL);
	nl_progress_done(&prog, p.model.n_layers);
	if (json) {
		struct nl_json j;

		nl_json_init(&j, stdout);
		nl_json_obj_begin(&j, NULL);
		nl_json_str(&j, "output", out);
		nl_json_str(&j, "model", p.model.name);
		nl_json_u64(&j, "layers", p.model.n_layers);
		nl_json_u64(&j, "neurons", p.model.n_neurons);
		nl_json_u64(&j, "tokens", p.n_tokens);
		nl_json_u64(&j, "seed", p.seed);
		json_layers(&j, density, NULL, p.model.n_layers);
		nl_json_obj_end(&j);
		nl_json_end(&j);
	} else {
		printf("%s: %s, %" PRIu64 " tokens (synthetic)\n", out, p.model.name, p.n_tokens);
		print_density_table(density, NULL, p.model.n_layers);
	}
	free(jobs);
	free(density);
	return 0;
}

int main(int argc, char **argv)
{
	const char *cmd;

	nl_cli_init("nl-profile");
	if (argc < 2)
		nl_usage_error(usage_main, "no command given");
	cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
		help_main();
		return 0;
	}
	if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version")) {
		nl_print_version();
		return 0;
	}
	/* getopt names argv[0] in its messages: make it the whole command. */
	if (!strcmp(cmd, "run")) {
		argv[1] = (char *)"nl-profile run";
		return cmd_run(argc - 1, argv + 1);
	}
	if (!strcmp(cmd, "import")) {
		argv[1] = (char *)"nl-profile import";
		return cmd_import(argc - 1, argv + 1);
	}
	if (!strcmp(cmd, "synth")) {
		argv[1] = (char *)"nl-profile synth";
		return cmd_synth(argc - 1, argv + 1);
	}
	nl_usage_error(usage_main, "unknown command '%s'", cmd);
}
