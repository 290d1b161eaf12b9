/*
 * Synthetic activation traces at real model shapes, for benchmarks of the
 * co-activation and placement stages at 7B scale. Never used for quality
 * claims; docs/profiling.md compares its statistics with real traces.
 *
 * Model of one layer (all draws independent given the layer's parameters):
 *  - a seeded permutation pi of the neurons gives their "hotness" order, so
 *    hot neurons and groups are scattered over model order and the identity
 *    placement has no advantage;
 *  - neuron pi[r] has power-law weight w_r = (r + 1)^-s (normalised);
 *  - consecutive runs of group_size neurons in hotness order form the
 *    co-activation groups; group g has weight r_g = mean of its members' w;
 *  - per token, group g fires with probability q_g = 1 - exp(-A (1 - noise) r_g)
 *    and then each member fires with probability `coherence`; independently
 *    neuron pi[r] fires as noise with probability e_r = 1 - exp(-A noise w_r);
 *  - A is solved by bisection so that the expected density equals `density`.
 * So P(neuron r active) = 1 - (1 - coherence q_g(r)) (1 - e_r).
 *
 * Sampling is O(active) per token, not O(neurons): the probabilities are
 * sorted (they decrease along the hotness order), cut into buckets whose
 * probabilities lie within a factor of two, and each bucket is sampled by
 * geometric skips at its largest probability followed by thinning.
 *
 * Determinism: the permutation comes from (seed, layer); tokens are generated
 * in blocks of NL_SYNTH_BLOCK, each with its own random stream keyed by
 * (seed, layer, block), so results never depend on how work is split.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "nl_profile.h"
#include "nl_rng.h"

#define NL_SYNTH_BLOCK 1024u

/* Probability p in [0, 1] as a 32-bit threshold: event iff (32 random bits) < thr. */
static inline uint64_t prob_threshold32(double p)
{
	if (!(p > 0))
		return 0;
	if (p >= 1)
		return 1ull << 32;
	return (uint64_t)(p * 0x1.0p32);
}

/* ---- Poisson variates ---- */

static inline double rng_unit(struct nl_rng *r)
{
	return (double)(nl_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Inversion by sequential search: expected lambda + 1 steps; for small lambda. */
static uint32_t poisson_small(struct nl_rng *r, double lambda, double exp_neg_lambda)
{
	double u = rng_unit(r), p = exp_neg_lambda, cdf = p;
	uint32_t k = 0;

	while (u > cdf && k < 4096) {
		k++;
		p *= lambda / k;
		cdf += p;
	}
	return k;
}

/* Hoermann's PTRS transformed rejection (1993), exact, for lambda >= 10. */
static uint32_t poisson_ptrs(struct nl_rng *r, double lambda)
{
	double slam = sqrt(lambda), loglam = log(lambda);
	double b = 0.931 + 2.53 * slam, a = -0.059 + 0.02483 * b;
	double invalpha = 1.1239 + 1.1328 / (b - 3.4), vr = 0.9277 - 3.6224 / (b - 2);

	for (;;) {
		double u = rng_unit(r) - 0.5, v = rng_unit(r), us = 0.5 - fabs(u), k, lg;
		int sign;

		k = floor((2 * a / us + b) * u + lambda + 0.43);
		if (us >= 0.07 && v <= vr)
			return (uint32_t)k;
		if (k < 0 || (us < 0.013 && v > us))
			continue;
		lg = lgamma_r(k + 1, &sign);
		if (log(v) + log(invalpha) - log(a / (us * us) + b) <= -lambda + k * loglam - lg)
			return (uint32_t)k;
	}
}

/* ---- independent Bernoulli draws over a descending probability array ---- */

/*
 * Element i must fire with probability p_i, independently. Elements with
 * p_i > 1/4 get one uniform each. The others are grouped in buckets where
 * mu_i = -log(1 - p_i) lies within a factor 2 of the bucket's largest, mu_max.
 * A bucket of size m receives K ~ Poisson(m mu_max) hits at uniform positions,
 * each kept with probability mu_i / mu_max; element i is then hit
 * Poisson(mu_i) times, so it fires (>= 1 kept hit) with probability
 * 1 - exp(-mu_i) = p_i, independently of the others (Poisson splitting).
 * Cost: O(expected fires) per token plus one variate per bucket.
 * Elements can be hit twice: callers de-duplicate (bitmaps).
 */
struct bucket {
	uint32_t first, size;    /* element range [first, first + size) */
	bool direct;             /* one uniform per element */
	double lambda;           /* Poisson mean of the hits */
	double exp_neg_lambda;
};

struct bern_set {
	uint32_t n;
	uint64_t *accept;        /* [n] 32-bit thresholds: mu_i / mu_max, or p_i when direct */
	struct bucket *buckets;
	uint32_t n_buckets;
};

#define BERN_MAX_BUCKETS 2100

static void bern_free(struct bern_set *b)
{
	free(b->accept);
	free(b->buckets);
	memset(b, 0, sizeof(*b));
}

/* p must be non-increasing. */
static int bern_init(struct bern_set *b, const double *p, uint32_t n)
{
	uint32_t i = 0;

	memset(b, 0, sizeof(*b));
	b->n = n;
	b->accept = malloc((size_t)n * sizeof(*b->accept) + 1);
	/* One bucket per octave of mu: ~1100 even down to denormals; the tail is capped. */
	b->buckets = malloc(sizeof(*b->buckets) * BERN_MAX_BUCKETS);
	if (!b->accept || !b->buckets) {
		bern_free(b);
		return -ENOMEM;
	}
	while (i < n && p[i] > 0) {
		struct bucket *bk = &b->buckets[b->n_buckets++];
		bool last = b->n_buckets == BERN_MAX_BUCKETS;
		double mu_max = -log1p(-(p[i] < 1 ? p[i] : 0.5));
		uint32_t j = i;

		bk->first = i;
		bk->direct = p[i] > 0.25;
		if (bk->direct) {
			while (j < n && p[j] > 0.25) {
				b->accept[j] = prob_threshold32(p[j]);
				j++;
			}
		} else {
			while (j < n && p[j] > 0 && (last || -log1p(-p[j]) * 2 >= mu_max)) {
				b->accept[j] = prob_threshold32(-log1p(-p[j]) / mu_max);
				j++;
			}
		}
		bk->size = j - i;
		bk->lambda = bk->direct ? 0 : mu_max * bk->size;
		bk->exp_neg_lambda = exp(-bk->lambda);
		i = j;
		if (last)
			break;
	}
	return 0;
}

/* Calls FIRE(i) for each element that fires (possibly twice, in any order). */
#define BERN_SAMPLE(b, r, FIRE)                                                        \
	do {                                                                           \
		for (uint32_t bi_ = 0; bi_ < (b)->n_buckets; bi_++) {                  \
			const struct bucket *bk_ = &(b)->buckets[bi_];                 \
			uint32_t k_;                                                   \
			if (bk_->direct) {                                             \
				for (uint32_t i_ = bk_->first; i_ < bk_->first + bk_->size; i_++) \
					if ((nl_rng_next(r) >> 32) < (b)->accept[i_])  \
						FIRE(i_);                              \
				continue;                                              \
			}                                                              \
			k_ = bk_->lambda < 10 ? poisson_small(r, bk_->lambda, bk_->exp_neg_lambda) \
					      : poisson_ptrs(r, bk_->lambda);          \
			while (k_--) {                                                 \
				uint64_t x_ = nl_rng_next(r);                          \
				uint32_t i_ = bk_->first + (uint32_t)(((x_ >> 32) * bk_->size) >> 32); \
				if ((x_ & 0xffffffffu) < (b)->accept[i_])              \
					FIRE(i_);                                      \
			}                                                              \
		}                                                                      \
	} while (0)

/* ---- parameters ---- */

void nl_synth_defaults(struct nl_synth_params *p)
{
	memset(p, 0, sizeof(*p));
	nl_synth_shape(&p->model, "opt-6.7b");
	p->n_tokens = 10000;
	p->density = 0.03;
	/* Calibrated on stories260K traces (docs/profiling.md): frequency skew and
	 * top-8 partner correlation fall inside the range measured on real data. */
	p->zipf_s = 0.6;
	p->group_size = 8;
	p->coherence = 0.7;
	p->noise = 0.5;
	p->seed = 1;
}

int nl_synth_shape(struct nl_model_id *id, const char *spec)
{
	unsigned long layers, neurons, d_model = 0;
	char *end;

	memset(id, 0, sizeof(*id));
	if (!spec)
		return nl_diag(NL_E_INVAL, "synthetic shape: none given; use opt-6.7b, llama-2-7b or LxN[xD]");
	if (!strcasecmp(spec, "opt-6.7b")) {
		layers = 32;
		neurons = 16384;
		d_model = 4096;
	} else if (!strcasecmp(spec, "llama-2-7b")) {
		layers = 32;
		neurons = 11008;
		d_model = 4096;
	} else {
		errno = 0;
		layers = strtoul(spec, &end, 10);
		if (end == spec || (*end != 'x' && *end != 'X') || errno)
			goto bad;
		spec = end + 1;
		neurons = strtoul(spec, &end, 10);
		if (end == spec || errno)
			goto bad;
		if (*end == 'x' || *end == 'X') {
			spec = end + 1;
			d_model = strtoul(spec, &end, 10);
			if (end == spec || errno)
				goto bad;
		}
		if (*end)
			goto bad;
		if (!layers || layers > NL_MAX_LAYERS || !neurons || neurons > (1ul << 24) ||
		    d_model > (1ul << 24))
			return nl_diag(NL_E_INVAL, "synthetic shape '%lux%lu': layers must be 1..%d and neurons 1..%lu",
				       layers, neurons, NL_MAX_LAYERS, 1ul << 24);
		if (!d_model)
			d_model = neurons / 4 ? neurons / 4 : 1;
		snprintf(id->name, sizeof(id->name), "synthetic-%lux%lu", layers, neurons);
		goto done;
	}
	snprintf(id->name, sizeof(id->name), "synthetic-%s", spec);
	for (char *c = id->name; *c; c++)
		if (*c >= 'A' && *c <= 'Z')
			*c = (char)(*c - 'A' + 'a');
done:
	id->n_layers = (uint32_t)layers;
	id->n_neurons = (uint32_t)neurons;
	id->d_model = (uint32_t)d_model;
	return 0;
bad:
	return nl_diag(NL_E_INVAL, "synthetic shape '%s': expected opt-6.7b, llama-2-7b or LAYERSxNEURONS[xDMODEL] like 32x16384",
		       spec);
}

static int check_params(const struct nl_synth_params *p, uint32_t layer)
{
	if (!p->model.n_neurons || !p->model.n_layers)
		return nl_diag(NL_E_INVAL, "synthetic: model shape %ux%u has no neurons; set model.n_layers and model.n_neurons",
			       p->model.n_layers, p->model.n_neurons);
	if (layer >= p->model.n_layers)
		return nl_diag(NL_E_INVAL, "synthetic: layer %u out of range, the shape has %u layers",
			       layer, p->model.n_layers);
	if (!(p->density > 0 && p->density < 1))
		return nl_diag(NL_E_INVAL, "synthetic: density %g out of range, expected 0 < density < 1", p->density);
	if (!(p->coherence > 0 && p->coherence <= 1))
		return nl_diag(NL_E_INVAL, "synthetic: coherence %g out of range, expected 0 < coherence <= 1",
			       p->coherence);
	if (!(p->noise >= 0 && p->noise <= 1))
		return nl_diag(NL_E_INVAL, "synthetic: noise %g out of range, expected 0 <= noise <= 1", p->noise);
	if (!(p->zipf_s >= 0 && p->zipf_s <= 8))
		return nl_diag(NL_E_INVAL, "synthetic: zipf_s %g out of range, expected 0 <= zipf_s <= 8", p->zipf_s);
	if (!p->group_size || p->group_size > p->model.n_neurons)
		return nl_diag(NL_E_INVAL, "synthetic: group_size %u out of range, expected 1..%u (neurons per layer)",
			       p->group_size, p->model.n_neurons);
	if (p->noise == 0 && p->density >= p->coherence * 0.999)
		return nl_diag(NL_E_INVAL, "synthetic: density %g unreachable with noise 0 and coherence %g; lower the density or add noise",
			       p->density, p->coherence);
	if (p->n_tokens > (1ull << 40))
		return nl_diag(NL_E_INVAL, "synthetic: %llu tokens is too many", (unsigned long long)p->n_tokens);
	return 0;
}

/* Per-layer model: probabilities along the hotness order. */
struct synth_layer {
	uint32_t n, group_size, n_groups;
	uint32_t *order;         /* [n] hotness rank -> neuron id */
	struct bern_set groups;  /* [n_groups] firing probability q_g */
	struct bern_set noise;   /* [n] noise probability e_r */
	uint32_t member_thr;     /* coherence as a 16-bit threshold (1 << 16 = always) */
	bool all_members;
};

static void synth_layer_free(struct synth_layer *s)
{
	free(s->order);
	bern_free(&s->groups);
	bern_free(&s->noise);
}

static double expected_active(const double *w, const double *rg, uint32_t n, uint32_t gsz,
			      double coherence, double noise, double a)
{
	double sum = 0;

	for (uint32_t r = 0; r < n; r++) {
		double q = -expm1(-a * (1 - noise) * rg[r / gsz]);
		double e = -expm1(-a * noise * w[r]);

		sum += 1 - (1 - coherence * q) * (1 - e);
	}
	return sum;
}

static int synth_layer_init(struct synth_layer *s, const struct nl_synth_params *p, uint32_t layer)
{
	uint32_t n = p->model.n_neurons, gsz = p->group_size;
	double *w = NULL, *rg = NULL, *q = NULL, *e = NULL;
	double wsum = 0, target = p->density * n, lo, hi;
	struct nl_rng rng;
	int err = -ENOMEM;

	memset(s, 0, sizeof(*s));
	s->n = n;
	s->group_size = gsz;
	s->n_groups = (n + gsz - 1) / gsz;
	s->order = malloc((size_t)n * sizeof(*s->order));
	w = malloc((size_t)n * sizeof(*w));
	e = malloc((size_t)n * sizeof(*e));
	rg = calloc(s->n_groups, sizeof(*rg));
	q = malloc((size_t)s->n_groups * sizeof(*q));
	if (!s->order || !w || !e || !rg || !q)
		goto out;

	/* Hotness order: a Fisher-Yates shuffle keyed by (seed, layer). */
	nl_rng_seed(&rng, p->seed, 0x5e7f00d, layer);
	for (uint32_t i = 0; i < n; i++)
		s->order[i] = i;
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j = nl_rng_below(&rng, i + 1);
		uint32_t t = s->order[i];

		s->order[i] = s->order[j];
		s->order[j] = t;
	}

	for (uint32_t r = 0; r < n; r++) {
		w[r] = pow((double)r + 1, -p->zipf_s);
		wsum += w[r];
	}
	for (uint32_t r = 0; r < n; r++) {
		w[r] /= wsum;
		rg[r / gsz] += w[r];
	}
	for (uint32_t g = 0; g < s->n_groups; g++) {
		uint32_t members = (g + 1) * gsz <= n ? gsz : n - g * gsz;

		rg[g] /= members;
	}

	/* Bisection on log A: the expected count is increasing in A. */
	lo = 1e-12;
	hi = 1e-12;
	while (expected_active(w, rg, n, gsz, p->coherence, p->noise, hi) < target) {
		hi *= 4;
		if (hi > 1e30) {
			err = nl_diag(NL_E_INVAL, "synthetic: density %g unreachable with coherence %g and noise %g",
				      p->density, p->coherence, p->noise);
			goto out;
		}
	}
	for (int it = 0; it < 200 && hi / lo > 1 + 1e-12; it++) {
		double mid = sqrt(lo * hi);

		if (expected_active(w, rg, n, gsz, p->coherence, p->noise, mid) < target)
			lo = mid;
		else
			hi = mid;
	}

	for (uint32_t g = 0; g < s->n_groups; g++)
		q[g] = -expm1(-hi * (1 - p->noise) * rg[g]);
	for (uint32_t r = 0; r < n; r++)
		e[r] = -expm1(-hi * p->noise * w[r]);
	err = bern_init(&s->groups, q, s->n_groups);
	if (err)
		goto out;
	err = bern_init(&s->noise, e, n);
	if (err)
		goto out;
	s->member_thr = p->coherence >= 1 ? 1u << 16 : (uint32_t)(p->coherence * 65536.0);
	s->all_members = p->coherence >= 1;
	err = 0;
out:
	if (err)
		synth_layer_free(s);
	free(w);
	free(e);
	free(rg);
	free(q);
	return err;
}

struct synth_out {
	uint64_t *indptr;
	uint32_t *indices;
	uint64_t used, cap;
};

static int out_reserve(struct synth_out *o, uint64_t extra)
{
	uint64_t need = o->used + extra;
	uint32_t *grown;
	uint64_t cap;

	if (need <= o->cap)
		return 0;
	cap = o->cap + o->cap / 2;
	if (cap < need)
		cap = need;
	grown = realloc(o->indices, cap * sizeof(*grown));
	if (!grown)
		return -ENOMEM;
	o->indices = grown;
	o->cap = cap;
	return 0;
}

/* One block of tokens with its own random stream; appends rows in order. */
static int synth_block(const struct synth_layer *s, const struct nl_synth_params *p,
		       uint32_t layer, uint64_t block, uint64_t tok0, uint64_t n_tok,
		       uint64_t *bitmap, struct synth_out *o)
{
	uint32_t n_words = (s->n + 63) / 64, g_words = (s->n_groups + 63) / 64;
	uint64_t *gbits = bitmap + n_words;   /* groups that fired in this token */
	struct nl_rng rng;
	struct nl_rng *r = &rng;

	nl_rng_seed(&rng, p->token_seed ? p->token_seed : p->seed,
		    ((uint64_t)layer << 32) | 0xb10c, block);
	for (uint64_t t = 0; t < n_tok; t++) {
		int err;

#define SET_BIT(map, id) ((map)[(id) >> 6] |= 1ull << ((id) & 63))
#define FIRE_GROUP(g) SET_BIT(gbits, g)
#define FIRE_NOISE(rank) SET_BIT(bitmap, s->order[rank])
		BERN_SAMPLE(&s->groups, r, FIRE_GROUP);
		BERN_SAMPLE(&s->noise, r, FIRE_NOISE);
		/* Each group that fired (once, whatever its hit count): members by coherence. */
		for (uint32_t gw = 0; gw < g_words; gw++) {
			uint64_t bits = gbits[gw];

			while (bits) {
				uint32_t g = gw * 64 + (uint32_t)__builtin_ctzll(bits);
				uint32_t m0 = g * s->group_size;
				uint32_t m1 = m0 + s->group_size < s->n ? m0 + s->group_size : s->n;
				uint64_t coins = 0;

				bits &= bits - 1;
				/* Four 16-bit coins per random word. */
				for (uint32_t m = m0, c = 0; m < m1; m++, c = (c + 1) & 3) {
					if (!c)
						coins = nl_rng_next(r);
					if (s->all_members || ((coins >> (16 * c)) & 0xffff) < s->member_thr)
						SET_BIT(bitmap, s->order[m]);
				}
			}
			gbits[gw] = 0;
		}
#undef FIRE_NOISE
#undef FIRE_GROUP
#undef SET_BIT
		/* At most every neuron: the check is cheaper than counting bits first. */
		err = out_reserve(o, s->n);
		if (err)
			return err;
		for (uint32_t wi = 0; wi < n_words; wi++) {
			uint64_t bits = bitmap[wi];

			while (bits) {
				o->indices[o->used++] = wi * 64 + (uint32_t)__builtin_ctzll(bits);
				bits &= bits - 1;
			}
			bitmap[wi] = 0;
		}
		o->indptr[tok0 + t + 1] = o->used;
	}
	return 0;
}

int nl_synth_layer(const struct nl_synth_params *p, uint32_t layer, struct nl_csr *out)
{
	struct synth_layer s;
	struct synth_out o = { 0 };
	uint64_t *bitmap = NULL;
	uint64_t n_blocks;
	int err;

	memset(out, 0, sizeof(*out));
	err = check_params(p, layer);
	if (err)
		return err;
	err = synth_layer_init(&s, p, layer);
	if (err)
		return err == -ENOMEM ? nl_diag(err, "synthetic: out of memory for %u neurons", p->model.n_neurons) : err;

	err = -ENOMEM;
	o.indptr = malloc((p->n_tokens + 1) * sizeof(*o.indptr));
	bitmap = calloc((s.n + 63) / 64 + (s.n_groups + 63) / 64, sizeof(*bitmap));
	if (!o.indptr || !bitmap)
		goto fail;
	o.indptr[0] = 0;
	/* Start at the expected size plus a margin; grows when a layer runs denser. */
	err = out_reserve(&o, (uint64_t)(p->density * s.n * (double)p->n_tokens * 1.02) + s.n);
	if (err)
		goto fail;

	n_blocks = (p->n_tokens + NL_SYNTH_BLOCK - 1) / NL_SYNTH_BLOCK;
	for (uint64_t b = 0; b < n_blocks; b++) {
		uint64_t tok0 = b * NL_SYNTH_BLOCK;
		uint64_t n_tok = p->n_tokens - tok0 < NL_SYNTH_BLOCK ? p->n_tokens - tok0 : NL_SYNTH_BLOCK;

		err = synth_block(&s, p, layer, b, tok0, n_tok, bitmap, &o);
		if (err)
			goto fail;
	}

	out->n_tokens = p->n_tokens;
	out->n_neurons = s.n;
	out->indptr = o.indptr;
	out->indices = o.indices;
	if (!out->indices) {
		/* Zero tokens: keep a valid (non-NULL) indices array. */
		out->indices = malloc(sizeof(*out->indices));
		if (!out->indices) {
			err = -ENOMEM;
			out->indptr = NULL;
			goto fail;
		}
	}
	free(bitmap);
	synth_layer_free(&s);
	return 0;
fail:
	free(o.indptr);
	free(o.indices);
	free(bitmap);
	synth_layer_free(&s);
	if (err == -ENOMEM)
		return nl_diag(err, "synthetic: out of memory for layer %u (%llu tokens x %u neurons at density %g)",
			       layer, (unsigned long long)p->n_tokens, p->model.n_neurons, p->density);
	return err;
}
