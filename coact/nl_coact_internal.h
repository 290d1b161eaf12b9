/* Internals shared by the files of the coact library. */
#ifndef NL_COACT_INTERNAL_H
#define NL_COACT_INTERNAL_H

#include <stdint.h>

#include "nl_coact.h"

/* Runs fn(ctx, t) on n_threads threads (t = 0..n_threads-1), the caller's
 * thread being number 0, and waits for all. Returns 0 or -errno when no
 * thread could be started (then fn ran on the caller's thread only). */
typedef void (*nl_coact_task_fn)(void *ctx, uint32_t thread);
int nl_coact_run_threads(uint32_t n_threads, nl_coact_task_fn fn, void *ctx);
uint32_t nl_coact_threads(uint32_t n_threads);  /* 0 -> online CPUs */

/* Kernels: write the pair counts of csr into pairs (nl_tri_size(n) entries,
 * not necessarily zeroed: every entry is stored). */
int nl_coact_sparse_pairs(const struct nl_csr *csr, uint32_t *pairs, uint32_t tile,
			  uint32_t n_threads);
int nl_coact_bitset_pairs(const struct nl_csr *csr, uint32_t *pairs, enum nl_coact_simd simd,
			  uint32_t block_words, uint32_t n_threads);

/* Same as nl_coact_layer_free(), without depending on the format code. */
void nl_coact_layer_release(struct nl_coact_layer *layer);

#define NL_COACT_SPARSE_TILE 512
#define NL_COACT_BITSET_WORDS 512

#endif
