/*
 * Private to the profiler library: the small fast PRNG used by the synthetic
 * generator and the dataset selection (xoshiro256** seeded through
 * splitmix64; public domain algorithms by Blackman and Vigna).
 */
#ifndef NL_RNG_H
#define NL_RNG_H

#include <stdint.h>

struct nl_rng {
	uint64_t s[4];
};

static inline uint64_t nl_splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A stream keyed by (seed, a, b): nearby keys give unrelated streams. */
static inline void nl_rng_seed(struct nl_rng *r, uint64_t seed, uint64_t a, uint64_t b)
{
	uint64_t x = seed;

	x ^= nl_splitmix64(&a);
	x ^= nl_splitmix64(&b) * 0xd1b54a32d192ed03ull;
	for (int i = 0; i < 4; i++)
		r->s[i] = nl_splitmix64(&x);
}

static inline uint64_t nl_rotl64(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static inline uint64_t nl_rng_next(struct nl_rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = nl_rotl64(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = nl_rotl64(s[3], 45);
	return result;
}

/* Uniform in (0, 1]: never 0, so log() is finite. */
static inline double nl_rng_unit_open0(struct nl_rng *r)
{
	return (double)((nl_rng_next(r) >> 11) + 1) * 0x1.0p-53;
}

/* Uniform integer in [0, n), Lemire's multiply-shift (bias below 2^-32 n). */
static inline uint32_t nl_rng_below(struct nl_rng *r, uint32_t n)
{
	return (uint32_t)(((nl_rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

#endif
