/* See ref_runc.h: llama2.c run.c's forward(), transcribed onto nl_model weights. */
#include "ref_runc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct nl_ref {
	const struct nl_model_config *c;
	const struct nl_model_weights *w;
	bool relu;
	float *x, *xb, *xb2, *hb, *hb2, *q, *att, *key_cache, *value_cache;
};

struct nl_ref *nl_ref_create(const struct nl_model *m, bool relu)
{
	const struct nl_model_config *c = nl_model_get_config(m);
	struct nl_ref *r = calloc(1, sizeof(*r));
	size_t kv_dim = (size_t)c->dim / c->n_heads * c->n_kv_heads;

	if (!r)
		return NULL;
	r->c = c;
	r->w = nl_model_get_weights(m);
	r->relu = relu;
	r->x = calloc(c->dim, sizeof(float));
	r->xb = calloc(c->dim, sizeof(float));
	r->xb2 = calloc(c->dim, sizeof(float));
	r->hb = calloc(c->hidden_dim, sizeof(float));
	r->hb2 = calloc(c->hidden_dim, sizeof(float));
	r->q = calloc(c->dim, sizeof(float));
	r->att = calloc((size_t)c->n_heads * c->seq_len, sizeof(float));
	r->key_cache = calloc((size_t)c->n_layers * c->seq_len * kv_dim, sizeof(float));
	r->value_cache = calloc((size_t)c->n_layers * c->seq_len * kv_dim, sizeof(float));
	if (!r->x || !r->xb || !r->xb2 || !r->hb || !r->hb2 || !r->q || !r->att ||
	    !r->key_cache || !r->value_cache) {
		nl_ref_free(r);
		return NULL;
	}
	return r;
}

void nl_ref_free(struct nl_ref *r)
{
	if (!r)
		return;
	free(r->x);
	free(r->xb);
	free(r->xb2);
	free(r->hb);
	free(r->hb2);
	free(r->q);
	free(r->att);
	free(r->key_cache);
	free(r->value_cache);
	free(r);
}

static void rmsnorm(float *o, const float *x, const float *weight, int size, float eps)
{
	float ss = 0.0f;

	for (int j = 0; j < size; j++)
		ss += x[j] * x[j];
	ss /= size;
	ss += eps;
	ss = 1.0f / sqrtf(ss);
	for (int j = 0; j < size; j++)
		o[j] = weight[j] * (ss * x[j]);
}

static void softmax(float *x, int size)
{
	float max_val = x[0], sum = 0.0f;

	for (int i = 1; i < size; i++)
		if (x[i] > max_val)
			max_val = x[i];
	for (int i = 0; i < size; i++) {
		x[i] = expf(x[i] - max_val);
		sum += x[i];
	}
	for (int i = 0; i < size; i++)
		x[i] /= sum;
}

/* W (d,n) @ x (n,) -> xout (d,) */
static void matmul(float *xout, const float *x, const float *w, int n, int d)
{
	for (int i = 0; i < d; i++) {
		float val = 0.0f;

		for (int j = 0; j < n; j++)
			val += w[(size_t)i * n + j] * x[j];
		xout[i] = val;
	}
}

void nl_ref_step(struct nl_ref *r, uint32_t token, uint32_t pos, float *logits, float *gate_act)
{
	const struct nl_model_config *p = r->c;
	const struct nl_model_weights *w = r->w;
	int dim = (int)p->dim, hidden_dim = (int)p->hidden_dim;
	int head_size = dim / (int)p->n_heads;
	int kv_dim = head_size * (int)p->n_kv_heads;
	int kv_mul = (int)(p->n_heads / p->n_kv_heads);
	float *x = r->x;

	memcpy(x, w->token_embedding + (size_t)token * dim, (size_t)dim * sizeof(float));
	for (uint32_t l = 0; l < p->n_layers; l++) {
		const struct nl_layer_weights *lw = &w->layers[l];
		size_t loff = (size_t)l * p->seq_len * kv_dim;
		float *k = r->key_cache + loff + (size_t)pos * kv_dim;
		float *v = r->value_cache + loff + (size_t)pos * kv_dim;

		rmsnorm(r->xb, x, lw->attn_norm, dim, p->rms_eps);
		matmul(r->q, r->xb, lw->wq, dim, dim);
		matmul(k, r->xb, lw->wk, dim, kv_dim);
		matmul(v, r->xb, lw->wv, dim, kv_dim);
		for (int i = 0; i < dim; i += 2) {
			int head_dim = i % head_size;
			float freq = 1.0f / powf(p->rope_theta, head_dim / (float)head_size);
			float val = pos * freq, fcr = cosf(val), fci = sinf(val);
			int rotn = i < kv_dim ? 2 : 1;

			for (int vi = 0; vi < rotn; vi++) {
				float *vec = vi == 0 ? r->q : k;
				float v0 = vec[i], v1 = vec[i + 1];

				vec[i] = v0 * fcr - v1 * fci;
				vec[i + 1] = v0 * fci + v1 * fcr;
			}
		}
		for (int h = 0; h < (int)p->n_heads; h++) {
			float *q = r->q + h * head_size;
			float *att = r->att + (size_t)h * p->seq_len;
			float *xb = r->xb + h * head_size;

			for (uint32_t t = 0; t <= pos; t++) {
				const float *kt = r->key_cache + loff + (size_t)t * kv_dim +
					(h / kv_mul) * head_size;
				float score = 0.0f;

				for (int i = 0; i < head_size; i++)
					score += q[i] * kt[i];
				att[t] = score / sqrtf((float)head_size);
			}
			softmax(att, (int)pos + 1);
			memset(xb, 0, (size_t)head_size * sizeof(float));
			for (uint32_t t = 0; t <= pos; t++) {
				const float *vt = r->value_cache + loff + (size_t)t * kv_dim +
					(h / kv_mul) * head_size;

				for (int i = 0; i < head_size; i++)
					xb[i] += att[t] * vt[i];
			}
		}
		matmul(r->xb2, r->xb, lw->wo, dim, dim);
		for (int i = 0; i < dim; i++)
			x[i] += r->xb2[i];
		rmsnorm(r->xb, x, lw->ffn_norm, dim, p->rms_eps);
		matmul(r->hb, r->xb, lw->w_gate, dim, hidden_dim);
		matmul(r->hb2, r->xb, lw->w_up, dim, hidden_dim);
		for (int i = 0; i < hidden_dim; i++) {
			float val = r->hb[i];

			if (r->relu)
				val = val > 0.0f ? val : 0.0f;
			else
				val *= 1.0f / (1.0f + expf(-val));
			if (gate_act)
				gate_act[(size_t)l * hidden_dim + i] = val;
			r->hb[i] = val * r->hb2[i];
		}
		matmul(r->xb, r->hb, lw->w_down, hidden_dim, dim);
		for (int i = 0; i < dim; i++)
			x[i] += r->xb[i];
	}
	rmsnorm(x, x, w->final_norm, dim, p->rms_eps);
	matmul(logits, x, w->classifier, dim, (int)p->vocab_size);
}
