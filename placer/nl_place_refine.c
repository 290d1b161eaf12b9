/*
 * Local search after the greedy (beyond the paper): Or-opt and 2-opt moves
 * on the open path, driven by candidate neighbours (top-K lists) with
 * don't-look bits, in the manner of Lin-Kernighan style TSP codes.
 *
 * The path is kept in an array p[0..n+1] whose two ends hold a dummy neuron D
 * (id n) of weight 0 to everything, so moves at the ends of the path need no
 * special cases. Gains are exact integer differences of path weight (sums of
 * f(i,j)), and only moves with gain > 0 are applied, so the weight strictly
 * increases and the search ends. Processing order is a FIFO of neurons,
 * initially in path order; a neuron leaves the queue when none of its moves
 * improves (its don't-look bit is set) and re-enters when an edge at it
 * changes. Per neuron the best move is taken, ties to the first found.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nl_place.h"
#include "nl_place_internal.h"

enum move_type {
	MOVE_NONE = 0,
	MOVE_2OPT = 1,  /* reverse p[x..y] */
	MOVE_OROPT = 2, /* move p[s..e] between p[u] and p[v], c ending up next to t */
};

struct move {
	enum move_type type;
	int64_t gain;
	uint32_t x, y;         /* 2-opt */
	uint32_t s, e, u, v;   /* Or-opt */
	bool c_last;           /* Or-opt: c is the last element of the moved segment */
	uint32_t touched[8];   /* neurons whose edges change */
};

struct refine {
	uint32_t n;
	uint32_t *p;
	uint32_t *pos;
	const struct nl_place_weights *w;
	const uint32_t *cand;  /* [n * cand_stride] */
	const uint32_t *cand_cnt;
	uint32_t cand_stride, k;
	uint32_t *queue;
	uint8_t *inq;
	uint64_t q_head, q_len;
};

static inline int64_t wt(const struct refine *r, uint32_t a, uint32_t b)
{
	return nl_place_weight(r->w, a, b);
}

static void push(struct refine *r, uint32_t id)
{
	if (id >= r->n || r->inq[id])
		return;
	r->inq[id] = 1;
	r->queue[(r->q_head + r->q_len) % r->n] = id;
	r->q_len++;
}

static void consider(struct move *best, const struct move *m)
{
	if (m->gain > best->gain)
		*best = *m;
}

static void eval_node(const struct refine *r, uint32_t c, struct move *best)
{
	const uint32_t n = r->n, *p = r->p;
	const uint32_t a = r->pos[c];
	const uint32_t *cand = r->cand + (uint64_t)c * r->cand_stride;
	const uint32_t *cand_cnt = r->cand_cnt + (uint64_t)c * r->cand_stride;
	struct move m;

	memset(best, 0, sizeof(*best));
	/* 2-opt: bring candidate t next to c by reversing the stretch between */
	for (uint32_t q = 0; q < r->k; q++) {
		uint32_t t = cand[q], b;
		int64_t ct;

		if (cand_cnt[q] == 0 || t >= n)
			continue;
		b = r->pos[t];
		ct = wt(r, c, t);
		memset(&m, 0, sizeof(m));
		memset(m.touched, 0xff, sizeof(m.touched));
		m.type = MOVE_2OPT;
		if (b > a + 1) {
			/* ... c [p[a+1] ... t] p[b+1] ... -> ... c t ... p[a+1] p[b+1] */
			m.gain = ct + wt(r, p[a + 1], p[b + 1]) - wt(r, c, p[a + 1]) - wt(r, t, p[b + 1]);
			m.x = a + 1;
			m.y = b;
			m.touched[0] = c;
			m.touched[1] = t;
			m.touched[2] = p[a + 1];
			m.touched[3] = p[b + 1];
			consider(best, &m);
		} else if (b + 1 < a) {
			/* ... p[b-1] [t ... p[a-1]] c ... -> ... p[b-1] p[a-1] ... t c */
			m.gain = ct + wt(r, p[b - 1], p[a - 1]) - wt(r, p[a - 1], c) - wt(r, p[b - 1], t);
			m.x = b;
			m.y = a - 1;
			m.touched[0] = c;
			m.touched[1] = t;
			m.touched[2] = p[a - 1];
			m.touched[3] = p[b - 1];
			consider(best, &m);
		}
	}
	/* Or-opt: segments of 1-3 neurons with c at one end, moved next to t */
	for (uint32_t len = 1; len <= 3; len++) {
		for (int side = 0; side < (len == 1 ? 1 : 2); side++) {
			uint32_t s, e, cl, cr, oe;
			int64_t rg;

			if (side == 0) {
				s = a;
				e = a + len - 1;
				if (e > n)
					continue;
			} else {
				if (a < len)
					continue;
				s = a - len + 1;
				e = a;
			}
			cl = p[s - 1];
			cr = p[e + 1];
			oe = p[s] == c ? p[e] : p[s];
			rg = wt(r, cl, cr) - wt(r, cl, p[s]) - wt(r, p[e], cr);
			for (uint32_t q = 0; q < r->k; q++) {
				uint32_t t = cand[q], tp, u, v;
				int64_t ct;

				if (cand_cnt[q] == 0 || t >= n)
					continue;
				tp = r->pos[t];
				if (tp >= s && tp <= e)
					continue;
				ct = wt(r, c, t);
				memset(&m, 0, sizeof(m));
				memset(m.touched, 0xff, sizeof(m.touched));
				m.type = MOVE_OROPT;
				m.s = s;
				m.e = e;
				m.touched[0] = c;
				m.touched[1] = t;
				m.touched[2] = cl;
				m.touched[3] = cr;
				m.touched[4] = oe;
				/* left of t: x, oe .. c, t */
				u = tp - 1 == e ? s - 1 : tp - 1;
				v = tp;
				m.gain = rg + wt(r, p[u], oe) + ct - wt(r, p[u], t);
				m.u = u;
				m.v = v;
				m.c_last = true;
				m.touched[5] = p[u];
				consider(best, &m);
				/* right of t: t, c .. oe, y */
				u = tp;
				v = tp + 1 == s ? e + 1 : tp + 1;
				m.gain = rg + ct + wt(r, oe, p[v]) - wt(r, t, p[v]);
				m.u = u;
				m.v = v;
				m.c_last = false;
				m.touched[5] = p[v];
				consider(best, &m);
			}
		}
	}
}

static void set_pos(struct refine *r, uint32_t from, uint32_t to)
{
	for (uint32_t x = from; x <= to; x++)
		r->pos[r->p[x]] = x;
}

static void apply(struct refine *r, const struct move *m, uint32_t c)
{
	uint32_t *p = r->p;

	if (m->type == MOVE_2OPT) {
		for (uint32_t x = m->x, y = m->y; x < y; x++, y--) {
			uint32_t t = p[x];

			p[x] = p[y];
			p[y] = t;
		}
		set_pos(r, m->x, m->y);
	} else {
		uint32_t seg[3], len = m->e - m->s + 1;
		bool forward = m->c_last ? p[m->e] == c : p[m->s] == c;

		for (uint32_t x = 0; x < len; x++)
			seg[x] = forward ? p[m->s + x] : p[m->e - x];
		if (m->u + 1 == m->s && m->v == m->e + 1) {
			memcpy(p + m->s, seg, len * sizeof(*seg));
			set_pos(r, m->s, m->e);
		} else if (m->u < m->s) {
			memmove(p + m->v + len, p + m->v, (m->s - m->v) * sizeof(*p));
			memcpy(p + m->v, seg, len * sizeof(*seg));
			set_pos(r, m->v, m->e);
		} else {
			memmove(p + m->s, p + m->e + 1, (m->u - m->e) * sizeof(*p));
			memcpy(p + m->u - len + 1, seg, len * sizeof(*seg));
			set_pos(r, m->s, m->u);
		}
	}
}

int nl_place_refine(const struct nl_coact_layer *stats, const struct nl_place_opts *opts,
		    uint32_t *perm, struct nl_place_stats *st)
{
	struct nl_place_stats local;
	struct nl_coact_layer copy = *stats;
	const struct nl_coact_layer *src = stats;
	struct nl_place_weights w;
	struct refine r;
	const uint32_t n = stats->n_neurons;
	uint64_t weight = 0, moves = 0, evals = 0;
	double t0 = nl_place_now();
	int err;

	if (!st)
		st = &local;
	memset(&r, 0, sizeof(r));
	if (stats->pairs && !opts->sparse &&
	    (!stats->k || stats->rank != NL_COACT_RANK_NORM || opts->k > stats->k)) {
		/*
		 * Move candidates are ranked by normalised co-activation (gains
		 * are still exact raw weights): raw-count lists point at the
		 * same few hottest neurons for everyone. nl-coact's lists are
		 * norm-ranked by default and used as they are; count-ranked (or
		 * too short, or absent) lists are rebuilt from the triangle.
		 */
		copy.topk_ids = NULL;
		copy.topk_counts = NULL;
		copy.k = 0;
		copy.rank = NL_COACT_RANK_NORM;
		err = nl_place_topk_from_pairs(&copy, opts->k ? opts->k : NL_PLACE_DEFAULT_K);
		if (err)
			return err;
		src = &copy;
	} else if (!stats->k) {
		copy.topk_ids = NULL;
		copy.topk_counts = NULL;
		copy.k = 0;
		err = nl_place_topk_from_pairs(&copy, opts->k ? opts->k : NL_PLACE_DEFAULT_K);
		if (err == NL_E_MISSING)
			err = nl_diag(NL_E_MISSING, "refine needs top-K lists or the pair triangle; "
				      "neither is loaded; re-run nl-coact with --topk");
		if (err)
			return err;
		src = &copy;
	}
	err = nl_place_weights_init(&w, src, opts->k, !opts->sparse);
	if (err)
		goto out_copy;
	r.n = n;
	r.w = &w;
	r.cand = src->topk_ids;
	r.cand_cnt = src->topk_counts;
	r.cand_stride = src->k;
	r.k = opts->k && opts->k < src->k ? opts->k : src->k;
	r.p = malloc(((size_t)n + 2) * sizeof(uint32_t));
	r.pos = malloc((size_t)n * sizeof(uint32_t));
	r.queue = malloc((size_t)n * sizeof(uint32_t));
	r.inq = calloc(n, 1);
	if (!r.p || !r.pos || !r.queue || !r.inq) {
		err = -ENOMEM;
		goto out_free;
	}
	r.p[0] = n;
	r.p[n + 1] = n;
	memset(r.pos, 0xff, (size_t)n * sizeof(uint32_t));
	for (uint32_t x = 0; x < n; x++) {
		if (perm[x] >= n || r.pos[perm[x]] != NL_PLACE_NONE) {
			err = nl_diag(NL_E_INVAL, "refine: start placement entry %u is %u, expected a "
				      "neuron id < %u not seen before", x, perm[x], n);
			goto out_free;
		}
		r.p[x + 1] = perm[x];
		r.pos[perm[x]] = x + 1;
	}
	for (uint32_t x = 1; x < n; x++)
		weight += (uint64_t)wt(&r, r.p[x], r.p[x + 1]);
	st->weight_before = weight;
	for (uint32_t x = 1; x <= n; x++)
		push(&r, r.p[x]);

	while (r.q_len > 0) {
		struct move best;
		uint32_t c = r.queue[r.q_head];

		if (opts->move_budget && moves >= opts->move_budget) {
			st->move_budget_hit = true;
			break;
		}
		/* safety bound only; checked every 256 neurons to keep clock calls rare */
		if (opts->time_limit > 0 && (++evals & 255) == 0 &&
		    nl_place_now() - t0 > opts->time_limit) {
			st->time_limit_hit = true;
			break;
		}
		r.q_head = (r.q_head + 1) % n;
		r.q_len--;
		r.inq[c] = 0;
		eval_node(&r, c, &best);
		if (best.type == MOVE_NONE)
			continue;
		apply(&r, &best, c);
		weight += (uint64_t)best.gain;
		moves++;
		if (best.type == MOVE_2OPT)
			st->moves_2opt++;
		else
			st->moves_oropt++;
		for (unsigned x = 0; x < 8; x++)
			push(&r, best.touched[x]);
		push(&r, c);
	}
	for (uint32_t x = 0; x < n; x++)
		perm[x] = r.p[x + 1];
	st->weight = weight;
	st->weight_exact = w.pairs != NULL;

out_free:
	free(r.p);
	free(r.pos);
	free(r.queue);
	free(r.inq);
	nl_place_weights_free(&w);
out_copy:
	if (src == &copy) {
		free(copy.topk_ids);
		free(copy.topk_counts);
	}
	return err;
}
