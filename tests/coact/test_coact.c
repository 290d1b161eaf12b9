/*
 * coact suite: both counting kernels (and every bitset SIMD path) against a
 * brute-force count, top-K against a sort, merge exactness (sharded ==
 * unsharded) through real files, heatmap PNG read back with libpng, and the
 * nl-coact command line.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nl_coact.h"
#include "nl_formats.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	uint64_t x = rng_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	rng_state = x;
	return x;
}

/* Random CSR; density_pct per neuron, plus some empty and full tokens. */
static void make_csr(struct nl_csr *c, uint32_t n, uint64_t T, uint32_t density_pct, bool edges)
{
	uint64_t cap = T * n + 1;

	c->n_tokens = T;
	c->n_neurons = n;
	c->indptr = calloc(T + 1, sizeof(uint64_t));
	c->indices = malloc(cap * sizeof(uint32_t));
	cr_assert(c->indptr && c->indices);
	uint64_t nnz = 0;
	for (uint64_t t = 0; t < T; t++) {
		uint32_t mode = edges ? (uint32_t)(rnd() % 8) : 7;

		for (uint32_t i = 0; i < n; i++) {
			bool on;

			if (mode == 0)
				on = false;                  /* empty token */
			else if (mode == 1)
				on = true;                   /* all active */
			else
				on = rnd() % 100 < density_pct;
			if (on)
				c->indices[nnz++] = i;
		}
		c->indptr[t + 1] = nnz;
	}
}

static void free_csr(struct nl_csr *c)
{
	free(c->indptr);
	free(c->indices);
	memset(c, 0, sizeof(*c));
}

static uint32_t *brute_pairs(const struct nl_csr *c)
{
	uint32_t *p = calloc(nl_tri_size(c->n_neurons) + 1, sizeof(uint32_t));

	cr_assert(p);
	for (uint64_t t = 0; t < c->n_tokens; t++)
		for (uint64_t a = c->indptr[t]; a < c->indptr[t + 1]; a++)
			for (uint64_t b = a + 1; b < c->indptr[t + 1]; b++)
				p[nl_tri_index(c->n_neurons, c->indices[a], c->indices[b])]++;
	return p;
}

static void check_layer(const struct nl_csr *c, const struct nl_coact_layer *L, const uint32_t *ref,
			const char *what)
{
	cr_assert_eq(L->n_neurons, c->n_neurons, "%s", what);
	cr_assert_eq(L->n_tokens, c->n_tokens, "%s", what);
	for (uint32_t i = 0; i < c->n_neurons; i++) {
		uint64_t f = 0;

		for (uint64_t p = 0; p < c->indptr[c->n_tokens]; p++)
			f += c->indices[p] == i;
		cr_assert_eq(L->count[i], f, "%s: f(%u) = %llu, expected %llu", what, i,
			     (unsigned long long)L->count[i], (unsigned long long)f);
	}
	for (uint64_t q = 0; q < nl_tri_size(c->n_neurons); q++)
		if (L->pairs[q] != ref[q])
			cr_assert_fail("%s: pair index %llu = %u, expected %u", what,
				       (unsigned long long)q, L->pairs[q], ref[q]);
}

static void layer_release(struct nl_coact_layer *L)
{
	free(L->count);
	free(L->pairs);
	free(L->topk_ids);
	free(L->topk_counts);
	memset(L, 0, sizeof(*L));
}

/* Every kernel configuration on one input, against brute force. */
static void check_all_kernels(const struct nl_csr *c, const char *what)
{
	uint32_t *ref = brute_pairs(c);
	static const uint32_t tiles[] = { 0, 1, 7, 64, 100 };
	static const uint32_t threads[] = { 1, 3 };
	char label[256];
	/* One result reused for every configuration: the triangle buffer is
	 * recycled with stale counts, which the kernels must overwrite. */
	struct nl_coact_layer L = { 0 };

	for (size_t ti = 0; ti < sizeof(threads) / sizeof(threads[0]); ti++) {
		for (size_t k = 0; k < sizeof(tiles) / sizeof(tiles[0]); k++) {
			struct nl_coact_opts o;
			struct nl_coact_info info;

			nl_coact_opts_default(&o);
			o.kernel = NL_COACT_KERNEL_SPARSE;
			o.k = 0;
			o.sparse_tile = tiles[k];
			o.n_threads = threads[ti];
			snprintf(label, sizeof(label), "%s sparse tile %u threads %u", what, tiles[k], threads[ti]);
			cr_assert_eq(nl_coact_count_layer(c, &o, &L, &info), 0, "%s: %s", label, nl_diag_msg());
			cr_assert_eq(info.kernel, NL_COACT_KERNEL_SPARSE);
			check_layer(c, &L, ref, label);
		}
		for (int s = NL_COACT_SIMD_SCALAR; s <= NL_COACT_SIMD_AVX512; s++) {
			static const uint32_t words[] = { 0, 8, 16 };

			if (!nl_coact_simd_supported(s)) {
				cr_log_warn("%s: %s path not supported on this CPU, not tested", what,
					    nl_coact_simd_name(s));
				continue;
			}
			for (size_t wi = 0; wi < 3; wi++) {
				struct nl_coact_opts o;
				struct nl_coact_info info;

				nl_coact_opts_default(&o);
				o.kernel = NL_COACT_KERNEL_BITSET;
				o.simd = s;
				o.k = 0;
				o.bitset_words = words[wi];
				o.n_threads = threads[ti];
				snprintf(label, sizeof(label), "%s bitset %s words %u threads %u", what,
					 nl_coact_simd_name(s), words[wi], threads[ti]);
				cr_assert_eq(nl_coact_count_layer(c, &o, &L, &info), 0, "%s: %s", label,
					     nl_diag_msg());
				cr_assert_eq(info.kernel, NL_COACT_KERNEL_BITSET);
				cr_assert_eq(info.simd, s);
				check_layer(c, &L, ref, label);
			}
		}
	}
	layer_release(&L);
	free(ref);
}

/* ---- kernels ---- */

Test(kernels, random_small)
{
	static const uint32_t ns[] = { 1, 2, 3, 5, 63, 64, 65, 130 };
	static const uint64_t Ts[] = { 0, 1, 63, 64, 65, 300 };

	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
		for (size_t b = 0; b < sizeof(Ts) / sizeof(Ts[0]); b++) {
			struct nl_csr c;
			char what[64];

			make_csr(&c, ns[a], Ts[b], 20, true);
			snprintf(what, sizeof(what), "n=%u T=%llu", ns[a], (unsigned long long)Ts[b]);
			check_all_kernels(&c, what);
			free_csr(&c);
		}
}

Test(kernels, dense_and_sparse_densities)
{
	static const uint32_t dens[] = { 0, 3, 50, 100 };

	for (size_t d = 0; d < 4; d++) {
		struct nl_csr c;
		char what[64];

		make_csr(&c, 211, 517, dens[d], false);
		snprintf(what, sizeof(what), "density %u%%", dens[d]);
		check_all_kernels(&c, what);
		free_csr(&c);
	}
}

/* More than 65535 tokens: the sparse kernel's u16 squares must flush. */
Test(kernels, many_tokens_flush)
{
	struct nl_csr c;

	make_csr(&c, 6, 70001, 100, false);
	uint32_t *ref = brute_pairs(&c);
	for (int k = NL_COACT_KERNEL_SPARSE; k <= NL_COACT_KERNEL_BITSET; k++) {
		struct nl_coact_opts o;
		struct nl_coact_layer L = { 0 };

		nl_coact_opts_default(&o);
		o.kernel = k;
		o.k = 0;
		o.n_threads = 2;
		cr_assert_eq(nl_coact_count_layer(&c, &o, &L, NULL), 0, "%s", nl_diag_msg());
		cr_assert_eq(L.pairs[0], 70001u);
		check_layer(&c, &L, ref, nl_coact_kernel_name(k));
		layer_release(&L);
	}
	free(ref);
	free_csr(&c);
}

Test(kernels, auto_picks_by_cost)
{
	struct nl_csr sparse, dense;
	struct nl_coact_info info;

	make_csr(&sparse, 2000, 200, 1, false);
	make_csr(&dense, 300, 200, 60, false);
	nl_coact_estimate(&sparse, NL_COACT_SIMD_AUTO, &info);
	cr_assert_lt(info.cost_sparse, info.cost_bitset, "1%% active should favour sparse");
	nl_coact_estimate(&dense, NL_COACT_SIMD_AUTO, &info);
	cr_assert_gt(info.cost_sparse, info.cost_bitset, "60%% active should favour bitset");

	struct nl_coact_opts o;
	struct nl_coact_layer L = { 0 };

	nl_coact_opts_default(&o);
	o.k = 0;
	cr_assert_eq(nl_coact_count_layer(&sparse, &o, &L, &info), 0);
	cr_assert_eq(info.kernel, NL_COACT_KERNEL_SPARSE);
	layer_release(&L);
	cr_assert_eq(nl_coact_count_layer(&dense, &o, &L, &info), 0);
	cr_assert_eq(info.kernel, NL_COACT_KERNEL_BITSET);
	layer_release(&L);
	free_csr(&sparse);
	free_csr(&dense);
}

Test(kernels, rejects_bad_input)
{
	struct nl_csr c;
	struct nl_coact_layer L = { 0 };
	struct nl_coact_opts o;

	nl_coact_opts_default(&o);
	make_csr(&c, 10, 5, 50, false);
	/* id out of range */
	uint32_t saved = c.indices[0];
	c.indices[0] = 10;
	cr_assert_eq(nl_coact_count_layer(&c, &o, &L, NULL), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "n_neurons"), "%s", nl_diag_msg());
	c.indices[0] = saved;
	/* not increasing: duplicate the first id of a token with >= 2 ids */
	for (uint64_t t = 0; t < c.n_tokens; t++)
		if (c.indptr[t + 1] - c.indptr[t] >= 2) {
			c.indices[c.indptr[t] + 1] = c.indices[c.indptr[t]];
			break;
		}
	cr_assert_eq(nl_coact_count_layer(&c, &o, &L, NULL), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "increasing"), "%s", nl_diag_msg());
	free_csr(&c);

	/* more tokens than u32 counters can hold: refused before any access */
	uint64_t indptr[2] = { 0, 0 };
	struct nl_csr huge = { .n_tokens = (uint64_t)UINT32_MAX + 1, .n_neurons = 4, .indptr = indptr };

	cr_assert_eq(nl_coact_count_layer(&huge, &o, &L, NULL), NL_E_UNSUPPORTED);
	cr_assert(strstr(nl_diag_msg(), "4294967295"), "%s", nl_diag_msg());

	struct nl_coact_layer a = { .n_neurons = 1, .n_tokens = UINT32_MAX, .count = (uint64_t[]){ 1 } };
	struct nl_coact_layer b = { .n_neurons = 1, .n_tokens = 1, .count = (uint64_t[]){ 1 } };
	cr_assert_eq(nl_coact_layer_add(&a, &b), NL_E_UNSUPPORTED);
	struct nl_coact_layer d = { .n_neurons = 2, .n_tokens = 1, .count = (uint64_t[]){ 1, 1 } };
	cr_assert_eq(nl_coact_layer_add(&a, &d), NL_E_MISMATCH);
}

/*
 * The diagnostic names the first damaged token whatever the thread count and
 * timing: two chunks of 2048 full tokens, chunk 0 damaged at its last id,
 * chunk 1 at its first, which another thread reaches first.
 */
Test(kernels, first_bad_token_deterministic)
{
	const uint64_t T = 2 * 2048;
	const uint32_t n = 1024;
	struct nl_csr c = { .n_tokens = T, .n_neurons = n };
	struct nl_coact_layer L = { 0 };
	struct nl_coact_opts o;

	c.indptr = malloc((T + 1) * sizeof(uint64_t));
	c.indices = malloc(T * n * sizeof(uint32_t));
	cr_assert(c.indptr && c.indices);
	for (uint64_t t = 0; t <= T; t++)
		c.indptr[t] = n * t;
	for (uint64_t t = 0; t < T; t++)
		for (uint32_t i = 0; i < n; i++)
			c.indices[n * t + i] = i;
	c.indices[n * 2047 + n - 1] = n - 2;                  /* not increasing */
	c.indices[n * 2048] = n;                              /* out of range */
	nl_coact_opts_default(&o);
	for (int rep = 0; rep < 12; rep++) {
		o.n_threads = 1 + rep % 4;
		cr_assert_eq(nl_coact_count_layer(&c, &o, &L, NULL), NL_E_FORMAT);
		cr_assert(strstr(nl_diag_msg(), "token 2047 has active ids not strictly increasing"),
			  "threads %u: %s", o.n_threads, nl_diag_msg());
	}
	nl_coact_layer_free(&L);
	free(c.indptr);
	free(c.indices);
}

/* ---- top-K ---- */

struct cand {
	uint32_t id, count;
	uint64_t fi, fj;          /* f(i), f(j): the norm score is count / sqrt(fi fj) */
	bool norm;
};

/*
 * Brute-force reference order, written from the definition: the norm score
 * c / sqrt(fi fj) compared exactly as c_a^2 fi fj_b vs c_b^2 fi fj_a (the
 * test's counts are small, so these products fit u64), then count
 * descending, then id ascending.
 */
static int cand_cmp(const void *x, const void *y)
{
	const struct cand *a = x, *b = y;

	if (a->norm) {
		uint64_t sa = (uint64_t)a->count * a->count * a->fi * b->fj;
		uint64_t sb = (uint64_t)b->count * b->count * b->fi * a->fj;

		if (sa != sb)
			return sa > sb ? -1 : 1;
	}
	if (a->count != b->count)
		return a->count > b->count ? -1 : 1;
	return a->id < b->id ? -1 : a->id > b->id;
}

static void check_topk(const struct nl_coact_layer *L, uint32_t k)
{
	uint32_t n = L->n_neurons;
	struct cand *c = malloc(n * sizeof(*c));

	cr_assert_eq(L->k, k);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t m = 0;

		for (uint32_t j = 0; j < n; j++) {
			if (j == i)
				continue;
			uint32_t f = L->pairs[i < j ? nl_tri_index(n, i, j) : nl_tri_index(n, j, i)];

			if (f)
				c[m++] = (struct cand){ j, f, L->count[i], L->count[j],
							L->rank == NL_COACT_RANK_NORM };
		}
		qsort(c, m, sizeof(*c), cand_cmp);
		for (uint32_t x = 0; x < k; x++) {
			uint32_t id = x < m ? c[x].id : UINT32_MAX, cnt = x < m ? c[x].count : 0;

			cr_assert_eq(L->topk_ids[(size_t)i * k + x], id, "neuron %u slot %u: id %u, expected %u",
				     i, x, L->topk_ids[(size_t)i * k + x], id);
			cr_assert_eq(L->topk_counts[(size_t)i * k + x], cnt);
		}
	}
	free(c);
}

Test(topk, matches_sort_with_ties)
{
	static const uint32_t ks[] = { 1, 3, 8, 300 };
	struct nl_csr c;

	/* few tokens: many equal counts and scores, so the ties matter */
	make_csr(&c, 257, 9, 30, true);
	for (size_t q = 0; q < 8; q++) {
		struct nl_coact_opts o;
		struct nl_coact_layer L = { 0 };

		nl_coact_opts_default(&o);
		cr_assert_eq(o.rank, NL_COACT_RANK_NORM, "the default ranking is norm");
		o.k = ks[q % 4];
		o.rank = q < 4 ? NL_COACT_RANK_NORM : NL_COACT_RANK_COUNT;
		o.n_threads = 2;
		cr_assert_eq(nl_coact_count_layer(&c, &o, &L, NULL), 0, "%s", nl_diag_msg());
		cr_assert_eq(L.rank, o.rank);
		check_topk(&L, ks[q % 4]);
		/* re-ranking in place gives the other ranking's lists */
		cr_assert_eq(nl_coact_topk_ranked(&L, ks[q % 4], q < 4 ? NL_COACT_RANK_COUNT :
						  NL_COACT_RANK_NORM, 1), 0, "%s", nl_diag_msg());
		check_topk(&L, ks[q % 4]);
		layer_release(&L);
	}
	free_csr(&c);
}

/* On skewed frequencies count-ranked lists crowd onto the hottest neurons. */
Test(topk, norm_spreads_over_skewed_data)
{
	enum { N = 200, T = 3000, K = 4 };
	struct nl_csr c;
	struct nl_coact_opts o;
	struct nl_coact_layer L = { 0 };
	uint32_t distinct[2];
	uint64_t state = 12345;
	uint32_t *ids = malloc((size_t)T * N * sizeof(*ids));
	uint64_t *indptr = calloc(T + 1, sizeof(*indptr));

	/* neurons 0..9 hot (p = 0.95), the others alone at p = 0.05; and pairs
	 * (2m, 2m+1) fire together at p = 0.05 */
	for (uint32_t t = 0; t < T; t++) {
		uint64_t at = indptr[t];

		for (uint32_t j = 0; j < N; j += 2) {
			bool both, a, b;

			state = state * 6364136223846793005ull + 1442695040888963407ull;
			both = (state >> 33) % 100 < 5;
			state = state * 6364136223846793005ull + 1442695040888963407ull;
			a = both || (state >> 33) % 100 < (j < 10 ? 95u : 5u);
			state = state * 6364136223846793005ull + 1442695040888963407ull;
			b = both || (state >> 40) % 100 < (j + 1 < 10 ? 95u : 5u);
			if (a)
				ids[at++] = j;
			if (b)
				ids[at++] = j + 1;
		}
		indptr[t + 1] = at;
	}
	c = (struct nl_csr){ .n_tokens = T, .n_neurons = N, .indptr = indptr, .indices = ids };
	for (int r = 0; r < 2; r++) {
		bool seen[N] = { false };

		nl_coact_opts_default(&o);
		o.k = K;
		o.rank = r ? NL_COACT_RANK_NORM : NL_COACT_RANK_COUNT;
		cr_assert_eq(nl_coact_count_layer(&c, &o, &L, NULL), 0, "%s", nl_diag_msg());
		check_topk(&L, K);
		distinct[r] = 0;
		for (uint32_t i = 0; i < N * K; i += K)     /* first neighbours */
			if (L.topk_ids[i] != UINT32_MAX && !seen[L.topk_ids[i]]) {
				seen[L.topk_ids[i]] = true;
				distinct[r]++;
			}
		/* norm: every cold neuron's first neighbour is its partner */
		if (r)
			for (uint32_t i = 10; i < N; i++)
				cr_assert_eq(L.topk_ids[(size_t)i * K], i ^ 1u, "neuron %u", i);
		layer_release(&L);
	}
	cr_assert_gt(distinct[1], 4 * distinct[0], "distinct first neighbours: norm %u, count %u",
		     distinct[1], distinct[0]);
	free(ids);
	free(indptr);
}

Test(topk, without_pairs_keeps_lists)
{
	struct nl_csr c;
	struct nl_coact_opts o;
	struct nl_coact_layer L = { 0 }, M = { 0 };

	make_csr(&c, 40, 50, 40, false);
	nl_coact_opts_default(&o);
	o.k = 5;
	cr_assert_eq(nl_coact_count_layer(&c, &o, &L, NULL), 0);
	o.keep_pairs = false;
	cr_assert_eq(nl_coact_count_layer(&c, &o, &M, NULL), 0);
	cr_assert_null(M.pairs);
	cr_assert_arr_eq(L.topk_ids, M.topk_ids, 40 * 5 * sizeof(uint32_t));
	cr_assert_arr_eq(L.topk_counts, M.topk_counts, 40 * 5 * sizeof(uint32_t));
	layer_release(&L);
	layer_release(&M);
	free_csr(&c);
}

/* ---- heatmap ---- */

static char tmpdir[256];

static void make_tmpdir(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/nl-coact-test-XXXXXX");
	cr_assert_not_null(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	cr_assert_eq(system(cmd), 0);
}

static void read_png_size(const char *path, uint32_t *w, uint32_t *h, uint8_t *first_rgb)
{
	png_image img;

	memset(&img, 0, sizeof(img));
	img.version = PNG_IMAGE_VERSION;
	cr_assert(png_image_begin_read_from_file(&img, path), "%s: %s", path, img.message);
	*w = img.width;
	*h = img.height;
	img.format = PNG_FORMAT_RGB;
	uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
	cr_assert(png_image_finish_read(&img, NULL, buf, 0, NULL), "%s: %s", path, img.message);
	memcpy(first_rgb, buf, 3);
	free(buf);
}

Test(heatmap, png_dimensions_and_reorder, .init = make_tmpdir, .fini = remove_tmpdir)
{
	struct nl_csr c;
	struct nl_coact_opts o;
	struct nl_coact_layer L = { 0 };
	struct nl_coact_heat_opts h;
	uint8_t *rgb, px[3];
	uint32_t side, w, ht;
	char path[512];

	make_csr(&c, 300, 200, 10, true);
	nl_coact_opts_default(&o);
	o.k = 0;
	cr_assert_eq(nl_coact_count_layer(&c, &o, &L, NULL), 0);
	nl_coact_heat_opts_default(&h);
	h.min_px = 0;

	/* full resolution */
	cr_assert_eq(nl_coact_heatmap(&L, NULL, &h, &rgb, &side), 0, "%s", nl_diag_msg());
	cr_assert_eq(side, 300);
	snprintf(path, sizeof(path), "%s/full.png", tmpdir);
	cr_assert_eq(nl_coact_png_write(path, rgb, side, side), 0, "%s", nl_diag_msg());
	read_png_size(path, &w, &ht, px);
	cr_assert_eq(w, 300);
	cr_assert_eq(ht, 300);
	cr_assert_arr_eq(px, rgb, 3);
	free(rgb);

	/* block-averaged, log scale, probabilities */
	h.max_px = 64;
	h.scale = NL_COACT_HEAT_LOG;
	h.value = NL_COACT_HEAT_PROB;
	cr_assert_eq(nl_coact_heatmap(&L, NULL, &h, &rgb, &side), 0);
	cr_assert_eq(side, 64);
	snprintf(path, sizeof(path), "%s/small.png", tmpdir);
	cr_assert_eq(nl_coact_png_write(path, rgb, side, side), 0);
	read_png_size(path, &w, &ht, px);
	cr_assert_eq(w, 64);
	cr_assert_eq(ht, 64);
	free(rgb);

	/* reordered: pixel (0,0) shows neuron perm[0] on the diagonal */
	uint32_t *perm = malloc(300 * sizeof(uint32_t));
	for (uint32_t p = 0; p < 300; p++)
		perm[p] = 299 - p;
	nl_coact_heat_opts_default(&h);
	h.min_px = 0;
	uint8_t *a, *b;
	cr_assert_eq(nl_coact_heatmap(&L, NULL, &h, &a, &side), 0);
	cr_assert_eq(nl_coact_heatmap(&L, perm, &h, &b, &side), 0);
	for (uint32_t y = 0; y < 300; y += 37)
		for (uint32_t x = 0; x < 300; x += 41)
			cr_assert_arr_eq(a + ((size_t)y * 300 + x) * 3,
					 b + ((size_t)(299 - y) * 300 + (299 - x)) * 3, 3);
	free(a);
	/* enlarged: 300 neurons at min_px 700 -> 3 px per neuron */
	h.min_px = 700;
	cr_assert_eq(nl_coact_heatmap(&L, perm, &h, &a, &side), 0);
	cr_assert_eq(side, 900);
	for (uint32_t y = 0; y < 900; y += 97)
		for (uint32_t x = 0; x < 900; x += 89)
			cr_assert_arr_eq(a + ((size_t)y * 900 + x) * 3,
					 b + ((size_t)(y / 3) * 300 + x / 3) * 3, 3);
	free(a);
	free(b);
	h.min_px = 0;
	perm[5] = perm[6];   /* not a permutation */
	cr_assert_eq(nl_coact_heatmap(&L, perm, &h, &a, &side), NL_E_INVAL);
	free(perm);

	/* no pairs */
	free(L.pairs);
	L.pairs = NULL;
	cr_assert_eq(nl_coact_heatmap(&L, NULL, &h, &a, &side), NL_E_MISSING);
	layer_release(&L);
	free_csr(&c);
}

/* ---- files: merge exactness and the CLI ---- */

static void write_traces(const char *path, uint32_t n_layers, uint32_t n, uint64_t T, uint64_t seed,
			 struct nl_csr *layers_out)
{
	struct nl_trace_meta meta;
	struct nl_trace_writer *w;
	struct nl_h5_opts h5 = { .compress = NL_COMPRESS_DEFLATE };

	memset(&meta, 0, sizeof(meta));
	snprintf(meta.model.name, sizeof(meta.model.name), "coact-test");
	meta.model.n_layers = n_layers;
	meta.model.d_model = 16;
	meta.model.n_neurons = n;
	snprintf(meta.dataset, sizeof(meta.dataset), "random");
	meta.sparsity = NL_SPARSITY_RELU;
	cr_assert_eq(nl_trace_create(&w, path, &meta, &h5), 0, "%s", nl_diag_msg());
	rng_state = seed;
	for (uint32_t l = 0; l < n_layers; l++) {
		struct nl_csr c;

		make_csr(&c, n, T, 5 + 10 * l, true);
		cr_assert_eq(nl_trace_write_layer(w, l, &c), 0, "%s", nl_diag_msg());
		if (layers_out)
			layers_out[l] = c;
		else
			free_csr(&c);
	}
	cr_assert_eq(nl_trace_finish(w, NULL), 0, "%s", nl_diag_msg());
}

/* Runs nl-coact with args; returns the exit status, stdout/stderr into bufs. */
static int run(char *out, size_t out_size, char *err, size_t err_size, const char *const *argv)
{
	char out_path[512], err_path[512];
	int status;
	pid_t pid;

	snprintf(out_path, sizeof(out_path), "%s/stdout", tmpdir);
	snprintf(err_path, sizeof(err_path), "%s/stderr", tmpdir);
	pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		if (!freopen(out_path, "w", stdout) || !freopen(err_path, "w", stderr))
			_exit(127);
		execv(NL_COACT_EXE, (char *const *)argv);
		_exit(127);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	FILE *f = fopen(out_path, "r");
	size_t m = fread(out, 1, out_size - 1, f);
	out[m] = 0;
	fclose(f);
	f = fopen(err_path, "r");
	m = fread(err, 1, err_size - 1, f);
	err[m] = 0;
	fclose(f);
	cr_assert(WIFEXITED(status));
	return WEXITSTATUS(status);
}

#define RUN(...) run(out, sizeof(out), err, sizeof(err), (const char *const[]){ NL_COACT_EXE, __VA_ARGS__, NULL })

static void read_all(const char *path, struct nl_coact_layer *layers, struct nl_coact_meta *meta_out)
{
	struct nl_coact_reader *r;

	cr_assert_eq(nl_coact_open(&r, path), 0, "%s", nl_diag_msg());
	const struct nl_coact_meta *m = nl_coact_get_meta(r);
	*meta_out = *m;
	for (uint32_t l = 0; l < m->layer_count; l++)
		cr_assert_eq(nl_coact_read_layer(r, m->layer_first + l, m->has_pairs, &layers[l]), 0, "%s",
			     nl_diag_msg());
	nl_coact_close(r);
}

static void assert_layers_equal(const struct nl_coact_layer *a, const struct nl_coact_layer *b, bool pairs)
{
	cr_assert_eq(a->n_neurons, b->n_neurons);
	cr_assert_eq(a->n_tokens, b->n_tokens);
	cr_assert_arr_eq(a->count, b->count, a->n_neurons * sizeof(uint64_t));
	if (pairs)
		cr_assert_arr_eq(a->pairs, b->pairs, nl_tri_size(a->n_neurons) * sizeof(uint32_t));
	cr_assert_eq(a->k, b->k);
	if (a->k) {
		cr_assert_arr_eq(a->topk_ids, b->topk_ids, (size_t)a->n_neurons * a->k * sizeof(uint32_t));
		cr_assert_arr_eq(a->topk_counts, b->topk_counts, (size_t)a->n_neurons * a->k * sizeof(uint32_t));
	}
}

/* One trace file per token shard, built from the same per-layer CSRs. */
static void write_token_shard(const char *path, struct nl_csr *layers, uint32_t n_layers,
			      uint64_t t0, uint64_t t1)
{
	struct nl_trace_meta meta;
	struct nl_trace_writer *w;
	struct nl_h5_opts h5 = { .compress = NL_COMPRESS_NONE };

	memset(&meta, 0, sizeof(meta));
	snprintf(meta.model.name, sizeof(meta.model.name), "coact-test");
	meta.model.n_layers = n_layers;
	meta.model.d_model = 16;
	meta.model.n_neurons = layers[0].n_neurons;
	snprintf(meta.dataset, sizeof(meta.dataset), "random");
	cr_assert_eq(nl_trace_create(&w, path, &meta, &h5), 0, "%s", nl_diag_msg());
	for (uint32_t l = 0; l < n_layers; l++) {
		struct nl_csr *c = &layers[l];
		struct nl_csr s = { .n_tokens = t1 - t0, .n_neurons = c->n_neurons };

		s.indptr = malloc((s.n_tokens + 1) * sizeof(uint64_t));
		for (uint64_t t = t0; t <= t1; t++)
			s.indptr[t - t0] = c->indptr[t] - c->indptr[t0];
		s.indices = c->indices + c->indptr[t0];
		cr_assert_eq(nl_trace_write_layer(w, l, &s), 0, "%s", nl_diag_msg());
		free(s.indptr);
	}
	cr_assert_eq(nl_trace_finish(w, NULL), 0, "%s", nl_diag_msg());
}

Test(files, merge_token_and_layer_shards, .init = make_tmpdir, .fini = remove_tmpdir)
{
	enum { NL = 4, N = 70, T = 400 };
	struct nl_csr layers[NL];
	char out[8192], err[8192];
	char full_t[512], s1_t[512], s2_t[512], full_c[512], s1_c[512], s2_c[512], merged[512];
	char la_c[512], lb_c[512], merged_l[512], nop[512];
	struct nl_coact_layer ref[NL], got[NL];
	struct nl_coact_meta mref, mgot;

	snprintf(full_t, sizeof(full_t), "%s/full.h5", tmpdir);
	snprintf(s1_t, sizeof(s1_t), "%s/s1.h5", tmpdir);
	snprintf(s2_t, sizeof(s2_t), "%s/s2.h5", tmpdir);
	snprintf(full_c, sizeof(full_c), "%s/full.coact.h5", tmpdir);
	snprintf(s1_c, sizeof(s1_c), "%s/s1.coact.h5", tmpdir);
	snprintf(s2_c, sizeof(s2_c), "%s/s2.coact.h5", tmpdir);
	snprintf(merged, sizeof(merged), "%s/merged.h5", tmpdir);
	snprintf(la_c, sizeof(la_c), "%s/la.coact.h5", tmpdir);
	snprintf(lb_c, sizeof(lb_c), "%s/lb.coact.h5", tmpdir);
	snprintf(merged_l, sizeof(merged_l), "%s/merged_l.h5", tmpdir);
	snprintf(nop, sizeof(nop), "%s/nop.coact.h5", tmpdir);

	write_traces(full_t, NL, N, T, 42, layers);
	write_token_shard(s1_t, layers, NL, 0, 123);
	write_token_shard(s2_t, layers, NL, 123, T);

	cr_assert_eq(RUN("count", full_t, "-o", full_c, "-k", "6", "-q"), 0, "%s", err);
	cr_assert_eq(RUN("count", s1_t, "-o", s1_c, "-k", "6", "-q", "--kernel", "sparse"), 0, "%s", err);
	cr_assert_eq(RUN("count", s2_t, "-o", s2_c, "-k", "6", "-q", "--kernel", "bitset", "-j", "2"), 0,
		     "%s", err);
	cr_assert_eq(RUN("merge", s1_c, s2_c, "-o", merged, "-q", "--json"), 0, "%s", err);
	cr_assert(strstr(out, "\"n_tokens\": 400") || strstr(out, "\"n_tokens\":400"), "%s", out);

	read_all(full_c, ref, &mref);
	read_all(merged, got, &mgot);
	cr_assert_eq(mgot.n_tokens, (uint64_t)T);
	cr_assert_eq(mgot.layer_count, (uint32_t)NL);
	for (uint32_t l = 0; l < NL; l++) {
		/* the file agrees with an in-memory count of the same layer */
		uint32_t *bp = brute_pairs(&layers[l]);

		check_layer(&layers[l], &ref[l], bp, "full file");
		free(bp);
		check_topk(&ref[l], 6);
		assert_layers_equal(&ref[l], &got[l], true);
		nl_coact_layer_free(&got[l]);
	}

	/* layer shards: 0-1 and 2-3, merged in reverse order */
	cr_assert_eq(RUN("count", full_t, "-o", la_c, "-k", "6", "-q", "--layers", "0-1"), 0, "%s", err);
	cr_assert_eq(RUN("count", full_t, "-o", lb_c, "-k", "6", "-q", "--layers", "2-3"), 0, "%s", err);
	cr_assert_eq(RUN("merge", lb_c, la_c, "-o", merged_l, "-q"), 0, "%s", err);
	read_all(merged_l, got, &mgot);
	cr_assert_eq(mgot.layer_first, 0);
	cr_assert_eq(mgot.layer_count, (uint32_t)NL);
	for (uint32_t l = 0; l < NL; l++) {
		assert_layers_equal(&ref[l], &got[l], true);
		nl_coact_layer_free(&got[l]);
	}

	/* gap in the layers, unequal token totals, no pairs: refused */
	cr_assert_eq(RUN("merge", lb_c, "-o", merged_l, "-q", "-f"), 0, "%s", err);
	cr_assert_eq(RUN("merge", la_c, s1_c, "-o", merged_l, "-q", "-f"), 1);
	cr_assert(strstr(err, "unevenly"), "%s", err);
	cr_assert_eq(RUN("count", s1_t, "-o", nop, "--no-pairs", "-k", "6", "-q"), 0, "%s", err);
	cr_assert_eq(RUN("merge", nop, s2_c, "-o", merged_l, "-q", "-f"), 1);
	cr_assert(strstr(err, "--no-pairs"), "%s", err);
	cr_assert(strstr(err, "cannot be merged exactly"), "%s", err);

	/* --no-pairs keeps the same top-K lists */
	read_all(nop, got, &mgot);
	cr_assert(!mgot.has_pairs);
	struct nl_coact_layer s1[NL];
	read_all(s1_c, s1, &mref);
	for (uint32_t l = 0; l < NL; l++) {
		cr_assert_null(got[l].pairs);
		cr_assert_eq(got[l].k, 6);
		cr_assert_arr_eq(got[l].topk_ids, s1[l].topk_ids, N * 6 * sizeof(uint32_t));
		cr_assert_arr_eq(got[l].topk_counts, s1[l].topk_counts, N * 6 * sizeof(uint32_t));
		nl_coact_layer_free(&got[l]);
		nl_coact_layer_free(&s1[l]);
	}

	/* rankings: norm by default; mixed inputs are re-ranked from the pairs */
	char s1r[512];

	snprintf(s1r, sizeof(s1r), "%s/s1r.coact.h5", tmpdir);
	cr_assert_eq(mref.rank, NL_COACT_RANK_NORM);
	cr_assert_eq(RUN("count", s1_t, "-o", s1r, "-k", "6", "-q", "--rank", "count", "--json"), 0,
		     "%s", err);
	cr_assert(strstr(out, "\"topk_rank\":\"count\""), "%s", out);
	cr_assert_eq(RUN("merge", s1r, s2_c, "-o", merged, "-q", "-f"), 0, "%s", err);
	read_all(merged, got, &mgot);
	cr_assert_eq(mgot.rank, NL_COACT_RANK_NORM);
	for (uint32_t l = 0; l < NL; l++) {
		assert_layers_equal(&ref[l], &got[l], true);
		nl_coact_layer_free(&got[l]);
	}
	cr_assert_eq(RUN("merge", s1_c, s2_c, "-o", merged, "-q", "-f", "--rank", "count"), 0, "%s", err);
	read_all(merged, got, &mgot);
	cr_assert_eq(mgot.rank, NL_COACT_RANK_COUNT);
	for (uint32_t l = 0; l < NL; l++) {
		cr_assert_eq(got[l].rank, NL_COACT_RANK_COUNT);
		check_topk(&got[l], 6);
		nl_coact_layer_free(&got[l]);
	}
	/* lists without pairs cannot be re-ranked */
	cr_assert_eq(RUN("merge", nop, "-o", merged, "-q", "-f", "--rank", "count"), 1);
	cr_assert(strstr(err, "--rank norm"), "%s", err);
	cr_assert_eq(RUN("merge", nop, "-o", merged, "-q", "-f"), 0, "%s", err);
	cr_assert_eq(RUN("count", s1_t, "-o", s1r, "-k", "6", "-q", "--rank", "nope", "-f"), 2);

	for (uint32_t l = 0; l < NL; l++) {
		nl_coact_layer_free(&ref[l]);
		free_csr(&layers[l]);
	}
}

Test(files, heatmap_cli, .init = make_tmpdir, .fini = remove_tmpdir)
{
	char out[8192], err[8192], tr[512], co[512], png[512];
	uint32_t w, h;
	uint8_t px[3];

	snprintf(tr, sizeof(tr), "%s/t.h5", tmpdir);
	snprintf(co, sizeof(co), "%s/c.h5", tmpdir);
	snprintf(png, sizeof(png), "%s/l1.png", tmpdir);
	write_traces(tr, 2, 50, 100, 7, NULL);
	cr_assert_eq(RUN("count", tr, "-o", co, "-q"), 0, "%s", err);
	cr_assert_eq(RUN("heatmap", co, "--layer", "1", "-o", png, "--size", "20"), 0, "%s", err);
	read_png_size(png, &w, &h, px);
	cr_assert_eq(w, 20);
	cr_assert_eq(h, 20);
	cr_assert_eq(RUN("heatmap", co, "--layer", "1", "-o", png), 1);
	cr_assert(strstr(err, "exists"), "%s", err);
	cr_assert_eq(RUN("heatmap", co, "--layer", "1", "-o", png, "-f", "--json"), 0, "%s", err);
	read_png_size(png, &w, &h, px);
	cr_assert_eq(w, 550, "50 neurons enlarged 11x to reach 512 px");
	cr_assert_eq(RUN("heatmap", co, "--layer", "5", "-o", png, "-f"), 1);
	cr_assert(strstr(err, "holds layers 0-1"), "%s", err);
}

Test(cli, usage_and_errors, .init = make_tmpdir, .fini = remove_tmpdir)
{
	char out[8192], err[8192], tr[512], co[512];

	snprintf(tr, sizeof(tr), "%s/t.h5", tmpdir);
	snprintf(co, sizeof(co), "%s/c.h5", tmpdir);

	cr_assert_eq(RUN("--help"), 0);
	cr_assert(strstr(out, "nl-coact count"), "%s", out);
	cr_assert_eq(RUN("count", "--help"), 0);
	cr_assert(strstr(out, "--kernel"));
	cr_assert_eq(RUN("--version"), 0);
	cr_assert(strstr(out, "nl-coact"), "%s", out);
	cr_assert_eq(RUN("frobnicate"), 2);
	cr_assert(strstr(err, "unknown subcommand"), "%s", err);
	cr_assert_eq(RUN("count", tr, "-o", co, "--bogus"), 2);
	cr_assert(strstr(err, "--bogus"), "%s", err);
	cr_assert_eq(RUN("count", tr), 2);
	cr_assert(strstr(err, "-o"), "%s", err);
	cr_assert_eq(RUN("count", tr, "-o", co, "--kernel", "magic"), 2);
	cr_assert(strstr(err, "magic"), "%s", err);
	cr_assert_eq(RUN("count", tr, "-o", co, "-k", "-3"), 2);
	cr_assert_eq(RUN("count", tr, "-o", co, "--layers", "5-2"), 2);
	cr_assert_eq(RUN("count", tr, "-o", co, "--layer", "1"), 2);
	cr_assert(strstr(err, "does not apply"), "%s", err);
	cr_assert_eq(RUN("heatmap", co, "-o", "x.png"), 2);
	cr_assert(strstr(err, "--layer"), "%s", err);
	cr_assert_eq(RUN("count", tr, tr, "-o", co), 2);

	/* missing input: failure, exit 1, names the file */
	cr_assert_eq(RUN("count", tr, "-o", co), 1);
	cr_assert(strstr(err, "t.h5"), "%s", err);
	cr_assert_eq(access(co, F_OK), -1);

	write_traces(tr, 3, 20, 30, 3, NULL);
	cr_assert_eq(RUN("count", tr, "-o", co, "--json", "-k", "4"), 0, "%s", err);
	cr_assert(strstr(out, "\"kernel\""), "%s", out);
	cr_assert(strstr(out, "\"pairs_per_second\""), "%s", out);
	cr_assert(strstr(out, "\"layers\""), "%s", out);
	/* refuses to overwrite without -f */
	cr_assert_eq(RUN("count", tr, "-o", co), 1);
	cr_assert(strstr(err, "-f"), "%s", err);
	cr_assert_eq(RUN("count", tr, "-o", co, "-f", "-q", "--layers", "1-2"), 0, "%s", err);
	cr_assert_eq(RUN("count", tr, "-o", co, "-f", "-q", "--layers", "2-9"), 1);
	cr_assert(strstr(err, "has 3 layers"), "%s", err);
	/* a coact file is not a trace file */
	char co2[512];
	snprintf(co2, sizeof(co2), "%s/c2.h5", tmpdir);
	cr_assert_eq(RUN("count", co, "-o", co2, "-q"), 1);
	cr_assert(strstr(err, "c.h5"), "%s", err);
	cr_assert_eq(access(co2, F_OK), -1);
	/* merging statistics of different models */
	char other_t[512], other_c[512];
	snprintf(other_t, sizeof(other_t), "%s/o.h5", tmpdir);
	snprintf(other_c, sizeof(other_c), "%s/o.coact.h5", tmpdir);
	write_traces(other_t, 3, 21, 30, 3, NULL);
	cr_assert_eq(RUN("count", other_t, "-o", other_c, "-q"), 0, "%s", err);
	cr_assert_eq(RUN("merge", co, other_c, "-o", co2, "-q"), 1);
	cr_assert(strstr(err, "same model"), "%s", err);
}
