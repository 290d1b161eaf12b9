/*
 * Bitset kernel: one bitset over tokens per neuron, f(i,j) = popcount(b_i & b_j)
 * (Neuralink section 4.1, equation 2), for dense layers where the sparse
 * kernel's a^2/2 increments per token cost more than n^2/2 word operations
 * per 64 tokens.
 *
 * Layout: tokens are cut into blocks of block_words 64-bit words; a block
 * stores every neuron's words contiguously (row i at i * wb), so the rows
 * of a 4-neuron group are 4 short contiguous streams. Rows are padded to a
 * multiple of 4 neurons and every block to a multiple of 8 words (zeros
 * count nothing). The triangle is computed in tiles of rows: for each
 * token block, the tile's slice (~256 KiB, L2-resident) is paired with
 * every 4-row group j >= the tile, 4x4 pairs at a time in registers, so each
 * loaded vector serves four AND+popcounts. Tiles go to threads through an
 * atomic counter, largest first; a pair is only ever written by its tile.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NL_X86 1
#endif

#include "nl_coact_internal.h"

/* Rows per tile: the tile's slice of a token block (rows * block words * 8
 * bytes) is kept at about 256 KiB, a quarter of a 1 MiB L2. */
#define TILE_SLICE_BYTES (256u << 10)

typedef void (*micro_fn)(const uint64_t *a, const uint64_t *b, size_t wb, uint32_t out[16]);

struct bitset_job {
	const struct nl_csr *csr;
	uint32_t *pairs;
	uint32_t n, n4;
	uint64_t n_words;        /* ceil(n_tokens / 64) */
	uint32_t block_words;    /* words per full token block (multiple of 8) */
	uint32_t n_tblocks;
	uint64_t *bits;
	micro_fn micro;
	uint32_t rows_per_tile;  /* multiple of 4 */
	uint32_t n_tiles;
	atomic_uint next;
	uint64_t **scratch;      /* per thread [n4] words used while building */
};

static void micro_scalar(const uint64_t *a, const uint64_t *b, size_t wb, uint32_t out[16])
{
	for (int r = 0; r < 4; r++)
		for (int c = 0; c < 4; c++) {
			const uint64_t *x = a + r * wb, *y = b + c * wb;
			uint64_t s = 0;

			for (size_t w = 0; w < wb; w++)
				s += (uint64_t)__builtin_popcountll(x[w] & y[w]);
			out[r * 4 + c] = (uint32_t)s;
		}
}

#ifdef NL_X86
__attribute__((target("avx2")))
static inline __m256i popcnt256(__m256i v, __m256i lut, __m256i low_mask)
{
	__m256i lo = _mm256_and_si256(v, low_mask);
	__m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_mask);
	__m256i bytes = _mm256_add_epi8(_mm256_shuffle_epi8(lut, lo), _mm256_shuffle_epi8(lut, hi));

	return _mm256_sad_epu8(bytes, _mm256_setzero_si256());
}

__attribute__((target("avx2")))
static uint32_t hsum256(__m256i v)
{
	__m128i s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));

	return (uint32_t)(_mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1));
}

/* 2x2 register blocks over the 4x4 group: AVX2 has 16 vector registers. */
__attribute__((target("avx2")))
static void micro_avx2(const uint64_t *a, const uint64_t *b, size_t wb, uint32_t out[16])
{
	const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
					     0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
	const __m256i low_mask = _mm256_set1_epi8(0x0f);

	for (int r = 0; r < 4; r += 2)
		for (int c = 0; c < 4; c += 2) {
			const uint64_t *x0 = a + r * wb, *x1 = x0 + wb;
			const uint64_t *y0 = b + c * wb, *y1 = y0 + wb;
			__m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00;

			for (size_t w = 0; w < wb; w += 4) {
				__m256i u0 = _mm256_loadu_si256((const __m256i *)(x0 + w));
				__m256i u1 = _mm256_loadu_si256((const __m256i *)(x1 + w));
				__m256i v0 = _mm256_loadu_si256((const __m256i *)(y0 + w));
				__m256i v1 = _mm256_loadu_si256((const __m256i *)(y1 + w));

				s00 = _mm256_add_epi64(s00, popcnt256(_mm256_and_si256(u0, v0), lut, low_mask));
				s01 = _mm256_add_epi64(s01, popcnt256(_mm256_and_si256(u0, v1), lut, low_mask));
				s10 = _mm256_add_epi64(s10, popcnt256(_mm256_and_si256(u1, v0), lut, low_mask));
				s11 = _mm256_add_epi64(s11, popcnt256(_mm256_and_si256(u1, v1), lut, low_mask));
			}
			out[r * 4 + c] = hsum256(s00);
			out[r * 4 + c + 1] = hsum256(s01);
			out[(r + 1) * 4 + c] = hsum256(s10);
			out[(r + 1) * 4 + c + 1] = hsum256(s11);
		}
}

/* 4x4 in registers: 16 accumulators + 8 operands of the 32 zmm registers. */
__attribute__((target("avx512f,avx512vpopcntdq")))
static void micro_avx512(const uint64_t *a, const uint64_t *b, size_t wb, uint32_t out[16])
{
	__m512i s[16];

	for (int k = 0; k < 16; k++)
		s[k] = _mm512_setzero_si512();
	for (size_t w = 0; w < wb; w += 8) {
		__m512i x0 = _mm512_loadu_si512(a + w);
		__m512i x1 = _mm512_loadu_si512(a + wb + w);
		__m512i x2 = _mm512_loadu_si512(a + 2 * wb + w);
		__m512i x3 = _mm512_loadu_si512(a + 3 * wb + w);
		__m512i y0 = _mm512_loadu_si512(b + w);
		__m512i y1 = _mm512_loadu_si512(b + wb + w);
		__m512i y2 = _mm512_loadu_si512(b + 2 * wb + w);
		__m512i y3 = _mm512_loadu_si512(b + 3 * wb + w);
#define NL_ACC(k, x, y) s[k] = _mm512_add_epi64(s[k], _mm512_popcnt_epi64(_mm512_and_si512(x, y)))
		NL_ACC(0, x0, y0); NL_ACC(1, x0, y1); NL_ACC(2, x0, y2); NL_ACC(3, x0, y3);
		NL_ACC(4, x1, y0); NL_ACC(5, x1, y1); NL_ACC(6, x1, y2); NL_ACC(7, x1, y3);
		NL_ACC(8, x2, y0); NL_ACC(9, x2, y1); NL_ACC(10, x2, y2); NL_ACC(11, x2, y3);
		NL_ACC(12, x3, y0); NL_ACC(13, x3, y1); NL_ACC(14, x3, y2); NL_ACC(15, x3, y3);
#undef NL_ACC
	}
	for (int k = 0; k < 16; k++)
		out[k] = (uint32_t)_mm512_reduce_add_epi64(s[k]);
}
#endif

bool nl_coact_simd_supported(enum nl_coact_simd s)
{
	switch (s) {
	case NL_COACT_SIMD_AUTO:
	case NL_COACT_SIMD_SCALAR:
		return true;
#ifdef NL_X86
	case NL_COACT_SIMD_AVX2:
		return __builtin_cpu_supports("avx2");
	case NL_COACT_SIMD_AVX512:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vpopcntdq");
#else
	default:
		return false;
#endif
	}
	return false;
}

enum nl_coact_simd nl_coact_simd_best(void)
{
	if (nl_coact_simd_supported(NL_COACT_SIMD_AVX512))
		return NL_COACT_SIMD_AVX512;
	if (nl_coact_simd_supported(NL_COACT_SIMD_AVX2))
		return NL_COACT_SIMD_AVX2;
	return NL_COACT_SIMD_SCALAR;
}

static micro_fn pick_micro(enum nl_coact_simd simd)
{
	switch (simd) {
#ifdef NL_X86
	case NL_COACT_SIMD_AVX512:
		return micro_avx512;
	case NL_COACT_SIMD_AVX2:
		return micro_avx2;
#endif
	default:
		return micro_scalar;
	}
}

static inline uint32_t block_width(const struct bitset_job *job, uint32_t b)
{
	uint64_t left = job->n_words - (uint64_t)b * job->block_words;
	uint64_t w = (left + 7) & ~(uint64_t)7;

	return w < job->block_words ? (uint32_t)w : job->block_words;
}

static inline uint64_t *block_base(const struct bitset_job *job, uint32_t b)
{
	return job->bits + (uint64_t)b * job->n4 * job->block_words;
}

/* Transposes the CSR into bitsets, one 64-token word column at a time. */
static void build_worker(void *ctx, uint32_t thread)
{
	struct bitset_job *job = ctx;
	const struct nl_csr *csr = job->csr;
	uint64_t *word = job->scratch[thread];

	for (;;) {
		uint64_t w = atomic_fetch_add(&job->next, 1);

		if (w >= job->n_words)
			break;
		uint32_t b = (uint32_t)(w / job->block_words);
		uint32_t wb = block_width(job, b);
		uint64_t *dst = block_base(job, b) + (w - (uint64_t)b * job->block_words);
		uint64_t t0 = w * 64;
		uint64_t t1 = t0 + 64 < csr->n_tokens ? t0 + 64 : csr->n_tokens;

		for (uint64_t t = t0; t < t1; t++) {
			uint64_t bit = 1ull << (t - t0);

			for (uint64_t p = csr->indptr[t]; p < csr->indptr[t + 1]; p++)
				word[csr->indices[p]] |= bit;
		}
		for (uint32_t i = 0; i < job->n; i++) {
			dst[(uint64_t)i * wb] = word[i];
			word[i] = 0;
		}
	}
}

static void count_tile(struct bitset_job *job, uint32_t tile)
{
	uint32_t i_lo = tile * job->rows_per_tile;
	uint32_t i_hi = i_lo + job->rows_per_tile < job->n4 ? i_lo + job->rows_per_tile : job->n4;
	uint32_t n = job->n;
	uint32_t out[16];

	for (uint32_t b = 0; b < job->n_tblocks; b++) {
		uint32_t wb = block_width(job, b);
		const uint64_t *base = block_base(job, b);

		for (uint32_t j0 = i_lo; j0 < job->n4; j0 += 4) {
			const uint64_t *bj = base + (uint64_t)j0 * wb;

			for (uint32_t i0 = i_lo; i0 < i_hi && i0 <= j0; i0 += 4) {
				job->micro(base + (uint64_t)i0 * wb, bj, wb, out);
				for (uint32_t r = 0; r < 4; r++) {
					uint32_t i = i0 + r;

					for (uint32_t c = 0; c < 4; c++) {
						uint32_t j = j0 + c;

						/* the first token block stores: the
						 * triangle is not zeroed beforehand */
						if (i < j && j < n) {
							uint32_t *dst = job->pairs + nl_tri_index(n, i, j);

							*dst = b ? *dst + out[r * 4 + c] : out[r * 4 + c];
						}
					}
				}
			}
		}
	}
}

static void count_worker(void *ctx, uint32_t thread)
{
	struct bitset_job *job = ctx;

	(void)thread;
	for (;;) {
		uint32_t t = atomic_fetch_add(&job->next, 1);

		if (t >= job->n_tiles)
			break;
		count_tile(job, t);   /* tile 0 has the most work: largest first */
	}
}

int nl_coact_bitset_pairs(const struct nl_csr *csr, uint32_t *pairs, enum nl_coact_simd simd,
			  uint32_t block_words, uint32_t n_threads)
{
	struct bitset_job job = { .csr = csr, .pairs = pairs, .n = csr->n_neurons };
	uint32_t threads = nl_coact_threads(n_threads);
	size_t bytes;
	int ret = 0;

	if (simd == NL_COACT_SIMD_AUTO)
		simd = nl_coact_simd_best();
	if (!nl_coact_simd_supported(simd))
		return nl_diag(NL_E_UNSUPPORTED, "the %s bitset kernel is not supported by this CPU; use --simd auto",
			       nl_coact_simd_name(simd));
	if (block_words == 0)
		block_words = NL_COACT_BITSET_WORDS;
	if (block_words % 8 || block_words > (1u << 20))
		return nl_diag(NL_E_INVAL, "bitset block of %u words: expected a multiple of 8 up to 1048576",
			       block_words);
	if (job.n < 2)
		return 0;
	if (csr->n_tokens == 0) {
		memset(pairs, 0, nl_tri_size(job.n) * sizeof(uint32_t));
		return 0;
	}
	job.micro = pick_micro(simd);
	job.n4 = (job.n + 3) & ~3u;
	job.n_words = (csr->n_tokens + 63) / 64;
	job.block_words = block_words;
	job.n_tblocks = (uint32_t)((job.n_words + block_words - 1) / block_words);
	job.rows_per_tile = TILE_SLICE_BYTES / (block_words * 8) & ~3u;
	if (job.rows_per_tile < 4)
		job.rows_per_tile = 4;
	if (job.rows_per_tile > 256)
		job.rows_per_tile = 256;
	job.n_tiles = (job.n4 + job.rows_per_tile - 1) / job.rows_per_tile;

	bytes = (size_t)job.n4 * job.n_tblocks * block_words * sizeof(uint64_t);
	job.bits = aligned_alloc(64, bytes);
	job.scratch = calloc(threads, sizeof(*job.scratch));
	if (!job.bits || !job.scratch) {
		ret = -ENOMEM;
		goto out_free;
	}
	/* Padding words and rows must be zero; real words are all written. */
	memset(job.bits, 0, bytes);
	for (uint32_t t = 0; t < threads; t++) {
		job.scratch[t] = calloc(job.n4, sizeof(uint64_t));
		if (!job.scratch[t]) {
			ret = -ENOMEM;
			goto out_free;
		}
	}
	atomic_init(&job.next, 0);
	ret = nl_coact_run_threads(threads, build_worker, &job);
	if (ret == 0) {
		atomic_store(&job.next, 0);
		ret = nl_coact_run_threads(threads, count_worker, &job);
	}
	if (ret < 0)
		nl_diag(ret, "cannot start %u counting threads", threads);

out_free:
	if (ret == -ENOMEM)
		nl_diag(ret, "out of memory for the bitset kernel (%u neurons x %llu tokens = %zu MiB of bitsets)",
			job.n, (unsigned long long)csr->n_tokens, bytes >> 20);
	if (job.scratch)
		for (uint32_t t = 0; t < threads; t++)
			free(job.scratch[t]);
	free(job.scratch);
	free(job.bits);
	return ret;
}
