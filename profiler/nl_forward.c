/*
 * CPU forward pass of a Llama model (the architecture of llama2.c's run.c):
 * RMSNorm, RoPE on interleaved pairs, grouped-query attention with a KV cache,
 * a gated FFN (SwiGLU or ReGLU), final norm and classifier.
 *
 * Unlike run.c, which runs one token at a time through matrix-vector
 * products, a sequence is processed a block of tokens at a time: each layer
 * multiplies the whole block by each weight matrix (a matrix-matrix product
 * tiled so a few weight rows stay in cache while the block's tokens stream
 * past them), then applies causal attention over the cache. The FFN hook sees
 * the gate activations of the whole block at once.
 *
 * Threads: output rows of the big products (and the tokens of attention) are
 * split over a small pthread pool. For tiny models that does not pay; callers
 * then run one nl_forward per thread with n_threads = 1, which is safe: the
 * state holds only its own buffers and the model is read-only.
 */
#include "nl_forward_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Activation memory per block; long sequences are processed in several blocks. */
#define BLOCK_BYTES (32u << 20)
/* Below this many multiply-adds a product is not worth waking the pool for. */
#define PARALLEL_MIN_FLOPS (1u << 17)
#define TOKEN_TILE 32u

typedef float v8f __attribute__((vector_size(32)));

/*
 * The products are the hot loop: on x86-64 build them twice, for the baseline
 * ISA and for AVX2+FMA (x86-64-v3), and pick at load time (GCC ifunc). Fused
 * multiply-adds need contraction, which ISO C mode turns off by default.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")
#elif defined(__clang__)
#pragma clang fp contract(fast)
#endif
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
	!defined(NL_NO_CLONES)
#define NL_HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define NL_HOT_CLONES
#endif

/* ---- thread pool: run fn(arg, idx, n) on n threads, the caller being idx 0 ---- */

typedef void (*job_fn)(void *arg, uint32_t idx, uint32_t n);

struct pool {
	pthread_t *threads;
	uint32_t n;                  /* threads including the caller */
	uint32_t started;            /* worker threads actually created */
	pthread_mutex_t lock;
	pthread_cond_t work_cv, done_cv;
	uint64_t generation;
	uint32_t pending;
	bool stop;
	job_fn fn;
	void *arg;
};

struct worker_arg {
	struct pool *pool;
	uint32_t idx;
};

static void *worker_main(void *p)
{
	struct worker_arg *wa = p;
	struct pool *pool = wa->pool;
	uint32_t idx = wa->idx;
	uint64_t seen = 0;

	free(wa);
	pthread_mutex_lock(&pool->lock);
	for (;;) {
		while (pool->generation == seen && !pool->stop)
			pthread_cond_wait(&pool->work_cv, &pool->lock);
		if (pool->stop)
			break;
		seen = pool->generation;
		pthread_mutex_unlock(&pool->lock);
		pool->fn(pool->arg, idx, pool->n);
		pthread_mutex_lock(&pool->lock);
		if (--pool->pending == 0)
			pthread_cond_signal(&pool->done_cv);
	}
	pthread_mutex_unlock(&pool->lock);
	return NULL;
}

static void pool_stop(struct pool *pool)
{
	pthread_mutex_lock(&pool->lock);
	pool->stop = true;
	pthread_cond_broadcast(&pool->work_cv);
	pthread_mutex_unlock(&pool->lock);
	for (uint32_t i = 0; i < pool->started; i++)
		pthread_join(pool->threads[i], NULL);
	pthread_mutex_destroy(&pool->lock);
	pthread_cond_destroy(&pool->work_cv);
	pthread_cond_destroy(&pool->done_cv);
	free(pool->threads);
}

static int pool_start(struct pool *pool, uint32_t n)
{
	int err;

	memset(pool, 0, sizeof(*pool));
	pool->n = n;
	pthread_mutex_init(&pool->lock, NULL);
	pthread_cond_init(&pool->work_cv, NULL);
	pthread_cond_init(&pool->done_cv, NULL);
	pool->threads = calloc(n, sizeof(*pool->threads));
	if (!pool->threads)
		goto out_nomem;
	for (uint32_t i = 1; i < n; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));

		if (!wa)
			goto out_nomem;
		wa->pool = pool;
		wa->idx = i;
		err = pthread_create(&pool->threads[pool->started], NULL, worker_main, wa);
		if (err) {
			free(wa);
			pool_stop(pool);
			return nl_diag(-err, "cannot start forward-pass thread %u of %u", i, n);
		}
		pool->started++;
	}
	return 0;
out_nomem:
	pool_stop(pool);
	return nl_diag(-ENOMEM, "out of memory starting %u threads", n);
}

static void pool_run(struct pool *pool, job_fn fn, void *arg, bool parallel)
{
	if (!parallel || pool->n <= 1) {
		fn(arg, 0, 1);
		return;
	}
	pthread_mutex_lock(&pool->lock);
	pool->fn = fn;
	pool->arg = arg;
	pool->pending = pool->n - 1;
	pool->generation++;
	pthread_cond_broadcast(&pool->work_cv);
	pthread_mutex_unlock(&pool->lock);
	fn(arg, 0, pool->n);
	pthread_mutex_lock(&pool->lock);
	while (pool->pending)
		pthread_cond_wait(&pool->done_cv, &pool->lock);
	pthread_mutex_unlock(&pool->lock);
}

/* ---- kernels ---- */

/*
 * Macros rather than functions: passing 32-byte vectors by value without AVX
 * enabled draws GCC's -Wpsabi ABI note.
 */
#define LOAD8(v, p) memcpy(&(v), (p), sizeof(v8f))
#define HSUM8(v) (((v)[0] + (v)[4]) + ((v)[1] + (v)[5]) + (((v)[2] + (v)[6]) + ((v)[3] + (v)[7])))


/*
 * C[t * ldc + o] = sum_i X[t * ldx + i] * W[o * in + i] for tokens t < nt and
 * output rows o in [o0, o1): 4 weight rows x 2 tokens per step, so each load
 * feeds several multiply-adds. Leftover rows and an odd last token go through
 * the same kernel (repeating a row or token, results dropped), so every
 * output is computed by one instruction sequence: the bits do not depend on
 * block boundaries or on how rows are split between threads.
 */
NL_HOT_CLONES
static void matmul_range(float *C, size_t ldc, const float *X, size_t ldx, uint32_t nt,
			 const float *W, uint32_t in, uint32_t o0, uint32_t o1)
{
	for (uint32_t t0 = 0; t0 < nt; t0 += TOKEN_TILE) {
		uint32_t t1 = t0 + TOKEN_TILE < nt ? t0 + TOKEN_TILE : nt;

		for (uint32_t o = o0; o < o1; o += 4) {
			uint32_t rows = o1 - o < 4 ? o1 - o : 4;
			const float *w0 = W + (size_t)o * in;
			const float *w1 = rows > 1 ? w0 + in : w0;
			const float *w2 = rows > 2 ? w0 + 2 * (size_t)in : w0;
			const float *w3 = rows > 3 ? w0 + 3 * (size_t)in : w0;

			for (uint32_t t = t0; t < t1; t += 2) {
				uint32_t toks = t1 - t < 2 ? 1 : 2;
				const float *x0 = X + t * ldx, *x1 = toks > 1 ? x0 + ldx : x0;
				v8f a00 = { 0 }, a01 = { 0 }, a10 = { 0 }, a11 = { 0 };
				v8f a20 = { 0 }, a21 = { 0 }, a30 = { 0 }, a31 = { 0 };
				float s[8];
				uint32_t i = 0;

				for (; i + 8 <= in; i += 8) {
					v8f xv0, xv1, wv;

					LOAD8(xv0, x0 + i);
					LOAD8(xv1, x1 + i);
					LOAD8(wv, w0 + i);
					a00 += wv * xv0;
					a01 += wv * xv1;
					LOAD8(wv, w1 + i);
					a10 += wv * xv0;
					a11 += wv * xv1;
					LOAD8(wv, w2 + i);
					a20 += wv * xv0;
					a21 += wv * xv1;
					LOAD8(wv, w3 + i);
					a30 += wv * xv0;
					a31 += wv * xv1;
				}
				s[0] = HSUM8(a00); s[1] = HSUM8(a01);
				s[2] = HSUM8(a10); s[3] = HSUM8(a11);
				s[4] = HSUM8(a20); s[5] = HSUM8(a21);
				s[6] = HSUM8(a30); s[7] = HSUM8(a31);
				for (; i < in; i++) {
					s[0] += w0[i] * x0[i]; s[1] += w0[i] * x1[i];
					s[2] += w1[i] * x0[i]; s[3] += w1[i] * x1[i];
					s[4] += w2[i] * x0[i]; s[5] += w2[i] * x1[i];
					s[6] += w3[i] * x0[i]; s[7] += w3[i] * x1[i];
				}
				for (uint32_t r = 0; r < rows; r++) {
					C[t * ldc + o + r] = s[2 * r];
					if (toks > 1)
						C[(t + 1) * ldc + o + r] = s[2 * r + 1];
				}
			}
		}
	}
}

struct matmul_job {
	float *C;
	size_t ldc;
	const float *X;
	size_t ldx;
	uint32_t nt;
	const float *W;
	uint32_t in, out;
};

static void matmul_worker(void *arg, uint32_t idx, uint32_t n)
{
	const struct matmul_job *j = arg;
	/* split rows in multiples of 4 so every thread runs the wide kernel */
	uint32_t quads = (j->out + 3) / 4;
	uint32_t o0 = (uint32_t)((uint64_t)quads * idx / n) * 4;
	uint32_t o1 = (uint32_t)((uint64_t)quads * (idx + 1) / n) * 4;

	if (o1 > j->out)
		o1 = j->out;
	if (o0 < o1)
		matmul_range(j->C, j->ldc, j->X, j->ldx, j->nt, j->W, j->in, o0, o1);
}

/* ---- state ---- */

struct nl_forward {
	const struct nl_model *model;
	struct nl_model_config c;
	enum nl_ffn_act act;
	uint32_t head_size, kv_dim, kv_mul;
	uint32_t block_cap;          /* tokens per block */
	uint32_t cache_cap;          /* positions allocated in the KV cache (multiple of 8) */
	float *x;                    /* [block, dim] residual stream */
	float *xb;                   /* [block, dim] normed input / product output */
	float *q;                    /* [block, dim] */
	float *att_out;              /* [block, dim] */
	float *gate;                 /* [block, hidden] */
	float *up;                   /* [block, hidden] */
	float *scores;               /* [n_threads, scores_stride] attention weights */
	size_t scores_stride;        /* seq_len rounded up to 8 */
	float *k_block;              /* [block, kv_dim] keys of the block before transposing */
	float *key_cache;            /* [n_layers, kv_dim, cache_cap]: transposed */
	float *value_cache;          /* [n_layers, cache_cap, kv_dim] */
	float *rope_cos, *rope_sin;  /* [seq_len, head_size / 2] */
	struct pool pool;
};

static void matmul(struct nl_forward *f, float *C, size_t ldc, const float *X, size_t ldx,
		   uint32_t nt, const float *W, uint32_t in, uint32_t out)
{
	struct matmul_job job = { C, ldc, X, ldx, nt, W, in, out };

	pool_run(&f->pool, matmul_worker, &job,
		 (uint64_t)nt * in * out >= PARALLEL_MIN_FLOPS && out >= 8 * f->pool.n);
}

static void rmsnorm(float *out, const float *x, const float *weight, uint32_t n, float eps)
{
	float ss = 0.0f;

	for (uint32_t i = 0; i < n; i++)
		ss += x[i] * x[i];
	ss = 1.0f / sqrtf(ss / (float)n + eps);
	for (uint32_t i = 0; i < n; i++)
		out[i] = weight[i] * (ss * x[i]);
}

/* Rotates interleaved pairs (2i, 2i+1) of each head by pos * theta^(-2i/head_size). */
static void rope(const struct nl_forward *f, float *vec, uint32_t n, uint32_t pos)
{
	uint32_t half = f->head_size / 2;
	const float *cs = f->rope_cos + (size_t)pos * half;
	const float *sn = f->rope_sin + (size_t)pos * half;

	for (uint32_t h = 0; h < n; h += f->head_size)
		for (uint32_t i = 0; i < half; i++) {
			float a = vec[h + 2 * i], b = vec[h + 2 * i + 1];

			vec[h + 2 * i] = a * cs[i] - b * sn[i];
			vec[h + 2 * i + 1] = a * sn[i] + b * cs[i];
		}
}

/*
 * e^x for x in [-87, 0] (attention weights after subtracting the maximum),
 * 8 lanes at a time: Cephes expf (range reduction by ln 2 in two parts, a
 * degree-6 polynomial, scaling by 2^n through the exponent bits), within
 * 1 ulp of e^x over the range (checked), without libm's call and its underflow
 * handling per element.
 */
#define EXP_LO (-87.0f)
#define ROUND_MAGIC 12582912.0f  /* 1.5 * 2^23: adding it rounds to an integer */

typedef int32_t v8i __attribute__((vector_size(32)));

NL_HOT_CLONES
static void exp_neg(float *x, uint32_t n8)
{
	for (uint32_t i = 0; i < n8; i += 8) {
		v8f v, r, y, z, scale;
		v8i e;

		LOAD8(v, x + i);
		r = (v * 1.44269504088896341f + ROUND_MAGIC) - ROUND_MAGIC;
		v = v - r * 0.693359375f;
		v = v - r * -2.12194440e-4f;
		z = v * v;
		y = 1.9875691500e-4f * v + 1.3981999507e-3f;
		y = y * v + 8.3334519073e-3f;
		y = y * v + 4.1665795894e-2f;
		y = y * v + 1.6666665459e-1f;
		y = y * v + 5.0000001201e-1f;
		y = y * z + v + 1.0f;
		e = (__builtin_convertvector(r, v8i) + 127) << 23;
		memcpy(&scale, &e, sizeof(scale));
		y = y * scale;
		memcpy(x + i, &y, sizeof(y));
	}
}

/*
 * One query row (token at pos, one head) against the cache: scores along the
 * transposed keys (head_size axpy passes over positions, which vectorise for
 * any head size), softmax, then the weighted sum of the values.
 */
NL_HOT_CLONES
static void attend(float *out, const float *q, const float *kt, size_t kt_stride,
		   const float *vc, size_t v_stride, uint32_t hs, uint32_t pos, float *att)
{
	uint32_t len = pos + 1, len8 = (len + 7) & ~7u;
	float scale = 1.0f / sqrtf((float)hs), max, sum = 0.0f;

	/* 8 positions at a time, summing over the head in registers */
	for (uint32_t s = 0; s < len8; s += 8) {
		v8f a = { 0 };

		for (uint32_t i = 0; i < hs; i++) {
			v8f kv;

			LOAD8(kv, kt + i * kt_stride + s);
			a += (q[i] * scale) * kv;
		}
		memcpy(att + s, &a, sizeof(a));
	}
	/* four running maxima and sums: independent chains instead of one long one */
	{
		float m[4] = { att[0], att[0], att[0], att[0] };
		uint32_t s = 0;

		for (; s + 4 <= len; s += 4)
			for (uint32_t k = 0; k < 4; k++)
				m[k] = att[s + k] > m[k] ? att[s + k] : m[k];
		for (; s < len; s++)
			m[0] = att[s] > m[0] ? att[s] : m[0];
		max = m[0];
		for (uint32_t k = 1; k < 4; k++)
			max = m[k] > max ? m[k] : max;
	}
	for (uint32_t s = 0; s < len8; s++) {
		float d = att[s] - max;

		att[s] = d > EXP_LO ? d : EXP_LO;
	}
	exp_neg(att, len8);
	for (uint32_t s = len; s < len8; s++)
		att[s] = 0.0f;
	{
		v8f acc = { 0 };

		for (uint32_t s = 0; s < len8; s += 8) {
			v8f a;

			LOAD8(a, att + s);
			acc += a;
		}
		sum = 1.0f / HSUM8(acc);
	}
	for (uint32_t s = 0; s < len; s++)
		att[s] *= sum;
	/* the weighted values 8 dimensions at a time, summing over positions in registers */
	for (uint32_t i = 0; i + 8 <= hs; i += 8) {
		v8f o0 = { 0 }, o1 = { 0 }, o2 = { 0 }, o3 = { 0 };
		uint32_t s = 0;

		for (; s + 4 <= len; s += 4) {
			v8f v0, v1, v2, v3;

			LOAD8(v0, vc + s * v_stride + i);
			LOAD8(v1, vc + (s + 1) * v_stride + i);
			LOAD8(v2, vc + (s + 2) * v_stride + i);
			LOAD8(v3, vc + (s + 3) * v_stride + i);
			o0 += att[s] * v0;
			o1 += att[s + 1] * v1;
			o2 += att[s + 2] * v2;
			o3 += att[s + 3] * v3;
		}
		for (; s < len; s++) {
			v8f v0;

			LOAD8(v0, vc + s * v_stride + i);
			o0 += att[s] * v0;
		}
		o0 = (o0 + o1) + (o2 + o3);
		memcpy(out + i, &o0, sizeof(o0));
	}
	for (uint32_t i = hs & ~7u; i < hs; i++) {
		float o = 0.0f;

		for (uint32_t s = 0; s < len; s++)
			o += att[s] * vc[s * v_stride + i];
		out[i] = o;
	}
}

struct attn_job {
	struct nl_forward *f;
	uint32_t layer, pos0, nt;
};

static void attn_worker(void *arg, uint32_t idx, uint32_t n)
{
	const struct attn_job *j = arg;
	struct nl_forward *f = j->f;
	uint32_t hs = f->head_size, kv_dim = f->kv_dim;
	size_t cap = f->cache_cap;
	const float *kt = f->key_cache + (size_t)j->layer * kv_dim * cap;
	const float *vc = f->value_cache + (size_t)j->layer * cap * kv_dim;
	float *att = f->scores + (size_t)idx * f->scores_stride;

	/* tokens interleaved over threads: later tokens attend further */
	for (uint32_t t = idx; t < j->nt; t += n)
		for (uint32_t h = 0; h < f->c.n_heads; h++) {
			uint32_t kvo = (h / f->kv_mul) * hs;

			attend(f->att_out + (size_t)t * f->c.dim + h * hs,
			       f->q + (size_t)t * f->c.dim + h * hs, kt + kvo * cap, cap,
			       vc + kvo, kv_dim, hs, j->pos0 + t, att);
		}
}

static void free_buffers(struct nl_forward *f)
{
	free(f->x);
	free(f->xb);
	free(f->q);
	free(f->att_out);
	free(f->gate);
	free(f->up);
	free(f->scores);
	free(f->k_block);
	free(f->key_cache);
	free(f->value_cache);
	free(f->rope_cos);
	free(f->rope_sin);
}

int nl_forward_create(struct nl_forward **out, const struct nl_model *m, enum nl_ffn_act act,
		      uint32_t n_threads)
{
	struct nl_forward *f;
	const struct nl_model_config *c = nl_model_get_config(m);
	size_t per_token, dim, hidden;
	uint32_t half;
	int err;

	*out = NULL;
	if (act != NL_FFN_SWIGLU && act != NL_FFN_RELU)
		return nl_diag(NL_E_INVAL, "unknown FFN activation %d", (int)act);
	if (n_threads == 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);

		n_threads = cpus > 0 ? (uint32_t)cpus : 1;
	}
	if (n_threads > 256)
		return nl_diag(NL_E_INVAL, "%u threads requested, at most 256", n_threads);
	f = calloc(1, sizeof(*f));
	if (!f)
		return nl_diag(-ENOMEM, "out of memory");
	f->model = m;
	f->c = *c;
	f->act = act;
	f->head_size = c->dim / c->n_heads;
	f->kv_dim = f->head_size * c->n_kv_heads;
	f->kv_mul = c->n_heads / c->n_kv_heads;
	dim = c->dim;
	hidden = c->hidden_dim;
	per_token = (4 * dim + 2 * hidden) * sizeof(float);
	f->block_cap = (uint32_t)(BLOCK_BYTES / per_token);
	if (f->block_cap < 16)
		f->block_cap = 16;
	if (f->block_cap > c->seq_len)
		f->block_cap = c->seq_len;
	half = f->head_size / 2;
	f->x = malloc(f->block_cap * dim * sizeof(float));
	f->xb = malloc(f->block_cap * dim * sizeof(float));
	f->q = malloc(f->block_cap * dim * sizeof(float));
	f->att_out = malloc(f->block_cap * dim * sizeof(float));
	f->gate = malloc(f->block_cap * hidden * sizeof(float));
	f->up = malloc(f->block_cap * hidden * sizeof(float));
	f->scores_stride = ((size_t)c->seq_len + 7) & ~(size_t)7;
	f->scores = malloc((size_t)n_threads * f->scores_stride * sizeof(float));
	f->k_block = malloc(f->block_cap * (size_t)f->kv_dim * sizeof(float));
	f->rope_cos = malloc((size_t)c->seq_len * half * sizeof(float));
	f->rope_sin = malloc((size_t)c->seq_len * half * sizeof(float));
	if (!f->x || !f->xb || !f->q || !f->att_out || !f->gate || !f->up || !f->scores || !f->k_block ||
	    !f->rope_cos || !f->rope_sin) {
		err = nl_diag(-ENOMEM, "out of memory for forward-pass buffers (%u tokens "
			      "per block)", f->block_cap);
		goto out_free;
	}
	for (uint32_t pos = 0; pos < c->seq_len; pos++)
		for (uint32_t i = 0; i < half; i++) {
			double freq = pow((double)c->rope_theta, -(double)(2 * i) / f->head_size);
			double angle = pos * freq;

			f->rope_cos[(size_t)pos * half + i] = (float)cos(angle);
			f->rope_sin[(size_t)pos * half + i] = (float)sin(angle);
		}
	err = pool_start(&f->pool, n_threads);
	if (err)
		goto out_free;
	*out = f;
	return 0;
out_free:
	free_buffers(f);
	free(f);
	return err;
}

void nl_forward_free(struct nl_forward *f)
{
	if (!f)
		return;
	pool_stop(&f->pool);
	free_buffers(f);
	free(f);
}

int nl_forward_set_block(struct nl_forward *f, uint32_t tokens)
{
	/* buffers were sized for block_cap tokens: only shrink */
	if (tokens == 0 || tokens > f->block_cap)
		return nl_diag(NL_E_INVAL, "block of %u tokens, expected 1..%u", tokens,
			       f->block_cap);
	f->block_cap = tokens;
	return 0;
}

static int reserve_cache(struct nl_forward *f, uint32_t n)
{
	size_t floats;
	float *k, *v;

	n = (n + 7) & ~7u;  /* attention reads keys 8 positions at a time */
	if (n <= f->cache_cap)
		return 0;
	floats = (size_t)f->c.n_layers * n * f->kv_dim;
	/* zeroed: the lanes past a row's last position are read, never used */
	k = calloc(floats, sizeof(float));
	v = malloc(floats * sizeof(float));
	if (!k || !v) {
		free(k);
		free(v);
		return nl_diag(-ENOMEM, "out of memory for a KV cache of %u positions", n);
	}
	free(f->key_cache);
	free(f->value_cache);
	f->key_cache = k;
	f->value_cache = v;
	f->cache_cap = n;
	return 0;
}

/* One block of tokens [pos0, pos0 + nt) through every layer. */
static int forward_block(struct nl_forward *f, const uint32_t *tokens, uint32_t pos0,
			 uint32_t nt, nl_ffn_hook hook, void *ctx, float *logits)
{
	const struct nl_model_weights *w = nl_model_get_weights(f->model);
	const struct nl_model_config *c = &f->c;
	uint32_t dim = c->dim, hidden = c->hidden_dim, kv_dim = f->kv_dim;
	int err;

	for (uint32_t t = 0; t < nt; t++)
		memcpy(f->x + (size_t)t * dim, w->token_embedding + (size_t)tokens[t] * dim,
		       dim * sizeof(float));
	for (uint32_t l = 0; l < c->n_layers; l++) {
		const struct nl_layer_weights *lw = &w->layers[l];
		float *kt = f->key_cache + (size_t)l * kv_dim * f->cache_cap;
		float *kc = f->k_block;
		float *vc = f->value_cache + ((size_t)l * f->cache_cap + pos0) * kv_dim;
		struct attn_job attn = { f, l, pos0, nt };

		/* attention */
		for (uint32_t t = 0; t < nt; t++)
			rmsnorm(f->xb + (size_t)t * dim, f->x + (size_t)t * dim, lw->attn_norm, dim,
				c->rms_eps);
		matmul(f, f->q, dim, f->xb, dim, nt, lw->wq, dim, dim);
		matmul(f, kc, kv_dim, f->xb, dim, nt, lw->wk, dim, kv_dim);
		matmul(f, vc, kv_dim, f->xb, dim, nt, lw->wv, dim, kv_dim);
		for (uint32_t t = 0; t < nt; t++) {
			rope(f, f->q + (size_t)t * dim, dim, pos0 + t);
			rope(f, kc + (size_t)t * kv_dim, kv_dim, pos0 + t);
			for (uint32_t i = 0; i < kv_dim; i++)
				kt[(size_t)i * f->cache_cap + pos0 + t] = kc[(size_t)t * kv_dim + i];
		}
		pool_run(&f->pool, attn_worker, &attn,
			 (uint64_t)nt * (pos0 + nt) * dim >= PARALLEL_MIN_FLOPS);
		matmul(f, f->xb, dim, f->att_out, dim, nt, lw->wo, dim, dim);
		for (size_t i = 0; i < (size_t)nt * dim; i++)
			f->x[i] += f->xb[i];

		/* FFN: act(x W_gate) * (x W_up), then W_down */
		for (uint32_t t = 0; t < nt; t++)
			rmsnorm(f->xb + (size_t)t * dim, f->x + (size_t)t * dim, lw->ffn_norm, dim,
				c->rms_eps);
		matmul(f, f->gate, hidden, f->xb, dim, nt, lw->w_gate, dim, hidden);
		matmul(f, f->up, hidden, f->xb, dim, nt, lw->w_up, dim, hidden);
		if (f->act == NL_FFN_SWIGLU) {
			for (size_t i = 0; i < (size_t)nt * hidden; i++)
				f->gate[i] = f->gate[i] / (1.0f + expf(-f->gate[i]));
		} else {
			for (size_t i = 0; i < (size_t)nt * hidden; i++)
				f->gate[i] = f->gate[i] > 0.0f ? f->gate[i] : 0.0f;
		}
		if (hook) {
			err = hook(ctx, l, pos0, nt, f->gate, hidden);
			if (err)
				return err;
		}
		for (size_t i = 0; i < (size_t)nt * hidden; i++)
			f->up[i] *= f->gate[i];
		matmul(f, f->xb, dim, f->up, hidden, nt, lw->w_down, hidden, dim);
		for (size_t i = 0; i < (size_t)nt * dim; i++)
			f->x[i] += f->xb[i];
	}
	if (logits) {
		for (uint32_t t = 0; t < nt; t++)
			rmsnorm(f->xb + (size_t)t * dim, f->x + (size_t)t * dim, w->final_norm, dim,
				c->rms_eps);
		matmul(f, logits + (size_t)pos0 * c->vocab_size, c->vocab_size, f->xb, dim, nt,
		       w->classifier, dim, c->vocab_size);
	}
	return 0;
}

int nl_forward_sequence(struct nl_forward *f, const uint32_t *tokens, size_t n,
			nl_ffn_hook hook, void *ctx, float *logits)
{
	int err;

	if (n == 0)
		return 0;
	if (n > f->c.seq_len)
		return nl_diag(NL_E_INVAL, "sequence of %zu tokens is longer than the model's "
			       "context (seq_len %u); cut it with --max-tokens", n, f->c.seq_len);
	for (size_t t = 0; t < n; t++)
		if (tokens[t] >= f->c.vocab_size)
			return nl_diag(NL_E_INVAL, "token %zu has id %u, the vocabulary has %u",
				       t, tokens[t], f->c.vocab_size);
	err = reserve_cache(f, (uint32_t)n);
	if (err)
		return err;
	for (size_t pos0 = 0; pos0 < n; pos0 += f->block_cap) {
		uint32_t nt = (uint32_t)(n - pos0 < f->block_cap ? n - pos0 : f->block_cap);

		err = forward_block(f, tokens + pos0, (uint32_t)pos0, nt, hook, ctx, logits);
		if (err)
			return err;
	}
	return 0;
}

double nl_forward_nll_sum(const float *logits, const uint32_t *tokens, size_t n, uint32_t vocab)
{
	double total = 0.0;

	for (size_t t = 0; t + 1 < n; t++) {
		const float *row = logits + t * vocab;
		double max = row[0], sum = 0.0;

		for (uint32_t i = 1; i < vocab; i++)
			if (row[i] > max)
				max = row[i];
		for (uint32_t i = 0; i < vocab; i++)
			sum += exp(row[i] - max);
		total += max + log(sum) - row[tokens[t + 1]];
	}
	return total;
}
