/*
 * Model checkpoints: llama2.c (legacy v0 and v1 "ak42" headers, F32) and
 * GGUF v3 (architecture "llama"; F32, F16, BF16, Q8_0 dequantised to F32), and
 * their vocabularies (llama2.c tokenizer.bin, or the one embedded in GGUF),
 * with one SentencePiece-style BPE encoder for both.
 *
 * Weights are held in memory as F32, row-major, in llama2.c's layout:
 * a matrix W [out, in] maps x[in] to y[out] = W x.
 */
#ifndef NL_MODEL_H
#define NL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nl_formats.h"

enum nl_model_source {
	NL_MODEL_LLAMA2C_V0 = 0,
	NL_MODEL_LLAMA2C_V1 = 1,
	NL_MODEL_GGUF = 2,
};

struct nl_model_config {
	uint32_t dim;             /* d_model */
	uint32_t hidden_dim;      /* FFN neurons per layer */
	uint32_t n_layers;
	uint32_t n_heads;
	uint32_t n_kv_heads;
	uint32_t vocab_size;
	uint32_t seq_len;         /* context length */
	float rms_eps;            /* 1e-5 for llama2.c */
	float rope_theta;         /* 10000 for llama2.c */
	bool shared_classifier;   /* output head tied to the token embedding */
	enum nl_model_source source;
	char name[NL_NAME_MAX];   /* file stem, or GGUF general.name */
};

/* Per-layer weights, all F32 and owned by the model. */
struct nl_layer_weights {
	const float *attn_norm;   /* [dim] */
	const float *wq;          /* [n_heads*head_dim, dim] */
	const float *wk;          /* [n_kv_heads*head_dim, dim] */
	const float *wv;          /* [n_kv_heads*head_dim, dim] */
	const float *wo;          /* [dim, n_heads*head_dim] */
	const float *ffn_norm;    /* [dim] */
	const float *w_gate;      /* [hidden_dim, dim]  (llama2.c w1) */
	const float *w_down;      /* [dim, hidden_dim]  (llama2.c w2) */
	const float *w_up;        /* [hidden_dim, dim]  (llama2.c w3) */
};

struct nl_model_weights {
	const float *token_embedding;  /* [vocab_size, dim] */
	const struct nl_layer_weights *layers; /* [n_layers] */
	const float *final_norm;       /* [dim] */
	const float *classifier;       /* [vocab_size, dim]; == token_embedding when shared */
};

struct nl_model;

/* Opens a checkpoint, detecting llama2.c or GGUF from its first bytes. */
int nl_model_open(struct nl_model **out, const char *path);
const struct nl_model_config *nl_model_get_config(const struct nl_model *m);
const struct nl_model_weights *nl_model_get_weights(const struct nl_model *m);
/* The identity written into traces. */
void nl_model_get_id(const struct nl_model *m, struct nl_model_id *id);
void nl_model_free(struct nl_model *m);

/* ---- vocabulary and BPE encoder ---- */

struct nl_vocab;

/* llama2.c tokenizer.bin; vocab_size comes from the model config. */
int nl_vocab_open_llama2c(struct nl_vocab **out, const char *path, uint32_t vocab_size);
/* The vocabulary embedded in a GGUF file (tokenizer.ggml.tokens/scores/token_type). */
int nl_vocab_open_gguf(struct nl_vocab **out, const char *path);
uint32_t nl_vocab_size(const struct nl_vocab *v);
uint32_t nl_vocab_bos(const struct nl_vocab *v);   /* 1 for llama */
uint32_t nl_vocab_eos(const struct nl_vocab *v);   /* 2 for llama */
/* The piece of a token as text (spaces as ' ', not U+2581). */
const char *nl_vocab_piece(const struct nl_vocab *v, uint32_t id);
void nl_vocab_free(struct nl_vocab *v);

/*
 * SentencePiece-style BPE: dummy prefix space, codepoint lookup, byte fallback
 * (<0xNN> tokens), best-score merges; O(n log n) in the text length.
 * Writes BOS first when bos. *ids is allocated (caller frees), *n_ids set.
 */
int nl_vocab_encode(const struct nl_vocab *v, const char *text, size_t len, bool bos,
		    uint32_t **ids, size_t *n_ids);

#endif
