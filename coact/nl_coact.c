/*
 * Per-layer driver of the co-activation counting (Neuralink section 4.1):
 * input checks, f(i), the cost model that picks a kernel, top-K lists and the
 * additive merge of shards.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "nl_coact_internal.h"

/*
 * Cost model constants: single-core CPU seconds per operation, measured on
 * the development machine (AMD EPYC, Zen 4) with whole layers at the OPT and
 * Llama shapes of bench/coact; only their ratios decide the kernel. A pair
 * increment of the sparse kernel (u16 counter in an L2-resident square,
 * preparation included); one 64-bit AND + popcount of the bitset kernel in
 * each code path (transpose included), plus a per-active-id transpose term.
 */
#define COST_INCREMENT 0.63e-9
#define COST_WORD_AVX512 0.058e-9
#define COST_WORD_AVX2 0.18e-9
#define COST_WORD_SCALAR 1.7e-9
#define COST_TRANSPOSE 0.5e-9

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *nl_coact_kernel_name(enum nl_coact_kernel k)
{
	switch (k) {
	case NL_COACT_KERNEL_AUTO: return "auto";
	case NL_COACT_KERNEL_SPARSE: return "sparse";
	case NL_COACT_KERNEL_BITSET: return "bitset";
	}
	return "?";
}

int nl_coact_kernel_parse(enum nl_coact_kernel *k, const char *name)
{
	for (int i = NL_COACT_KERNEL_AUTO; i <= NL_COACT_KERNEL_BITSET; i++)
		if (name && strcmp(name, nl_coact_kernel_name(i)) == 0) {
			*k = i;
			return 0;
		}
	return nl_diag(NL_E_INVAL, "unknown kernel '%s', expected auto, sparse or bitset",
		       name ? name : "");
}

const char *nl_coact_simd_name(enum nl_coact_simd s)
{
	switch (s) {
	case NL_COACT_SIMD_AUTO: return "auto";
	case NL_COACT_SIMD_SCALAR: return "scalar";
	case NL_COACT_SIMD_AVX2: return "avx2";
	case NL_COACT_SIMD_AVX512: return "avx512";
	}
	return "?";
}

int nl_coact_simd_parse(enum nl_coact_simd *s, const char *name)
{
	for (int i = NL_COACT_SIMD_AUTO; i <= NL_COACT_SIMD_AVX512; i++)
		if (name && strcmp(name, nl_coact_simd_name(i)) == 0) {
			*s = i;
			return 0;
		}
	return nl_diag(NL_E_INVAL, "unknown instruction set '%s', expected auto, scalar, avx2 or avx512",
		       name ? name : "");
}

void nl_coact_opts_default(struct nl_coact_opts *opts)
{
	memset(opts, 0, sizeof(*opts));
	opts->kernel = NL_COACT_KERNEL_AUTO;
	opts->simd = NL_COACT_SIMD_AUTO;
	opts->k = 32;
	opts->keep_pairs = true;
	opts->rank = NL_COACT_RANK_NORM;
}

/* ---- threads ---- */

uint32_t nl_coact_threads(uint32_t n_threads)
{
	long online;

	if (n_threads)
		return n_threads;
	online = sysconf(_SC_NPROCESSORS_ONLN);
	return online > 0 ? (uint32_t)online : 1;
}

struct thread_arg {
	nl_coact_task_fn fn;
	void *ctx;
	uint32_t thread;
};

static void *thread_main(void *p)
{
	struct thread_arg *arg = p;

	arg->fn(arg->ctx, arg->thread);
	return NULL;
}

int nl_coact_run_threads(uint32_t n_threads, nl_coact_task_fn fn, void *ctx)
{
	pthread_t *tids = NULL;
	struct thread_arg *args = NULL;
	uint32_t started = 0;
	int ret = 0;

	if (n_threads > 1) {
		tids = calloc(n_threads, sizeof(*tids));
		args = calloc(n_threads, sizeof(*args));
		if (!tids || !args) {
			ret = -ENOMEM;
			goto out_free;
		}
	}
	/* Workers pull their work from shared atomic counters, so any number of
	 * started threads (even none) completes all of it. */
	for (uint32_t t = 1; t < n_threads; t++) {
		args[t] = (struct thread_arg){ fn, ctx, t };
		if (pthread_create(&tids[t], NULL, thread_main, &args[t]) != 0)
			break;
		started = t;
	}
	fn(ctx, 0);
	for (uint32_t t = 1; t <= started; t++)
		pthread_join(tids[t], NULL);
out_free:
	free(args);
	free(tids);
	if (ret == -ENOMEM) {
		/* Still do the work, on this thread alone. */
		fn(ctx, 0);
		ret = 0;
	}
	return ret;
}

/* ---- cost model ---- */

static double word_cost(enum nl_coact_simd simd)
{
	switch (simd) {
	case NL_COACT_SIMD_AVX512: return COST_WORD_AVX512;
	case NL_COACT_SIMD_AVX2: return COST_WORD_AVX2;
	default: return COST_WORD_SCALAR;
	}
}

void nl_coact_estimate(const struct nl_csr *csr, enum nl_coact_simd simd, struct nl_coact_info *info)
{
	uint64_t incs = 0, n = csr->n_neurons;
	uint64_t words = (csr->n_tokens + 63) / 64;
	uint64_t nnz = csr->n_tokens ? csr->indptr[csr->n_tokens] : 0;

	if (simd == NL_COACT_SIMD_AUTO)
		simd = nl_coact_simd_best();
	for (uint64_t t = 0; t < csr->n_tokens; t++) {
		uint64_t a = csr->indptr[t + 1] - csr->indptr[t];

		incs += a * (a ? a - 1 : 0) / 2;
	}
	info->pair_increments = incs;
	/* n rounded to 4-neuron groups, words to 8-word vectors; the kernel
	 * computes whole 4x4 groups, the diagonal ones included. */
	uint64_t n4 = (n + 3) / 4 * 4;
	info->bitset_words = (n4 * n4 / 2 + n4 * 2) * ((words + 7) / 8 * 8);
	info->cost_sparse = (double)incs * COST_INCREMENT;
	info->cost_bitset = (double)info->bitset_words * word_cost(simd) +
			    (double)nnz * COST_TRANSPOSE;
	info->simd = simd;
}

/* ---- f(i) and input checks ---- */

struct count_job {
	const struct nl_csr *csr;
	uint64_t **per_thread;    /* [threads][n] */
	atomic_uint next;
	/* First damaged token whatever the thread timing: the minimum of
	 * token * 2 + (0 id out of range, 1 not increasing); UINT64_MAX if none. */
	atomic_ullong bad;
};

#define COUNT_CHUNK 2048u

static void count_worker(void *ctx, uint32_t thread)
{
	struct count_job *job = ctx;
	const struct nl_csr *csr = job->csr;
	uint64_t *count = job->per_thread[thread];
	uint32_t n = csr->n_neurons;

	for (;;) {
		uint64_t t0 = (uint64_t)atomic_fetch_add(&job->next, 1) * COUNT_CHUNK;
		uint64_t t1 = t0 + COUNT_CHUNK < csr->n_tokens ? t0 + COUNT_CHUNK : csr->n_tokens;

		if (t0 >= csr->n_tokens)
			break;
		for (uint64_t t = t0; t < t1; t++) {
			uint64_t p0 = csr->indptr[t], p1 = csr->indptr[t + 1];
			int64_t prev = -1;

			for (uint64_t p = p0; p < p1; p++) {
				uint32_t id = csr->indices[p];

				if (id >= n || (int64_t)id <= prev) {
					unsigned long long code = t * 2 + (id >= n ? 0 : 1);
					unsigned long long old = atomic_load(&job->bad);

					while (code < old &&
					       !atomic_compare_exchange_weak(&job->bad, &old, code))
						;
					return;
				}
				prev = id;
				count[id]++;
			}
		}
	}
}

static int check_indptr(const struct nl_csr *csr)
{
	if (!csr->indptr || csr->indptr[0] != 0)
		return nl_diag(NL_E_FORMAT, "trace layer: indptr[0] is %llu, expected 0",
			       csr->indptr ? (unsigned long long)csr->indptr[0] : 0ull);
	for (uint64_t t = 0; t < csr->n_tokens; t++) {
		uint64_t len = csr->indptr[t + 1] - csr->indptr[t];

		if (csr->indptr[t + 1] < csr->indptr[t] || len > csr->n_neurons)
			return nl_diag(NL_E_FORMAT,
				       "trace layer: token %llu has indptr %llu..%llu, expected an increasing run of at most %u ids",
				       (unsigned long long)t, (unsigned long long)csr->indptr[t],
				       (unsigned long long)csr->indptr[t + 1], csr->n_neurons);
	}
	return 0;
}

static int count_singles(const struct nl_csr *csr, uint32_t threads, uint64_t *count)
{
	struct count_job job = { .csr = csr };
	uint32_t n = csr->n_neurons;
	int ret = 0;

	job.per_thread = calloc(threads, sizeof(*job.per_thread));
	if (!job.per_thread)
		return -ENOMEM;
	job.per_thread[0] = count;
	for (uint32_t t = 1; t < threads; t++) {
		job.per_thread[t] = calloc(n, sizeof(uint64_t));
		if (!job.per_thread[t]) {
			ret = -ENOMEM;
			goto out_free;
		}
	}
	atomic_init(&job.next, 0);
	atomic_init(&job.bad, UINT64_MAX);
	ret = nl_coact_run_threads(threads, count_worker, &job);
	if (ret < 0)
		goto out_free;
	for (uint32_t t = 1; t < threads; t++)
		for (uint32_t i = 0; i < n; i++)
			count[i] += job.per_thread[t][i];
	if (atomic_load(&job.bad) != UINT64_MAX) {
		unsigned long long t = atomic_load(&job.bad) / 2;

		if (atomic_load(&job.bad) % 2 == 0)
			ret = nl_diag(NL_E_FORMAT,
				      "trace layer: token %llu has an active id >= n_neurons (%u); the trace is damaged, re-run nl-profile",
				      t, n);
		else
			ret = nl_diag(NL_E_FORMAT,
				      "trace layer: token %llu has active ids not strictly increasing; expected sorted unique ids, re-run nl-profile",
				      t);
	}
out_free:
	for (uint32_t t = 1; t < threads; t++)
		free(job.per_thread[t]);
	free(job.per_thread);
	return ret;
}

/* ---- counting one layer ---- */

/* The triangle: 2 MiB aligned and backed by huge pages where the kernel
 * allows, which makes first touch several times cheaper. */
static uint32_t *alloc_pairs(uint32_t n)
{
	size_t bytes = (nl_tri_size(n) ? nl_tri_size(n) : 1) * sizeof(uint32_t);
	void *p = NULL;

	if (bytes >= (64u << 20)) {
		const size_t huge = 2u << 20;

		bytes = (bytes + huge - 1) / huge * huge;
		if (posix_memalign(&p, huge, bytes) != 0)
			return NULL;
		madvise(p, bytes, MADV_HUGEPAGE);   /* advice only: failure is harmless */
		return p;
	}
	return malloc(bytes);
}

int nl_coact_count_layer(const struct nl_csr *csr, const struct nl_coact_opts *opts,
			 struct nl_coact_layer *out, struct nl_coact_info *info)
{
	struct nl_coact_info local;
	struct nl_coact_opts defaults;
	enum nl_coact_kernel kernel;
	uint32_t n = csr->n_neurons, threads;
	uint32_t *reuse = NULL;
	bool need_pairs;
	double t0;
	int ret;

	if (!info)
		info = &local;
	if (!opts) {
		nl_coact_opts_default(&defaults);
		opts = &defaults;
	}
	/* Keep a previous result's triangle of the same size: a fresh 537 MB
	 * buffer costs ~1 s of page faults and zeroing per layer. */
	if (out->pairs && out->n_neurons == n && n > 1) {
		reuse = out->pairs;
		out->pairs = NULL;
	}
	nl_coact_layer_release(out);
	memset(info, 0, sizeof(*info));
	if (n == 0)
		return nl_diag(NL_E_INVAL, "trace layer has 0 neurons, expected at least 1");
	if (csr->n_tokens > UINT32_MAX)
		return nl_diag(NL_E_UNSUPPORTED,
			       "%llu tokens: pair counts are u32 and exact only up to %u tokens; split the trace (nl-profile --tokens) and count fewer tokens",
			       (unsigned long long)csr->n_tokens, UINT32_MAX);
	if (opts->simd != NL_COACT_SIMD_AUTO && !nl_coact_simd_supported(opts->simd))
		return nl_diag(NL_E_UNSUPPORTED, "the %s code path is not supported by this CPU; use auto",
			       nl_coact_simd_name(opts->simd));
	if (opts->k > 65536)
		return nl_diag(NL_E_INVAL, "top-K of %u is too large", opts->k);
	ret = check_indptr(csr);
	if (ret < 0)
		return ret;

	threads = nl_coact_threads(opts->n_threads);
	t0 = now_seconds();
	out->n_neurons = n;
	out->n_tokens = csr->n_tokens;
	out->count = calloc(n, sizeof(uint64_t));
	if (!out->count) {
		ret = nl_diag(-ENOMEM, "out of memory counting a layer of %u neurons", n);
		goto out_fail;
	}
	ret = count_singles(csr, threads, out->count);
	if (ret == -ENOMEM)
		nl_diag(ret, "out of memory counting a layer of %u neurons", n);
	if (ret < 0)
		goto out_fail;

	nl_coact_estimate(csr, opts->simd, info);
	kernel = opts->kernel;
	if (kernel == NL_COACT_KERNEL_AUTO)
		kernel = info->cost_sparse <= info->cost_bitset ? NL_COACT_KERNEL_SPARSE : NL_COACT_KERNEL_BITSET;
	info->kernel = kernel;

	need_pairs = opts->keep_pairs || opts->k > 0;
	if (need_pairs) {
		out->pairs = reuse ? reuse : alloc_pairs(n);
		reuse = NULL;
		if (!out->pairs) {
			ret = nl_diag(-ENOMEM, "out of memory for %u neurons: the pair triangle needs %llu MiB",
				      n, (unsigned long long)(nl_tri_size(n) * 4 >> 20));
			goto out_fail;
		}
		if (kernel == NL_COACT_KERNEL_SPARSE)
			ret = nl_coact_sparse_pairs(csr, out->pairs, opts->sparse_tile, threads);
		else
			ret = nl_coact_bitset_pairs(csr, out->pairs, info->simd, opts->bitset_words, threads);
		if (ret < 0)
			goto out_fail;
	}
	info->seconds_count = now_seconds() - t0;
	out->rank = opts->rank;

	if (opts->k > 0) {
		t0 = now_seconds();
		ret = nl_coact_topk_ranked(out, opts->k, opts->rank, threads);
		if (ret < 0)
			goto out_fail;
		info->seconds_topk = now_seconds() - t0;
	}
	if (!opts->keep_pairs) {
		free(out->pairs);
		out->pairs = NULL;
	}
	free(reuse);
	return 0;

out_fail:
	free(reuse);
	nl_coact_layer_release(out);
	return ret;
}

/* ---- top-K ---- */

struct topk_entry {
	uint32_t count;
	uint32_t id;
	uint64_t f;               /* f(id), for the norm ranking */
};

/* a ranks below b (nl_coact_rank_before(), for count > 0; empty slots are worst). */
static inline bool worse(enum nl_coact_rank rank, struct topk_entry a, struct topk_entry b)
{
	if (a.count == 0 || b.count == 0)
		return a.count < b.count || (a.count == b.count && a.id > b.id);
	return nl_coact_rank_before(rank, b.count, b.f, b.id, a.count, a.f, a.id);
}

/* Min-heap on `worse` of k entries: heap[0] is the one to evict. */
static inline void heap_offer(struct topk_entry *heap, uint32_t k, enum nl_coact_rank rank,
			      struct topk_entry e)
{
	uint32_t pos = 0;

	if (e.count == 0 || !worse(rank, heap[0], e))
		return;
	for (;;) {
		uint32_t l = 2 * pos + 1, r = l + 1, m = pos;
		struct topk_entry best = e;

		if (l < k && worse(rank, heap[l], best)) {
			m = l;
			best = heap[l];
		}
		if (r < k && worse(rank, heap[r], best))
			m = r;
		if (m == pos)
			break;
		heap[pos] = heap[m];
		pos = m;
	}
	heap[pos] = e;
}

/*
 * Norm ranking: a cheap floating-point filter in front of the exact heap.
 * score(j) = f(i,j)^2 / f(j) (f(i) is common to the row); a candidate whose
 * approximate score is below that of heap[0] by more than the relative
 * margin cannot beat it exactly (doubles err by a few ulp, ~1e-15), so it
 * is skipped; all others go through the exact comparison of heap_offer().
 */
#define NORM_MARGIN (1.0 - 1e-9)

static inline double norm_threshold(const struct topk_entry *heap, const double *inv_f)
{
	if (heap[0].count == 0)
		return -1.0;  /* a free slot: everything with count > 0 enters */
	return (double)heap[0].count * heap[0].count * inv_f[heap[0].id] * NORM_MARGIN;
}

struct topk_job {
	struct nl_coact_layer *layer;
	uint32_t k;
	enum nl_coact_rank rank;
	double *inv_f;            /* [n] 1 / f(j) (0 when f(j) = 0), norm ranking only */
	uint32_t *ids;
	uint32_t *counts;
	atomic_uint next;
	atomic_int failed;
};

#define TOPK_CHUNK 128u

static void topk_worker(void *ctx, uint32_t thread)
{
	struct topk_job *job = ctx;
	const struct nl_coact_layer *L = job->layer;
	const uint64_t *f = L->count;
	enum nl_coact_rank rank = job->rank;
	uint32_t n = L->n_neurons, k = job->k;
	const double *inv_f = job->inv_f;
	struct topk_entry *heaps = malloc((size_t)TOPK_CHUNK * k * sizeof(*heaps));
	double thr[TOPK_CHUNK];

	(void)thread;
	if (!heaps) {
		atomic_store(&job->failed, 1);
		return;
	}
	for (;;) {
		uint32_t a = atomic_fetch_add(&job->next, 1) * TOPK_CHUNK;

		if (a >= n)
			break;
		uint32_t b = a + TOPK_CHUNK < n ? a + TOPK_CHUNK : n;

		for (size_t e = 0; e < (size_t)(b - a) * k; e++)
			heaps[e] = (struct topk_entry){ 0, UINT32_MAX, 0 };
		for (uint32_t x = 0; x < b - a; x++)
			thr[x] = -1.0;
		/* Column part: f(r, j) for r < j, j in [a, b): row r's segment. */
		for (uint32_t r = 0; r + 1 < b; r++) {
			uint32_t c0 = a > r + 1 ? a : r + 1;
			const uint32_t *seg = L->pairs + nl_tri_index(n, r, c0);

			if (rank == NL_COACT_RANK_COUNT) {
				for (uint32_t j = c0; j < b; j++)
					if (seg[j - c0])
						heap_offer(heaps + (size_t)(j - a) * k, k, rank,
							   (struct topk_entry){ seg[j - c0], r, f[r] });
				continue;
			}
			for (uint32_t j = c0; j < b; j++) {
				uint32_t c = seg[j - c0];
				struct topk_entry *heap = heaps + (size_t)(j - a) * k;

				if (c && (double)c * c * inv_f[r] >= thr[j - a]) {
					heap_offer(heap, k, rank, (struct topk_entry){ c, r, f[r] });
					thr[j - a] = norm_threshold(heap, inv_f);
				}
			}
		}
		/* Row part: f(i, j) for j > i. */
		for (uint32_t i = a; i < b; i++) {
			struct topk_entry *heap = heaps + (size_t)(i - a) * k;

			if (i + 1 >= n)
				continue;
			const uint32_t *row = L->pairs + nl_tri_index(n, i, i + 1);

			if (rank == NL_COACT_RANK_COUNT) {
				for (uint32_t j = i + 1; j < n; j++) {
					uint32_t c = row[j - i - 1];

					/* Cheap rejection first: most candidates lose. Ids
					 * arrive in increasing order (the column part had
					 * the smaller ones), so an equal count never wins. */
					if (c > heap[0].count)
						heap_offer(heap, k, rank, (struct topk_entry){ c, j, f[j] });
				}
				continue;
			}
			double t = thr[i - a];

			for (uint32_t j = i + 1; j < n; j++) {
				uint32_t c = row[j - i - 1];

				if (c && (double)c * c * inv_f[j] >= t) {
					heap_offer(heap, k, rank, (struct topk_entry){ c, j, f[j] });
					t = norm_threshold(heap, inv_f);
				}
			}
		}
		/* Heap order to ranked order: insertion sort, k is small. */
		for (uint32_t i = a; i < b; i++) {
			struct topk_entry *h = heaps + (size_t)(i - a) * k;

			for (uint32_t x = 1; x < k; x++) {
				struct topk_entry e = h[x];
				uint32_t y = x;

				while (y > 0 && worse(rank, h[y - 1], e)) {
					h[y] = h[y - 1];
					y--;
				}
				h[y] = e;
			}
			for (uint32_t x = 0; x < k; x++) {
				job->ids[(size_t)i * k + x] = h[x].id;
				job->counts[(size_t)i * k + x] = h[x].count;
			}
		}
	}
	free(heaps);
}

int nl_coact_rank_parse(enum nl_coact_rank *rank, const char *name)
{
	if (name && strcmp(name, "count") == 0)
		*rank = NL_COACT_RANK_COUNT;
	else if (name && strcmp(name, "norm") == 0)
		*rank = NL_COACT_RANK_NORM;
	else
		return nl_diag(NL_E_INVAL, "top-K ranking '%s' unknown, expected count or norm",
			       name ? name : "(null)");
	return 0;
}

int nl_coact_topk(struct nl_coact_layer *layer, uint32_t k, uint32_t n_threads)
{
	return nl_coact_topk_ranked(layer, k, layer->rank, n_threads);
}

int nl_coact_topk_ranked(struct nl_coact_layer *layer, uint32_t k, enum nl_coact_rank rank,
			 uint32_t n_threads)
{
	struct topk_job job = { .layer = layer, .k = k, .rank = rank };
	uint32_t n = layer->n_neurons;
	int ret = 0;

	if (!layer->pairs && n > 1)
		return nl_diag(NL_E_MISSING, "top-K lists need the pair counts f(i,j), which are not loaded");
	if (k == 0 || k > 65536)
		return nl_diag(NL_E_INVAL, "top-K of %u neighbours: expected 1..65536", k);
	if (rank != NL_COACT_RANK_COUNT && rank != NL_COACT_RANK_NORM)
		return nl_diag(NL_E_INVAL, "top-K ranking %d unknown, expected count or norm", (int)rank);
	job.ids = malloc((size_t)n * k * sizeof(uint32_t));
	job.counts = malloc((size_t)n * k * sizeof(uint32_t));
	if (rank == NL_COACT_RANK_NORM) {
		job.inv_f = malloc((n ? n : 1) * sizeof(double));
		if (!job.inv_f) {
			ret = nl_diag(-ENOMEM, "out of memory for top-%u lists of %u neurons", k, n);
			goto out_free;
		}
		for (uint32_t j = 0; j < n; j++)
			job.inv_f[j] = layer->count[j] ? 1.0 / (double)layer->count[j] : 0.0;
	}
	if (!job.ids || !job.counts) {
		ret = nl_diag(-ENOMEM, "out of memory for top-%u lists of %u neurons", k, n);
		goto out_free;
	}
	atomic_init(&job.next, 0);
	atomic_init(&job.failed, 0);
	ret = nl_coact_run_threads(nl_coact_threads(n_threads), topk_worker, &job);
	if (ret == 0 && atomic_load(&job.failed)) {
		/* a thread lacked memory for its heaps; its share may be missing */
		ret = nl_diag(-ENOMEM, "out of memory for top-K heaps");
	}
	if (ret < 0)
		goto out_free;
	free(layer->topk_ids);
	free(layer->topk_counts);
	layer->topk_ids = job.ids;
	layer->topk_counts = job.counts;
	layer->k = k;
	layer->rank = rank;
	free(job.inv_f);
	return 0;

out_free:
	free(job.ids);
	free(job.counts);
	free(job.inv_f);
	return ret;
}

/* ---- merging shards ---- */

void nl_coact_layer_release(struct nl_coact_layer *layer)
{
	free(layer->count);
	free(layer->pairs);
	free(layer->topk_ids);
	free(layer->topk_counts);
	memset(layer, 0, sizeof(*layer));
}

int nl_coact_layer_add(struct nl_coact_layer *acc, const struct nl_coact_layer *add)
{
	uint32_t n = acc->n_neurons;

	if (add->n_neurons != n)
		return nl_diag(NL_E_MISMATCH, "layer has %u neurons in one input and %u in another",
			       add->n_neurons, n);
	if (acc->n_tokens + add->n_tokens > UINT32_MAX)
		return nl_diag(NL_E_UNSUPPORTED,
			       "%llu + %llu tokens: pair counts are u32 and exact only up to %u tokens; merge fewer shards",
			       (unsigned long long)acc->n_tokens, (unsigned long long)add->n_tokens,
			       UINT32_MAX);
	if (acc->pairs && !add->pairs && n > 1)
		return nl_diag(NL_E_MISSING, "an input has no pair counts, they cannot be summed");
	for (uint32_t i = 0; i < n; i++)
		acc->count[i] += add->count[i];
	if (acc->pairs && add->pairs) {
		uint64_t m = nl_tri_size(n);

		/* cannot overflow: f(i,j) <= n_tokens <= UINT32_MAX */
		for (uint64_t p = 0; p < m; p++)
			acc->pairs[p] += add->pairs[p];
	}
	acc->n_tokens += add->n_tokens;
	return 0;
}

int nl_coact_layer_copy(struct nl_coact_layer *dst, const struct nl_coact_layer *src, bool with_pairs)
{
	uint32_t n = src->n_neurons;
	size_t topk = (size_t)n * src->k;

	memset(dst, 0, sizeof(*dst));
	dst->n_neurons = n;
	dst->n_tokens = src->n_tokens;
	dst->k = src->k;
	dst->rank = src->rank;
	dst->count = malloc(n * sizeof(uint64_t));
	if (!dst->count)
		goto out_nomem;
	memcpy(dst->count, src->count, n * sizeof(uint64_t));
	if (with_pairs && src->pairs) {
		uint64_t m = nl_tri_size(n);

		dst->pairs = malloc((m ? m : 1) * sizeof(uint32_t));
		if (!dst->pairs)
			goto out_nomem;
		memcpy(dst->pairs, src->pairs, m * sizeof(uint32_t));
	}
	if (topk && src->topk_ids && src->topk_counts) {
		dst->topk_ids = malloc(topk * sizeof(uint32_t));
		dst->topk_counts = malloc(topk * sizeof(uint32_t));
		if (!dst->topk_ids || !dst->topk_counts)
			goto out_nomem;
		memcpy(dst->topk_ids, src->topk_ids, topk * sizeof(uint32_t));
		memcpy(dst->topk_counts, src->topk_counts, topk * sizeof(uint32_t));
	} else {
		dst->k = 0;
	}
	return 0;

out_nomem:
	nl_coact_layer_release(dst);
	return nl_diag(-ENOMEM, "out of memory copying a layer of %u neurons", n);
}
