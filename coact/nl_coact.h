/*
 * Co-activation statistics (Neuralink section 4.1, equations 1-2): for every
 * layer of a trace, f(i) = tokens in which neuron i is active, f(i,j) = tokens
 * in which both i and j are active (packed upper triangle, nl_tri_index()),
 * the token count, and top-K neighbour lists for the sparse placer.
 *
 * Counting is exact (u32 pair counters, so at most UINT32_MAX tokens) and done
 * by one of two kernels chosen per layer by a cost model:
 *  - sparse: for every token, +1 on the counter of every pair of its active
 *    ids; the triangle is cut into square tiles whose u16 counters stay in L2,
 *    and each tile walks only the ids of its two neuron blocks;
 *  - bitset: one bitset over tokens per neuron, f(i,j) = popcount(b_i & b_j),
 *    register-blocked 4x4, with AVX-512 VPOPCNTDQ, AVX2 or scalar code chosen
 *    at run time.
 * Both run on n_threads threads. The library never prints.
 *
 * The in-memory result is a struct nl_coact_layer (nl_formats.h), which the
 * format API writes and reads.
 */
#ifndef NL_COACT_H
#define NL_COACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nl_formats.h"

enum nl_coact_kernel {
	NL_COACT_KERNEL_AUTO = 0,   /* cheaper of the two by nl_coact_estimate() */
	NL_COACT_KERNEL_SPARSE = 1,
	NL_COACT_KERNEL_BITSET = 2,
};

/* Instruction set of the bitset kernel. */
enum nl_coact_simd {
	NL_COACT_SIMD_AUTO = 0,     /* the best this CPU supports */
	NL_COACT_SIMD_SCALAR = 1,   /* portable C */
	NL_COACT_SIMD_AVX2 = 2,     /* AVX2, popcount by nibble lookup */
	NL_COACT_SIMD_AVX512 = 3,   /* AVX-512F + VPOPCNTDQ */
};

/* "auto", "sparse", "bitset" / "auto", "scalar", "avx2", "avx512". */
const char *nl_coact_kernel_name(enum nl_coact_kernel k);
int nl_coact_kernel_parse(enum nl_coact_kernel *k, const char *name);
const char *nl_coact_simd_name(enum nl_coact_simd s);
int nl_coact_simd_parse(enum nl_coact_simd *s, const char *name);
/* Whether this CPU (and this build) can run s; AUTO and SCALAR always can. */
bool nl_coact_simd_supported(enum nl_coact_simd s);
/* The best supported instruction set (never AUTO). */
enum nl_coact_simd nl_coact_simd_best(void);

struct nl_coact_opts {
	enum nl_coact_kernel kernel;
	enum nl_coact_simd simd;
	uint32_t n_threads;       /* 0 = online CPUs */
	uint32_t k;               /* top-K neighbours per neuron, 0 = no lists */
	bool keep_pairs;          /* leave the triangle in the result (else freed after top-K) */
	uint32_t sparse_tile;     /* neurons per side of a sparse tile, 0 = default (512) */
	uint32_t bitset_words;    /* 64-token words per bitset token block, 0 = default */
	enum nl_coact_rank rank;  /* ranking of the top-K lists; default NL_COACT_RANK_NORM */
};
void nl_coact_opts_default(struct nl_coact_opts *opts);

/* What counting one layer did (for progress, --json and benchmarks). */
struct nl_coact_info {
	enum nl_coact_kernel kernel;   /* the kernel that ran */
	enum nl_coact_simd simd;       /* for the bitset kernel */
	double cost_sparse;            /* cost model estimates, in seconds of one core */
	double cost_bitset;
	uint64_t pair_increments;      /* sum over tokens of a_t (a_t - 1) / 2 */
	uint64_t bitset_words;         /* 64-bit AND+popcounts the bitset kernel does (incl. padding) */
	double seconds_count;          /* counting (both kernels incl. their preparation) */
	double seconds_topk;
};

/*
 * Cost model: estimated single-core seconds of each kernel on csr, from the
 * sum over tokens of a_t^2 / 2 random increments (sparse) and n^2 / 2 *
 * n_tokens / 64 word AND+popcounts (bitset, at the speed of simd). Fills the
 * cost_* and pair_increments / bitset_words fields of info.
 */
void nl_coact_estimate(const struct nl_csr *csr, enum nl_coact_simd simd,
		       struct nl_coact_info *info);

/*
 * Counts one layer: out receives n_neurons, n_tokens, count (f(i)), pairs
 * (f(i,j), when opts->keep_pairs) and, when opts->k > 0, the top-K lists.
 * On entry out must be zeroed or hold a previous result: its arrays are
 * freed, except that a pairs buffer of the same n_neurons is reused (when
 * streaming layer after layer this saves the page faults of a fresh
 * triangle, ~1 s per 16384-neuron layer). The caller frees out with
 * nl_coact_layer_free(), also after a failure. ids must be < n_neurons and
 * strictly increasing per token (checked). info may be NULL.
 * Returns 0, NL_E_UNSUPPORTED when n_tokens > UINT32_MAX (u32 counters would
 * overflow) or the requested SIMD path is not available, NL_E_INVAL on a bad
 * option or id, -ENOMEM.
 */
int nl_coact_count_layer(const struct nl_csr *csr, const struct nl_coact_opts *opts,
			 struct nl_coact_layer *out, struct nl_coact_info *info);

/*
 * (Re)computes the top-K lists of layer from its pairs (must be present):
 * row i holds the k neurons j != i with f(i,j) > 0 that rank first under
 * rank (nl_coact_rank_before(): score descending, then f(i,j) descending,
 * then id ascending; score f(i,j) for NL_COACT_RANK_COUNT,
 * f(i,j)/sqrt(f(i) f(j)) for NL_COACT_RANK_NORM). topk_counts hold the raw
 * f(i,j). Unused slots have id UINT32_MAX and count 0. Replaces
 * layer->topk_*, sets layer->k and layer->rank. n_threads 0 = online CPUs.
 * nl_coact_topk() ranks by layer->rank.
 */
int nl_coact_topk_ranked(struct nl_coact_layer *layer, uint32_t k, enum nl_coact_rank rank,
			 uint32_t n_threads);
int nl_coact_topk(struct nl_coact_layer *layer, uint32_t k, uint32_t n_threads);
/* "count" / "norm" -> rank; 0 or NL_E_INVAL. */
int nl_coact_rank_parse(enum nl_coact_rank *rank, const char *name);

/*
 * Adds the counts of add into acc (same n_neurons): count, n_tokens and, when
 * both have them, pairs. The top-K lists of acc are left untouched (recompute
 * them with nl_coact_topk()). Returns NL_E_MISMATCH on different sizes,
 * NL_E_UNSUPPORTED when the token total would exceed UINT32_MAX, NL_E_MISSING
 * when acc has pairs and add does not.
 */
int nl_coact_layer_add(struct nl_coact_layer *acc, const struct nl_coact_layer *add);

/* Deep copy of src into dst (overwritten); pairs only when with_pairs. */
int nl_coact_layer_copy(struct nl_coact_layer *dst, const struct nl_coact_layer *src,
			bool with_pairs);

/* ---- heatmaps (paper Figure 5) ---- */

enum nl_coact_heat_value {
	NL_COACT_HEAT_NORM = 0,   /* f(i,j) / sqrt(f(i) f(j)), 1 on the diagonal */
	NL_COACT_HEAT_PROB = 1,   /* P(ij), equation 2 */
};

enum nl_coact_heat_scale {
	NL_COACT_HEAT_GAMMA = 0,  /* (v / max)^gamma */
	NL_COACT_HEAT_LOG = 1,    /* log10 over 4 decades below the maximum */
};

struct nl_coact_heat_opts {
	enum nl_coact_heat_value value;
	enum nl_coact_heat_scale scale;
	double gamma;             /* 0 = default 0.5 */
	uint32_t max_px;          /* side of the image at most, 0 = default 1024 */
	uint32_t min_px;          /* small layers are enlarged by a whole factor (nearest
				   * neighbour) to at least this side when possible; 0 = 1 */
};
void nl_coact_heat_opts_default(struct nl_coact_heat_opts *opts);

/*
 * Renders the co-activation matrix of layer (pairs required) as an RGB image
 * of side *side = min(n, max_px), averaging blocks of neurons when n is larger;
 * when that is below min_px, each cell becomes a square of whole pixels.
 * perm (may be NULL) is a placement, position -> neuron id: pixel rows and
 * columns then follow placement order so co-placed clusters sit along the
 * diagonal. *rgb is allocated ([side * side * 3]); the caller frees it.
 */
int nl_coact_heatmap(const struct nl_coact_layer *layer, const uint32_t *perm,
		     const struct nl_coact_heat_opts *opts, uint8_t **rgb, uint32_t *side);

/* Writes an 8-bit RGB PNG through "<path>.tmp" + rename. */
int nl_coact_png_write(const char *path, const uint8_t *rgb, uint32_t width, uint32_t height);

#endif
