/*
 * Sparse kernel: for every token, +1 on f(i,j) for every pair of its active
 * ids (Neuralink section 4.1, equation 2, counted exactly).
 *
 * A 16384-neuron triangle is 537 MB, so incrementing it directly costs a
 * cache miss per increment. Instead the neuron range is cut into blocks of
 * `tile` neurons and the triangle into tile x tile squares (bR <= bC). Each
 * square is counted on its own with u16 counters (512 x 512 x 2 = 512 KiB,
 * resident in a 1 MiB L2), walking, for every token, only the ids that fall in
 * its row block and its column block; the u16 counters are flushed into the
 * u32 triangle every 65535 tokens, before they could wrap. Where a token's ids
 * enter each block is precomputed once per layer (block_pos), so a square
 * never scans ids outside its blocks. Squares are handed out to the threads
 * through an atomic counter; two threads never share a square.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "nl_coact_internal.h"

/* u16 counters can absorb this many tokens before they must be flushed. */
#define TOKENS_PER_FLUSH 65535u

struct sparse_job {
	const struct nl_csr *csr;
	uint32_t *pairs;
	uint32_t n;
	uint32_t tile;
	uint32_t n_blocks;
	/* block_pos[b * n_tokens + t]: offset within token t's ids of the first
	 * id >= b * tile, for b = 0..n_blocks (the last is the token's length). */
	uint32_t *block_pos;
	/* The ids of block b, token after token, as u16 offsets from b * tile:
	 * block_ids[b][block_off[b][t] .. block_off[b][t + 1]). Each square then
	 * reads two dense sequential streams instead of two scattered cache
	 * lines per token (which made the kernel memory-latency bound). */
	uint16_t **block_ids;
	uint64_t **block_off;      /* [n_blocks][n_tokens + 1] */
	uint32_t n_squares;
	uint32_t *square_r;      /* square s covers row block square_r[s] ... */
	uint32_t *square_c;      /* ... and column block square_c[s] */
	atomic_uint next_token_chunk;
	atomic_uint next_block;
	atomic_uint next_square;
	atomic_int failed;
	uint16_t **scratch;      /* per thread: tile * tile u16 counters */
	uint32_t n_threads;
};

#define TOKEN_CHUNK 4096u

static void fill_block_pos(void *ctx, uint32_t thread)
{
	struct sparse_job *job = ctx;
	const struct nl_csr *csr = job->csr;
	uint64_t T = csr->n_tokens;

	(void)thread;
	for (;;) {
		uint64_t t0 = (uint64_t)atomic_fetch_add(&job->next_token_chunk, 1) * TOKEN_CHUNK;
		uint64_t t1 = t0 + TOKEN_CHUNK < T ? t0 + TOKEN_CHUNK : T;

		if (t0 >= T)
			break;
		for (uint64_t t = t0; t < t1; t++) {
			const uint32_t *ids = csr->indices + csr->indptr[t];
			uint32_t len = (uint32_t)(csr->indptr[t + 1] - csr->indptr[t]);
			uint32_t p = 0;

			for (uint32_t b = 0; b < job->n_blocks; b++) {
				uint32_t lo = b * job->tile;

				while (p < len && ids[p] < lo)
					p++;
				job->block_pos[(uint64_t)b * T + t] = p;
			}
			job->block_pos[(uint64_t)job->n_blocks * T + t] = len;
		}
	}
}

/* Per block: offsets (prefix sums of the per-token run lengths), then the ids. */
static void fill_blocks(void *ctx, uint32_t thread)
{
	struct sparse_job *job = ctx;
	const struct nl_csr *csr = job->csr;
	uint64_t T = csr->n_tokens;

	(void)thread;
	for (;;) {
		uint32_t b = atomic_fetch_add(&job->next_block, 1);

		if (b >= job->n_blocks)
			break;
		const uint32_t *lo = job->block_pos + (uint64_t)b * T;
		const uint32_t *hi = lo + T;
		uint64_t *off = malloc((T + 1) * sizeof(uint64_t));
		uint64_t total = 0;

		if (!off) {
			atomic_store(&job->failed, 1);
			continue;
		}
		for (uint64_t t = 0; t < T; t++) {
			off[t] = total;
			total += hi[t] - lo[t];
		}
		off[T] = total;
		uint16_t *ids = malloc((total ? total : 1) * sizeof(uint16_t));

		if (!ids) {
			free(off);
			atomic_store(&job->failed, 1);
			continue;
		}
		uint32_t base = b * job->tile;
		for (uint64_t t = 0; t < T; t++) {
			const uint32_t *src = csr->indices + csr->indptr[t];
			uint16_t *dst = ids + off[t];

			for (uint32_t p = lo[t]; p < hi[t]; p++)
				*dst++ = (uint16_t)(src[p] - base);
		}
		job->block_off[b] = off;
		job->block_ids[b] = ids;
	}
}

/*
 * Adds a square's u16 counters into the u32 triangle and zeroes them. The
 * first flush of a square stores instead, so the triangle needs no zeroing
 * beforehand (a reused buffer costs no page faults and no memset).
 */
static void flush_square(const struct sparse_job *job, uint16_t *cnt, uint32_t r0, uint32_t rn,
			 uint32_t c0, uint32_t cn, bool first)
{
	uint32_t n = job->n;

	for (uint32_t r = 0; r < rn; r++) {
		uint32_t i = r0 + r;
		uint32_t cstart = c0 > i ? 0 : i + 1 - c0;   /* only j > i */
		uint16_t *row = cnt + (size_t)r * job->tile;

		if (cstart >= cn)
			continue;
		uint32_t *dst = job->pairs + nl_tri_index(n, i, c0 + cstart);
		if (first)
			for (uint32_t c = cstart; c < cn; c++)
				dst[c - cstart] = row[c];
		else
			for (uint32_t c = cstart; c < cn; c++)
				dst[c - cstart] += row[c];
		memset(row, 0, (size_t)cn * sizeof(*row));
	}
}

static void count_square(struct sparse_job *job, uint16_t *cnt, uint32_t br, uint32_t bc)
{
	uint64_t T = job->csr->n_tokens;
	uint32_t tile = job->tile;
	uint32_t r0 = br * tile, c0 = bc * tile;
	uint32_t rn = job->n - r0 < tile ? job->n - r0 : tile;
	uint32_t cn = job->n - c0 < tile ? job->n - c0 : tile;
	const uint16_t *rids = job->block_ids[br], *cids = job->block_ids[bc];
	const uint64_t *roff = job->block_off[br], *coff = job->block_off[bc];
	uint64_t since_flush = 0;
	bool first = true;

	for (uint64_t t = 0; t < T; t++) {
		uint64_t p0 = roff[t], p1 = roff[t + 1];

		if (++since_flush > TOKENS_PER_FLUSH) {
			flush_square(job, cnt, r0, rn, c0, cn, first);
			first = false;
			since_flush = 1;
		}
		if (p0 == p1)
			continue;
		if (br == bc) {
			/* Diagonal square: pairs p < q of the same id run. */
			for (uint64_t p = p0; p + 1 < p1; p++) {
				uint16_t *row = cnt + (size_t)rids[p] * tile;

				for (uint64_t q = p + 1; q < p1; q++)
					row[rids[q]]++;
			}
			continue;
		}
		uint64_t q0 = coff[t], q1 = coff[t + 1];

		if (q0 == q1)
			continue;
		const uint16_t *col = cids + q0;
		uint32_t m = (uint32_t)(q1 - q0);

		uint64_t p = p0;

		/* Four, then two rows at a time: each column id loaded once serves
		 * them all, and the increments of a step are independent (distinct
		 * rows and ids), which keeps many in flight. */
		for (; p + 4 <= p1; p += 4) {
			uint16_t *row0 = cnt + (size_t)rids[p] * tile;
			uint16_t *row1 = cnt + (size_t)rids[p + 1] * tile;
			uint16_t *row2 = cnt + (size_t)rids[p + 2] * tile;
			uint16_t *row3 = cnt + (size_t)rids[p + 3] * tile;

			for (uint32_t q = 0; q < m; q++) {
				uint16_t x = col[q];

				row0[x]++;
				row1[x]++;
				row2[x]++;
				row3[x]++;
			}
		}
		for (; p + 2 <= p1; p += 2) {
			uint16_t *row0 = cnt + (size_t)rids[p] * tile;
			uint16_t *row1 = cnt + (size_t)rids[p + 1] * tile;

			for (uint32_t q = 0; q < m; q++) {
				uint16_t x = col[q];

				row0[x]++;
				row1[x]++;
			}
		}
		if (p < p1) {
			uint16_t *row = cnt + (size_t)rids[p] * tile;

			for (uint32_t q = 0; q < m; q++)
				row[col[q]]++;
		}
	}
	flush_square(job, cnt, r0, rn, c0, cn, first);
}

static void sparse_worker(void *ctx, uint32_t thread)
{
	struct sparse_job *job = ctx;
	uint16_t *cnt = job->scratch[thread];

	for (;;) {
		uint32_t s = atomic_fetch_add(&job->next_square, 1);

		if (s >= job->n_squares)
			break;
		count_square(job, cnt, job->square_r[s], job->square_c[s]);
	}
}

int nl_coact_sparse_pairs(const struct nl_csr *csr, uint32_t *pairs, uint32_t tile,
			  uint32_t n_threads)
{
	struct sparse_job job = { .csr = csr, .pairs = pairs, .n = csr->n_neurons };
	int ret = 0;

	if (tile == 0)
		tile = NL_COACT_SPARSE_TILE;
	if (tile > 4096)   /* u16 local ids and a square that fits a cache */
		return nl_diag(NL_E_INVAL, "sparse tile %u neurons is too large, expected at most 4096", tile);
	if (job.n < 2)
		return 0;
	if (csr->n_tokens == 0) {
		memset(pairs, 0, nl_tri_size(job.n) * sizeof(uint32_t));
		return 0;
	}
	if (tile > job.n)
		tile = job.n;
	job.tile = tile;
	job.n_blocks = (job.n + tile - 1) / tile;
	job.n_threads = nl_coact_threads(n_threads);
	job.n_squares = job.n_blocks * (job.n_blocks + 1) / 2;

	job.block_pos = malloc(((uint64_t)job.n_blocks + 1) * csr->n_tokens * sizeof(uint32_t));
	job.square_r = malloc(job.n_squares * sizeof(uint32_t));
	job.square_c = malloc(job.n_squares * sizeof(uint32_t));
	job.scratch = calloc(job.n_threads, sizeof(*job.scratch));
	job.block_ids = calloc(job.n_blocks, sizeof(*job.block_ids));
	job.block_off = calloc(job.n_blocks, sizeof(*job.block_off));
	if (!job.block_pos || !job.square_r || !job.square_c || !job.scratch || !job.block_ids ||
	    !job.block_off) {
		ret = -ENOMEM;
		goto out_free;
	}
	for (uint32_t t = 0; t < job.n_threads; t++) {
		job.scratch[t] = calloc((size_t)tile * tile, sizeof(uint16_t));
		if (!job.scratch[t]) {
			ret = -ENOMEM;
			goto out_free;
		}
	}
	/* Row-major order: consecutive squares share their row block's ids. */
	uint32_t s = 0;
	for (uint32_t br = 0; br < job.n_blocks; br++)
		for (uint32_t bc = br; bc < job.n_blocks; bc++) {
			job.square_r[s] = br;
			job.square_c[s] = bc;
			s++;
		}

	atomic_init(&job.next_token_chunk, 0);
	atomic_init(&job.next_block, 0);
	atomic_init(&job.next_square, 0);
	atomic_init(&job.failed, 0);
	ret = nl_coact_run_threads(job.n_threads, fill_block_pos, &job);
	if (ret == 0)
		ret = nl_coact_run_threads(job.n_threads, fill_blocks, &job);
	/* block_pos is only needed to build the blocks */
	free(job.block_pos);
	job.block_pos = NULL;
	if (ret == 0 && atomic_load(&job.failed))
		ret = -ENOMEM;
	if (ret == 0)
		ret = nl_coact_run_threads(job.n_threads, sparse_worker, &job);
	if (ret < 0)
		nl_diag(ret, "cannot start %u counting threads", job.n_threads);

out_free:
	if (ret == -ENOMEM)
		nl_diag(ret, "out of memory for the sparse kernel (%u neurons, %llu tokens)",
			job.n, (unsigned long long)csr->n_tokens);
	if (job.scratch)
		for (uint32_t t = 0; t < job.n_threads; t++)
			free(job.scratch[t]);
	free(job.scratch);
	if (job.block_ids)
		for (uint32_t b = 0; b < job.n_blocks; b++) {
			free(job.block_ids[b]);
			free(job.block_off[b]);
		}
	free(job.block_ids);
	free(job.block_off);
	free(job.square_c);
	free(job.square_r);
	free(job.block_pos);
	return ret;
}
