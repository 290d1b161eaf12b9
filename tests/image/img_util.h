/*
 * Helpers shared by the image tests, the golden-file generator and the fuzz
 * target: deterministic made-up weights, a complete image writer on top of
 * the public API, and an independent re-implementation of the checksum rules
 * of docs/formats/nlimg.md ("reseal") used to build files that break exactly
 * one rule while every checksum stays valid.
 */
#ifndef NL_IMG_UTIL_H
#define NL_IMG_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "nl_image.h"

/* F32 weights of a made-up model in llama2.c layout, deterministic in seed. */
struct tu_model {
	struct nl_model_weights weights;
	struct nl_layer_weights *layers;
	float *storage;
	uint32_t **perms;          /* [n_layers][hidden_dim] deterministic shuffles */
};

int tu_model_make(struct tu_model *m, const struct nl_img_config *c, uint64_t seed);
void tu_model_free(struct tu_model *m, const struct nl_img_config *c);

/* Packs m into an image at path (dense + every layer in order); 0 or error. */
int tu_write_image(const char *path, const struct nl_img_config *c, uint32_t block_size,
		   const struct tu_model *m);

/* The same from any F32 weights and one placement per layer. */
int tu_write_weights(const char *path, const struct nl_img_config *c, uint32_t block_size,
		     const struct nl_model_weights *weights, const uint32_t *const *perms);

/* The tiny configuration of the golden files (dim 8, 16 neurons, 2 layers). */
void tu_tiny_config(struct nl_img_config *c);
/* A stories260K-like configuration (dim 64, 172 neurons, 5 layers). */
void tu_small_config(struct nl_img_config *c);

/* Whole file into memory (caller frees); NULL on failure. */
uint8_t *tu_read_file(const char *path, size_t *len);
int tu_write_file(const char *path, const void *buf, size_t len);

uint32_t tu_ld32(const uint8_t *p);
uint64_t tu_ld64(const uint8_t *p);
void tu_st16(uint8_t *p, uint16_t v);
void tu_st32(uint8_t *p, uint32_t v);
void tu_st64(uint8_t *p, uint64_t v);

/*
 * Recomputes, in this order, every data block checksum (into the checksum
 * section named by the table), the header's checksum-section hash, the
 * section-table hash and the header hash, trusting whatever the header and
 * table say but never reading outside buf[len]. Fields other than hashes are
 * left alone.
 */
void tu_reseal(uint8_t *buf, size_t len);
/* Only the table hash and the header hash. */
void tu_reseal_header(uint8_t *buf, size_t len);

/* Section table entry i, as a pointer into buf (no bounds check beyond len). */
uint8_t *tu_entry(uint8_t *buf, uint32_t i);

#endif
