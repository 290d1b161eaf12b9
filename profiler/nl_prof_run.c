/*
 * The profiling run behind `nl-profile run`: samples -> tokens -> forward
 * pass with the FFN hook -> sparsity rule -> trace (Neuralink section 4.1).
 *
 * Parallel over samples: each worker owns a single-threaded forward pass and
 * takes the next sample from a shared counter; the calling thread writes the
 * finished samples strictly in selection order, so the trace is identical
 * whatever the thread count. Workers run at most WINDOW samples ahead of the
 * writer, which bounds the memory held by finished but unwritten samples.
 *
 * With the threshold rule a first pass over the same samples fills one
 * |act| histogram per worker; the merged histograms give t_l per layer.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nl_profile.h"

/* Active sets of one sample: per layer, a CSR over its tokens. */
struct sample_out {
	uint32_t n_tok;
	uint64_t **indptr;       /* [n_layers][n_tok + 1] */
	uint32_t **ids;          /* [n_layers][growable] */
	uint64_t *cap;           /* [n_layers] */
	bool ready;
};

struct run;

struct worker {
	struct run *run;
	pthread_t thread;
	bool started;
	struct nl_forward *fwd;
	struct nl_thresh_hist *hist;  /* pass 1 */
	uint64_t *scratch_keys;       /* [n_neurons] */
	struct sample_out *cur;       /* pass 2: sample being profiled */
};

struct run {
	const struct nl_model *model;
	const struct nl_prof_opts *o;
	uint32_t n_layers, n_neurons, topk;
	size_t n_samples;
	uint32_t **tokens;            /* [n_samples] */
	uint32_t *n_tok;              /* [n_samples] */
	int pass;
	const double *threshold;      /* pass 2, THRESHOLD */
	struct sample_out *out;       /* [n_samples] */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t next;                  /* next sample to take */
	size_t written;               /* samples consumed by the writer */
	size_t window;
	int err;                      /* first worker error */
	char err_msg[512];
};

#define WINDOW_PER_THREAD 4

static void sample_out_free(struct sample_out *s, uint32_t n_layers)
{
	for (uint32_t l = 0; s->indptr && s->ids && l < n_layers; l++) {
		free(s->indptr[l]);
		free(s->ids[l]);
	}
	free(s->indptr);
	free(s->ids);
	free(s->cap);
	memset(s, 0, sizeof(*s));
}

static int sample_out_init(struct sample_out *s, uint32_t n_layers, uint32_t n_tok, uint32_t n_neurons,
			   double density)
{
	uint64_t guess = (uint64_t)((double)n_tok * n_neurons * (density > 0 ? density : 0.5)) + n_neurons;

	memset(s, 0, sizeof(*s));
	s->n_tok = n_tok;
	s->indptr = calloc(n_layers, sizeof(*s->indptr));
	s->ids = calloc(n_layers, sizeof(*s->ids));
	s->cap = calloc(n_layers, sizeof(*s->cap));
	if (!s->indptr || !s->ids || !s->cap)
		return -ENOMEM;
	for (uint32_t l = 0; l < n_layers; l++) {
		s->indptr[l] = malloc(((size_t)n_tok + 1) * sizeof(**s->indptr));
		s->ids[l] = malloc(guess * sizeof(**s->ids));
		if (!s->indptr[l] || !s->ids[l])
			return -ENOMEM;
		s->indptr[l][0] = 0;
		s->cap[l] = guess;
	}
	return 0;
}

static int hook_calibrate(void *ctx, uint32_t layer, uint32_t pos0, uint32_t n_tok,
			  const float *gate_act, uint32_t hidden_dim)
{
	struct worker *wk = ctx;

	(void)pos0;
	nl_thresh_hist_add(wk->hist, layer, gate_act, (size_t)n_tok * hidden_dim);
	return 0;
}

static int hook_trace(void *ctx, uint32_t layer, uint32_t pos0, uint32_t n_tok,
		      const float *gate_act, uint32_t hidden_dim)
{
	struct worker *wk = ctx;
	struct run *r = wk->run;
	struct sample_out *s = wk->cur;

	if (layer >= r->n_layers || hidden_dim != r->n_neurons || pos0 + n_tok > s->n_tok)
		return nl_diag(NL_E_INVAL, "profile hook: layer %u, positions %u..%u, %u neurons; expected < %u layers, < %u positions, %u neurons",
			       layer, pos0, pos0 + n_tok, hidden_dim, r->n_layers, s->n_tok, r->n_neurons);
	for (uint32_t t = 0; t < n_tok; t++) {
		const float *act = gate_act + (size_t)t * hidden_dim;
		uint64_t base = s->indptr[layer][pos0 + t];
		uint32_t k;

		if (base + hidden_dim > s->cap[layer]) {
			uint64_t cap = s->cap[layer] * 2 + hidden_dim;
			uint32_t *grown = realloc(s->ids[layer], cap * sizeof(*grown));

			if (!grown)
				return -ENOMEM;
			s->ids[layer] = grown;
			s->cap[layer] = cap;
		}
		switch (r->o->sparsity) {
		case NL_SPARSITY_RELU:
			k = nl_active_relu(act, hidden_dim, s->ids[layer] + base);
			break;
		case NL_SPARSITY_THRESHOLD:
			k = nl_active_threshold(act, hidden_dim, r->threshold[layer], s->ids[layer] + base);
			break;
		default:
			k = nl_active_topk(act, hidden_dim, r->topk, s->ids[layer] + base, wk->scratch_keys);
			break;
		}
		s->indptr[layer][pos0 + t + 1] = base + k;
	}
	return 0;
}

static void record_error(struct run *r, int err)
{
	pthread_mutex_lock(&r->lock);
	if (!r->err) {
		r->err = err;
		snprintf(r->err_msg, sizeof(r->err_msg), "%s", nl_diag_msg()[0] ? nl_diag_msg() : nl_strerror(err));
	}
	pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

static void *worker_main(void *arg)
{
	struct worker *wk = arg;
	struct run *r = wk->run;

	for (;;) {
		size_t s;
		int err;

		pthread_mutex_lock(&r->lock);
		while (!r->err && r->next < r->n_samples && r->next >= r->written + r->window)
			pthread_cond_wait(&r->cond, &r->lock);
		if (r->err || r->next >= r->n_samples) {
			pthread_mutex_unlock(&r->lock);
			break;
		}
		s = r->next++;
		pthread_mutex_unlock(&r->lock);

		if (r->pass == 1) {
			err = nl_forward_sequence(wk->fwd, r->tokens[s], r->n_tok[s], hook_calibrate, wk, NULL);
		} else {
			err = sample_out_init(&r->out[s], r->n_layers, r->n_tok[s], r->n_neurons, r->o->density);
			if (err == -ENOMEM)
				err = nl_diag(err, "out of memory for the active sets of sample %zu", s);
			wk->cur = &r->out[s];
			if (!err)
				err = nl_forward_sequence(wk->fwd, r->tokens[s], r->n_tok[s], hook_trace, wk, NULL);
		}
		if (err) {
			record_error(r, err);
			break;
		}
		pthread_mutex_lock(&r->lock);
		r->out[s].ready = true;
		pthread_cond_broadcast(&r->cond);
		pthread_mutex_unlock(&r->lock);
	}
	return NULL;
}

/* Runs one pass; the calling thread consumes samples in order (writes them in pass 2). */
static int run_pass(struct run *r, struct worker *wk, uint32_t n_workers, int pass,
		    struct nl_trace_writer *w, uint64_t *active, uint64_t total_tokens,
		    const uint32_t *sample_ids)
{
	const uint32_t **ptrs = NULL;
	uint32_t *counts = NULL;
	uint64_t done = 0;
	int err = 0;

	r->pass = pass;
	r->next = 0;
	r->written = 0;
	for (size_t s = 0; s < r->n_samples; s++)
		r->out[s].ready = false;
	ptrs = calloc(r->n_layers, sizeof(*ptrs));
	counts = calloc(r->n_layers, sizeof(*counts));
	if (!ptrs || !counts) {
		err = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n_workers; i++) {
		err = pthread_create(&wk[i].thread, NULL, worker_main, &wk[i]);
		if (err) {
			record_error(r, nl_diag(-err, "cannot start worker thread: %s", strerror(err)));
			err = 0;
			break;
		}
		wk[i].started = true;
	}
	for (size_t s = 0; s < r->n_samples; s++) {
		struct sample_out *so = &r->out[s];
		bool failed;

		pthread_mutex_lock(&r->lock);
		while (!r->err && !so->ready)
			pthread_cond_wait(&r->cond, &r->lock);
		failed = r->err != 0;   /* read under the lock: workers set it */
		pthread_mutex_unlock(&r->lock);
		if (failed)
			break;
		if (pass == 2) {
			for (uint32_t t = 0; t < so->n_tok && !err; t++) {
				for (uint32_t l = 0; l < r->n_layers; l++) {
					uint64_t a = so->indptr[l][t], b = so->indptr[l][t + 1];

					ptrs[l] = so->ids[l] + a;
					counts[l] = (uint32_t)(b - a);
					active[l] += b - a;
				}
				err = nl_trace_append(w, ptrs, counts, sample_ids[s]);
			}
			sample_out_free(so, r->n_layers);
			if (err) {
				record_error(r, err);
				break;
			}
		}
		done += r->n_tok[s];
		pthread_mutex_lock(&r->lock);
		r->written = s + 1;
		pthread_cond_broadcast(&r->cond);
		pthread_mutex_unlock(&r->lock);
		if (r->o->progress)
			r->o->progress(r->o->progress_ctx, pass, done, total_tokens);
	}
out:
	for (uint32_t i = 0; i < n_workers; i++) {
		if (wk[i].started)
			pthread_join(wk[i].thread, NULL);
		wk[i].started = false;
	}
	free(ptrs);
	free(counts);
	if (!err && r->err)
		err = nl_diag(r->err, "%s", r->err_msg);
	return err;
}

void nl_prof_result_free(struct nl_prof_result *r)
{
	if (!r)
		return;
	free(r->density);
	free(r->threshold);
	memset(r, 0, sizeof(*r));
}

/* Tokens of one selected sample, cut to max_len. */
static int sample_tokens(const struct nl_sample *smp, size_t index, const struct nl_vocab *v,
			 uint32_t vocab_size, uint32_t max_len, uint32_t **out, uint32_t *n_out,
			 bool *truncated)
{
	uint32_t *ids = NULL;
	size_t n = 0;
	int err;

	if (smp->ids) {
		for (size_t i = 0; i < smp->n_ids; i++)
			if (smp->ids[i] >= vocab_size)
				return nl_diag(NL_E_FORMAT, "sample %zu (line %llu): token id %u at position %zu, expected < %u (the model's vocabulary size)",
					       index, (unsigned long long)smp->line, smp->ids[i], i, vocab_size);
		n = smp->n_ids;
		ids = malloc((n ? n : 1) * sizeof(*ids));
		if (!ids)
			return -ENOMEM;
		memcpy(ids, smp->ids, n * sizeof(*ids));
	} else {
		if (!v)
			return nl_diag(NL_E_INVAL, "sample %zu is text but no tokenizer was given; pass -t tokenizer.bin",
				       index);
		err = nl_vocab_encode(v, smp->text, smp->len, true, &ids, &n);
		if (err)
			return nl_diag_prefix(err, "sample %zu (line %llu): ", index, (unsigned long long)smp->line);
	}
	*truncated = n > max_len;
	if (n > max_len)
		n = max_len;
	*out = ids;
	*n_out = (uint32_t)n;
	return 0;
}

int nl_prof_run(const struct nl_model *m, const struct nl_vocab *v, const struct nl_dataset *d,
		const uint32_t *sel, size_t n_sel, const struct nl_prof_opts *o,
		const char *out_path, struct nl_prof_result *res)
{
	const struct nl_model_config *cfg = nl_model_get_config(m);
	struct run r;
	struct worker *wk = NULL;
	struct nl_trace_writer *w = NULL;
	struct nl_trace_meta meta;
	uint32_t n_workers = o->n_threads ? o->n_threads : 1, max_len;
	uint32_t *sample_ids = NULL;
	uint64_t *active = NULL, total = 0;
	int err = 0;

	memset(res, 0, sizeof(*res));
	memset(&r, 0, sizeof(r));
	if (o->sparsity != NL_SPARSITY_RELU && o->sparsity != NL_SPARSITY_THRESHOLD &&
	    o->sparsity != NL_SPARSITY_TOPK)
		return nl_diag(NL_E_INVAL, "profile: sparsity rule %s cannot be computed from a model; use relu, threshold or topk",
			       nl_sparsity_name(o->sparsity));
	if (o->sparsity != NL_SPARSITY_RELU && !(o->density > 0 && o->density <= 1))
		return nl_diag(NL_E_INVAL, "profile: density %g out of range for --sparsity %s, expected 0 < density <= 1",
			       o->density, nl_sparsity_name(o->sparsity));
	if (!n_sel)
		return nl_diag(NL_E_INVAL, "profile: no samples selected");
	if (n_workers > n_sel)
		n_workers = (uint32_t)n_sel;
	max_len = o->max_tokens && o->max_tokens < cfg->seq_len ? o->max_tokens : cfg->seq_len;

	r.model = m;
	r.o = o;
	r.n_layers = cfg->n_layers;
	r.n_neurons = cfg->hidden_dim;
	r.topk = nl_topk_count(o->density, cfg->hidden_dim);
	r.n_samples = n_sel;
	r.window = (size_t)n_workers * WINDOW_PER_THREAD;
	pthread_mutex_init(&r.lock, NULL);
	pthread_cond_init(&r.cond, NULL);

	err = -ENOMEM;
	r.tokens = calloc(n_sel, sizeof(*r.tokens));
	r.n_tok = calloc(n_sel, sizeof(*r.n_tok));
	r.out = calloc(n_sel, sizeof(*r.out));
	sample_ids = calloc(n_sel, sizeof(*sample_ids));
	active = calloc(r.n_layers, sizeof(*active));
	res->density = calloc(r.n_layers, sizeof(*res->density));
	wk = calloc(n_workers, sizeof(*wk));
	if (!r.tokens || !r.n_tok || !r.out || !sample_ids || !active || !res->density || !wk)
		goto out;
	res->n_layers = r.n_layers;
	res->n_neurons = r.n_neurons;
	res->n_samples = n_sel;

	for (size_t s = 0; s < n_sel; s++) {
		const struct nl_sample *smp = nl_dataset_sample(d, sel[s]);
		bool cut = false;

		if (!smp) {
			err = nl_diag(NL_E_INVAL, "profile: selected sample %u is out of range", sel[s]);
			goto out;
		}
		err = sample_tokens(smp, sel[s], v, cfg->vocab_size, max_len, &r.tokens[s], &r.n_tok[s], &cut);
		if (err)
			goto out;
		res->n_truncated += cut;
		sample_ids[s] = sel[s];
		total += r.n_tok[s];
	}
	res->n_tokens = total;

	for (uint32_t i = 0; i < n_workers; i++) {
		wk[i].run = &r;
		err = nl_forward_create(&wk[i].fwd, m, o->act, 1);
		if (err)
			goto out;
		wk[i].scratch_keys = malloc((size_t)r.n_neurons * sizeof(*wk[i].scratch_keys));
		if (!wk[i].scratch_keys) {
			err = -ENOMEM;
			goto out;
		}
	}

	if (o->sparsity == NL_SPARSITY_THRESHOLD) {
		res->threshold = calloc(r.n_layers, sizeof(*res->threshold));
		if (!res->threshold) {
			err = -ENOMEM;
			goto out;
		}
		for (uint32_t i = 0; i < n_workers; i++) {
			err = nl_thresh_hist_create(&wk[i].hist, r.n_layers);
			if (err)
				goto out;
		}
		err = run_pass(&r, wk, n_workers, 1, NULL, active, total, sample_ids);
		if (err)
			goto out;
		for (uint32_t i = 1; i < n_workers; i++) {
			err = nl_thresh_hist_merge(wk[0].hist, wk[i].hist);
			if (err)
				goto out;
		}
		for (uint32_t l = 0; l < r.n_layers; l++) {
			err = nl_thresh_hist_threshold(wk[0].hist, l, o->density, &res->threshold[l]);
			if (err)
				goto out;
		}
		r.threshold = res->threshold;
	}

	memset(&meta, 0, sizeof(meta));
	nl_model_get_id(m, &meta.model);
	snprintf(meta.dataset, sizeof(meta.dataset), "%s", o->dataset_name ? o->dataset_name : "");
	meta.sparsity = o->sparsity;
	meta.target_density = o->sparsity == NL_SPARSITY_RELU ? 0 : o->density;
	meta.has_sample_ids = true;
	err = nl_trace_create(&w, out_path, &meta, &o->h5);
	if (err)
		goto out;
	err = run_pass(&r, wk, n_workers, 2, w, active, total, sample_ids);
	if (err)
		goto out;
	err = nl_trace_finish(w, res->threshold);
	w = NULL;
	if (err)
		goto out;
	for (uint32_t l = 0; l < r.n_layers; l++)
		res->density[l] = total ? (double)active[l] / ((double)total * r.n_neurons) : 0;
out:
	if (err == -ENOMEM)
		nl_diag(err, "profile: out of memory");
	nl_trace_abort(w);
	for (uint32_t i = 0; wk && i < n_workers; i++) {
		nl_forward_free(wk[i].fwd);
		nl_thresh_hist_free(wk[i].hist);
		free(wk[i].scratch_keys);
	}
	for (size_t s = 0; r.out && s < n_sel; s++)
		sample_out_free(&r.out[s], r.n_layers);
	for (size_t s = 0; r.tokens && s < n_sel; s++)
		free(r.tokens[s]);
	free(r.tokens);
	free(r.n_tok);
	free(r.out);
	free(wk);
	free(sample_ids);
	free(active);
	pthread_mutex_destroy(&r.lock);
	pthread_cond_destroy(&r.cond);
	if (err)
		nl_prof_result_free(res);
	return err;
}
