/*
 * bench-coact: whole-model co-activation counting on synthetic traces at
 * OPT-6.7B shape (32 x 16384, ~3% active) and Llama-2-7B shape (32 x 11008,
 * ~25% active), 100,000 tokens, with each kernel's throughput set against
 * the machine's limit measured in the same run:
 *  - sparse kernel: pair increments/s vs a cache-resident random-increment
 *    loop (u16 counters, L1- and L2-sized, one array per thread);
 *  - bitset kernel: AND+popcount bit-ops/s vs a cache-resident AND+popcount
 *    loop over two L1-sized vectors (the best SIMD path, one per thread).
 * Trace generation is not timed; file writing is timed separately (--write).
 *
 *   bench-coact [--shape opt|llama|both] [--layers N] [--tokens T] [--topk K]
 *               [--kernel auto|sparse|bitset] [-j N] [--write DIR] [--per-layer]
 *               [--gen-layers G]
 * --layers N runs fewer layers for a quick look; --gen-layers G generates
 * only G distinct layers and cycles through them (the generator is slower
 * than counting; every layer has the same shape and statistics).
 */
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "nl_cli.h"
#include "nl_coact.h"
#include "nl_profile.h"

static const char usage[] =
	"Usage: bench-coact [--shape opt|llama|both] [--layers N] [--tokens T] [--topk K]\n"
	"                   [--kernel auto|sparse|bitset] [-j N] [--write DIR] [--per-layer]\n"
	"                   [--gen-layers G]\n";

/*
 * The machine is shared, so besides wall-clock times every throughput is
 * also given per CPU-second (thread CPU time for the baselines, process CPU
 * time for the kernels): the ratio kernel / limit then compares work done
 * per core-second on both sides, whatever else runs.
 */
static double cpu_now(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- baselines ---- */

struct base_job {
	int kind;              /* 0: random increments, 1: AND+popcount */
	size_t counters;       /* increments: u16 counters per thread */
	double seconds;
	uint64_t ops[64];      /* per thread */
	double cpu[64];        /* thread CPU seconds */
	uint64_t sink[64];
};

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Random increments into a private u16 array of job->counters entries; the
 * index stream is precomputed (L1/L2 resident too) so only the increments
 * are measured, 4 independent ones per step as in the kernel. */
static void base_increments(struct base_job *job, uint32_t thread)
{
	size_t n = job->counters, m = 16384;
	uint16_t *cnt = calloc(n, sizeof(uint16_t));
	uint32_t *idx = malloc(m * sizeof(uint32_t));
	uint64_t s = 0x1234567ull + thread, ops = 0;
	double t0;

	for (size_t q = 0; q < m; q++)
		idx[q] = (uint32_t)(xorshift(&s) % n);
	t0 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
	do {
		for (int rep = 0; rep < 16; rep++)
			for (size_t q = 0; q < m; q += 4) {
				cnt[idx[q]]++;
				cnt[idx[q + 1]]++;
				cnt[idx[q + 2]]++;
				cnt[idx[q + 3]]++;
			}
		ops += 16 * m;
	} while (cpu_now(CLOCK_THREAD_CPUTIME_ID) - t0 < job->seconds);
	job->cpu[thread] = cpu_now(CLOCK_THREAD_CPUTIME_ID) - t0;
	job->ops[thread] = ops;
	for (size_t q = 0; q < n; q++)
		job->sink[thread] += cnt[q];
	free(idx);
	free(cnt);
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512vpopcntdq")))
static uint64_t andpop_avx512(const uint64_t *a, const uint64_t *b, size_t words)
{
	__m512i acc0 = _mm512_setzero_si512(), acc1 = acc0;

	for (size_t w = 0; w < words; w += 16) {
		__m512i x0 = _mm512_and_si512(_mm512_loadu_si512(a + w), _mm512_loadu_si512(b + w));
		__m512i x1 = _mm512_and_si512(_mm512_loadu_si512(a + w + 8), _mm512_loadu_si512(b + w + 8));

		acc0 = _mm512_add_epi64(acc0, _mm512_popcnt_epi64(x0));
		acc1 = _mm512_add_epi64(acc1, _mm512_popcnt_epi64(x1));
	}
	return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(acc0, acc1));
}
#endif

static uint64_t andpop_scalar(const uint64_t *a, const uint64_t *b, size_t words)
{
	uint64_t s = 0;

	for (size_t w = 0; w < words; w++)
		s += (uint64_t)__builtin_popcountll(a[w] & b[w]);
	return s;
}

/* AND+popcount of two 8 KiB vectors (L1-resident), repeated. */
static void base_andpop(struct base_job *job, uint32_t thread)
{
	size_t words = 1024;
	uint64_t *a = aligned_alloc(64, words * 8), *b = aligned_alloc(64, words * 8);
	uint64_t s = 99 + thread, ops = 0, acc = 0;
	bool avx512 = nl_coact_simd_supported(NL_COACT_SIMD_AVX512);
	double t0;

	for (size_t w = 0; w < words; w++) {
		a[w] = xorshift(&s);
		b[w] = xorshift(&s);
	}
	t0 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
	do {
		for (int rep = 0; rep < 256; rep++) {
#if defined(__x86_64__)
			if (avx512)
				acc += andpop_avx512(a, b, words);
			else
#endif
				acc += andpop_scalar(a, b, words);
			a[rep % words] ^= acc;   /* keep the loop from being hoisted */
		}
		ops += 256 * words * 64;
	} while (cpu_now(CLOCK_THREAD_CPUTIME_ID) - t0 < job->seconds);
	(void)avx512;
	job->cpu[thread] = cpu_now(CLOCK_THREAD_CPUTIME_ID) - t0;
	job->ops[thread] = ops;
	job->sink[thread] = acc;
	free(a);
	free(b);
}

struct thread_arg {
	struct base_job *job;
	uint32_t thread;
};

static void *base_main(void *p)
{
	struct thread_arg *arg = p;

	if (arg->job->kind == 0)
		base_increments(arg->job, arg->thread);
	else
		base_andpop(arg->job, arg->thread);
	return NULL;
}

/* A baseline on `threads` threads at once: ops per wall second (all threads)
 * and ops per CPU-second (per core). */
static void run_baseline(int kind, size_t counters, uint32_t threads, double *wall_rate,
			 double *core_rate)
{
	struct base_job job = { .kind = kind, .counters = counters, .seconds = 1.0 };
	pthread_t tid[64];
	struct thread_arg args[64];
	uint64_t total = 0;
	double t0 = nl_now(), el, cpu = 0;

	if (threads > 64)
		threads = 64;
	for (uint32_t t = 0; t < threads; t++) {
		args[t] = (struct thread_arg){ &job, t };
		if (pthread_create(&tid[t], NULL, base_main, &args[t]) != 0)
			nl_die("cannot start baseline thread %u of %u", t + 1, threads);
	}
	for (uint32_t t = 0; t < threads; t++)
		pthread_join(tid[t], NULL);
	el = nl_now() - t0;
	for (uint32_t t = 0; t < threads; t++) {
		total += job.ops[t];
		cpu += job.cpu[t];
	}
	*wall_rate = (double)total / el;
	*core_rate = (double)total / cpu;
}

/* ---- the model run ---- */

struct shape_result {
	const char *shape;
	uint32_t layers;
	uint64_t tokens;
	double density;          /* achieved */
	uint32_t n;
	char kernels[16];        /* "sparse", "bitset" or "mixed" */
	double count_s, topk_s, write_s, gen_s;
	double count_cpu;        /* process CPU seconds of counting (top-K excluded) */
	uint64_t incs;           /* pair increments (sparse-kernel layers) */
	double sparse_s;
	double bits;             /* useful AND+popcount bit-ops (bitset-kernel layers) */
	double bitset_s;
};

static void run_shape(const char *shape, const char *spec, double density, uint32_t layers,
		      uint32_t gen_layers, uint64_t tokens, const struct nl_coact_opts *opts,
		      const char *write_dir, bool per_layer, struct shape_result *res)
{
	struct nl_csr *cache = NULL;
	struct nl_synth_params sp;
	struct nl_coact_writer *w = NULL;
	struct nl_coact_meta cm;
	char path[4096];
	int ret, kinds = 0;

	nl_synth_defaults(&sp);
	if (nl_synth_shape(&sp.model, spec) < 0)
		nl_die_err(-1, spec);
	sp.n_tokens = tokens;
	sp.density = density;
	if (layers > sp.model.n_layers)
		layers = sp.model.n_layers;
	memset(res, 0, sizeof(*res));
	res->shape = shape;
	res->layers = layers;
	res->tokens = tokens;
	res->n = sp.model.n_neurons;

	if (write_dir) {
		memset(&cm, 0, sizeof(cm));
		cm.model = sp.model;
		snprintf(cm.dataset, sizeof(cm.dataset), "synthetic");
		cm.layer_first = 0;
		cm.layer_count = layers;
		cm.n_tokens = tokens;
		cm.has_pairs = opts->keep_pairs;
		cm.k = opts->k;
		cm.rank = opts->rank;
		snprintf(path, sizeof(path), "%s/bench-coact-%s.h5", write_dir, shape);
		struct nl_h5_opts h5 = { .compress = NL_COMPRESS_ZSTD, .level = 1 };
		ret = nl_coact_create(&w, path, &cm, &h5);
		if (ret < 0)
			nl_die_err(ret, path);
	}
	if (per_layer)
		printf("| %s layer | density | kernel | count s | count CPU s | top-K s | write s | pair incr/s |\n|---|---|---|---|---|---|---|---|\n",
		       shape);
	uint64_t nnz = 0;
	struct nl_coact_layer stats = { 0 };   /* recycled: see nl_coact_count_layer() */
	struct nl_progress prog;

	nl_progress_init(&prog, shape, layers, "layers", per_layer);

	for (uint32_t l = 0; l < layers; l++) {
		struct nl_csr csr;
		struct nl_coact_info info;
		double t0 = nl_now(), ws = 0;

		if (gen_layers && l >= gen_layers) {
			csr = cache[l % gen_layers];   /* same shape and statistics, not regenerated */
		} else {
			ret = nl_synth_layer(&sp, l, &csr);
			if (ret < 0)
				nl_die_err(ret, "nl_synth_layer");
			res->gen_s += nl_now() - t0;
			if (gen_layers) {
				if (!cache)
					cache = calloc(gen_layers, sizeof(*cache));
				if (!cache)
					nl_die("out of memory");
				cache[l] = csr;
			}
		}
		nnz += csr.indptr[csr.n_tokens];
		double c0 = cpu_now(CLOCK_PROCESS_CPUTIME_ID);
		ret = nl_coact_count_layer(&csr, opts, &stats, &info);
		if (ret < 0)
			nl_die_err(ret, "nl_coact_count_layer");
		double cpu_s = cpu_now(CLOCK_PROCESS_CPUTIME_ID) - c0;
		/* top-K runs after counting: charge it its share of the CPU time */
		double count_cpu = cpu_s * info.seconds_count / (info.seconds_count + info.seconds_topk);
		res->count_s += info.seconds_count;
		res->topk_s += info.seconds_topk;
		res->count_cpu += count_cpu;
		if (info.kernel == NL_COACT_KERNEL_SPARSE) {
			res->incs += info.pair_increments;
			res->sparse_s += count_cpu;
			kinds |= 1;
		} else {
			res->bits += (double)res->n * (res->n - 1) / 2 * (double)tokens;
			res->bitset_s += count_cpu;
			kinds |= 2;
		}
		if (w) {
			t0 = nl_now();
			ret = nl_coact_write_layer(w, l, &stats);
			if (ret < 0)
				nl_die_err(ret, path);
			ws = nl_now() - t0;
			res->write_s += ws;
		}
		if (per_layer)
			printf("| %u | %.3f | %s | %.2f | %.2f | %.2f | %.2f | %.3g |\n", l,
			       (double)csr.indptr[csr.n_tokens] / ((double)tokens * res->n),
			       info.kernel == NL_COACT_KERNEL_SPARSE ? "sparse" : nl_coact_simd_name(info.simd),
			       info.seconds_count, count_cpu, info.seconds_topk, ws,
			       (double)info.pair_increments / info.seconds_count);
		fflush(stdout);
		if (!gen_layers)
			nl_csr_free(&csr);
		nl_progress_update(&prog, l + 1);
	}
	nl_coact_layer_free(&stats);
	for (uint32_t l = 0; cache && l < gen_layers && l < layers; l++)
		nl_csr_free(&cache[l]);
	free(cache);
	nl_progress_done(&prog, layers);
	if (w) {
		double t0 = nl_now();

		ret = nl_coact_finish(w);
		if (ret < 0)
			nl_die_err(ret, path);
		res->write_s += nl_now() - t0;
		unlink(path);
	}
	res->density = (double)nnz / ((double)tokens * res->n * layers);
	snprintf(res->kernels, sizeof(res->kernels), "%s",
		 kinds == 1 ? "sparse" : kinds == 2 ? "bitset" : "mixed");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "shape", required_argument, NULL, 's' },
		{ "layers", required_argument, NULL, 'L' },
		{ "tokens", required_argument, NULL, 'T' },
		{ "topk", required_argument, NULL, 'k' },
		{ "kernel", required_argument, NULL, 'K' },
		{ "threads", required_argument, NULL, 'j' },
		{ "write", required_argument, NULL, 'w' },
		{ "per-layer", no_argument, NULL, 'p' },
		{ "gen-layers", required_argument, NULL, 'g' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *shape = "both", *write_dir = NULL;
	uint32_t layers = 32, gen_layers = 0, threads;
	uint64_t tokens = 100000;
	bool per_layer = false;
	struct nl_coact_opts opts;
	int c;

	nl_cli_init("bench-coact");
	nl_coact_opts_default(&opts);
	opts.k = 0;
	opts.keep_pairs = true;
	while ((c = getopt_long(argc, argv, "j:h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			shape = optarg;
			if (strcmp(shape, "opt") && strcmp(shape, "llama") && strcmp(shape, "both"))
				nl_usage_error(usage, "--shape: '%s', expected opt, llama or both", shape);
			break;
		case 'L':
			layers = (uint32_t)nl_parse_u64(usage, "--layers", optarg);
			break;
		case 'T':
			tokens = nl_parse_u64(usage, "--tokens", optarg);
			break;
		case 'k':
			opts.k = (uint32_t)nl_parse_u64(usage, "--topk", optarg);
			break;
		case 'K':
			if (nl_coact_kernel_parse(&opts.kernel, optarg) < 0)
				nl_usage_error(usage, "--kernel: %s", nl_diag_msg());
			break;
		case 'j':
			opts.n_threads = (uint32_t)nl_parse_u64(usage, "--threads", optarg);
			break;
		case 'w':
			write_dir = optarg;
			break;
		case 'p':
			per_layer = true;
			break;
		case 'g':
			gen_layers = (uint32_t)nl_parse_u64(usage, "--gen-layers", optarg);
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			nl_usage_error(usage, "unknown option");
		}
	}
	if (layers == 0 || tokens == 0)
		nl_usage_error(usage, "--layers and --tokens must be positive");
	threads = opts.n_threads ? opts.n_threads : (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);

	printf("bench-coact: %u threads, best SIMD %s, %llu tokens, %u layers per shape, %s, %s\n\n",
	       threads, nl_coact_simd_name(nl_coact_simd_best()), (unsigned long long)tokens, layers,
	       opts.k ? "counting + top-K" : "counting only (no top-K)",
	       write_dir ? "file writing timed separately" : "no file writing");
	if (gen_layers)
		printf("(only the first %u layers are generated; later layers reuse them cyclically)\n\n",
		       gen_layers);
	fflush(stdout);

	struct shape_result res[2];
	int n_res = 0;

	if (strcmp(shape, "llama"))
		run_shape("OPT-6.7B", "opt-6.7b", 0.03, layers, gen_layers, tokens, &opts, write_dir, per_layer,
			  &res[n_res++]);
	if (strcmp(shape, "opt"))
		run_shape("Llama-2-7B", "llama-2-7b", 0.25, layers, gen_layers, tokens, &opts, write_dir, per_layer,
			  &res[n_res++]);

	/* Baselines right after the runs, on as many threads as the kernels. */
	double inc_l1, inc_l1_core, inc_l2, inc_l2_core, andpop, andpop_core;

	run_baseline(0, 8192, threads, &inc_l1, &inc_l1_core);         /* 16 KiB of u16 */
	run_baseline(0, 512 * 512, threads, &inc_l2, &inc_l2_core);    /* 512 KiB: a sparse square */
	run_baseline(1, 0, threads, &andpop, &andpop_core);

	printf("\nMachine limits, same run (%u threads; per core = per CPU-second):\n", threads);
	printf("- random u16 increments, L1-resident (16 KiB): %.3g/s per core, %.3g/s wall all threads\n",
	       inc_l1_core, inc_l1);
	printf("- random u16 increments, L2-resident (512 KiB): %.3g/s per core, %.3g/s wall all threads\n",
	       inc_l2_core, inc_l2);
	printf("- AND+popcount, L1-resident (2 x 8 KiB, %s): %.3g bit-ops/s per core, %.3g/s wall all threads\n\n",
	       nl_coact_simd_supported(NL_COACT_SIMD_AVX512) ? "avx512" : "scalar", andpop_core, andpop);
	printf("| shape | layers x neurons | density | kernel | count s/layer (wall) | top-K s/layer | total s (wall) | count CPU s/layer | write s/layer | kernel per core | limit per core | ratio |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < n_res; i++) {
		struct shape_result *r = &res[i];
		char thr[96], lim[96], ratio[96], topk[32], wr[32];

		if (r->sparse_s > 0 && r->bitset_s == 0) {
			double rate = (double)r->incs / r->sparse_s;

			snprintf(thr, sizeof(thr), "%.3g pair incr/s", rate);
			snprintf(lim, sizeof(lim), "%.3g (L1) / %.3g (L2)", inc_l1_core, inc_l2_core);
			snprintf(ratio, sizeof(ratio), "%.2f / %.2f", rate / inc_l1_core, rate / inc_l2_core);
		} else if (r->bitset_s > 0 && r->sparse_s == 0) {
			double rate = r->bits / r->bitset_s;

			snprintf(thr, sizeof(thr), "%.3g bit-ops/s", rate);
			snprintf(lim, sizeof(lim), "%.3g", andpop_core);
			snprintf(ratio, sizeof(ratio), "%.2f", rate / andpop_core);
		} else {
			snprintf(thr, sizeof(thr), "mixed kernels");
			snprintf(lim, sizeof(lim), "-");
			snprintf(ratio, sizeof(ratio), "-");
		}
		if (opts.k)
			snprintf(topk, sizeof(topk), "%.2f", r->topk_s / r->layers);
		else
			snprintf(topk, sizeof(topk), "not run");
		if (write_dir)
			snprintf(wr, sizeof(wr), "%.2f", r->write_s / r->layers);
		else
			snprintf(wr, sizeof(wr), "not run");
		printf("| %s | %u x %u | %.3f | %s | %.2f | %s | %.1f | %.2f | %s | %s | %s | %s |\n", r->shape,
		       r->layers, r->n, r->density, r->kernels, r->count_s / r->layers, topk,
		       r->count_s + r->topk_s, r->count_cpu / r->layers, wr, thr, lim, ratio);
	}
	printf("\n(total = counting%s over all layers; trace generation not included: ",
	       opts.k ? " + top-K" : "");
	for (int i = 0; i < n_res; i++)
		printf("%s%s %.1f s", i ? ", " : "", res[i].shape, res[i].gen_s);
	printf(")\n");
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) == 0)
		printf("peak resident memory: %.2f GiB (one layer's trace, statistics and kernel buffers at a time%s)\n",
		       (double)ru.ru_maxrss / (1 << 20),
		       gen_layers ? ", plus the cached generated layers" : "");
	return 0;
}
