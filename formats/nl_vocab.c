/*
 * Vocabularies (llama2.c tokenizer.bin, GGUF tokenizer.ggml.*) and the
 * SentencePiece-style BPE encoder they share.
 *
 * tokenizer.bin, little-endian:
 *   offset size  field
 *   0      4     int32 max_token_length
 *   then vocab_size times: float32 score, int32 length, `length` bytes of piece
 * The file must end after the last piece.
 *
 * The encoder reproduces llama2.c's encode() (run.c) exactly: a dummy prefix
 * space, one symbol per UTF-8 codepoint found in the vocabulary, byte fallback
 * (<0xNN> tokens) for the others, then repeatedly merging the adjacent pair
 * whose concatenation is the highest-scoring token (leftmost on ties). Instead
 * of llama2.c's rescan after every merge (quadratic) it keeps the candidate
 * pairs in a binary heap ordered by (score desc, position asc) over a linked
 * list of symbols, discarding stale pairs when popped: O(n log n).
 *
 * Only normal and user-defined tokens take part in lookups and merges, so
 * "<s>" or "<0x0A>" written in the text stay text. GGUF pieces spell spaces
 * U+2581; they are stored with plain spaces so both vocabularies encode alike.
 */
#include "nl_model_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PIECE_MAX_LEN 4096u   /* longer pieces are refused as corrupt */
#define NO_TOKEN UINT32_MAX

struct nl_vocab {
	uint32_t n;
	char *blob;               /* every piece, NUL-terminated */
	uint64_t *piece_off;      /* [n] offset of piece i in blob */
	uint32_t *piece_len;      /* [n] */
	float *scores;            /* [n] */
	uint8_t *types;           /* [n] enum nl_tok_type */
	uint32_t bos, eos, unk;
	uint32_t byte_id[256];    /* token of <0xNN>, NO_TOKEN when absent */
	uint32_t max_len;         /* longest mergeable piece */
	bool split_at_spaces;     /* no mergeable piece has a space after its first byte */
	uint32_t *slots;          /* open addressing: token id + 1, 0 = empty */
	uint32_t mask;
};

static uint32_t hash_bytes(const char *s, uint32_t len)
{
	uint32_t h = 2166136261u;  /* FNV-1a */

	for (uint32_t i = 0; i < len; i++) {
		h ^= (uint8_t)s[i];
		h *= 16777619u;
	}
	return h;
}

static const char *piece(const struct nl_vocab *v, uint32_t id)
{
	return v->blob + v->piece_off[id];
}

static uint32_t lookup(const struct nl_vocab *v, const char *s, uint32_t len)
{
	uint32_t i, slot;

	if (len > v->max_len)
		return NO_TOKEN;
	for (i = hash_bytes(s, len) & v->mask; (slot = v->slots[i]) != 0; i = (i + 1) & v->mask) {
		uint32_t id = slot - 1;

		if (v->piece_len[id] == len && memcmp(piece(v, id), s, len) == 0)
			return id;
	}
	return NO_TOKEN;
}

static int parse_byte_piece(const char *s, uint32_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	const char *hi, *lo;

	if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || !s[3] || !s[4])
		return -1;
	hi = strchr(hex, s[3]);
	lo = strchr(hex, s[4]);
	if (!hi || !lo)
		return -1;
	return (int)((hi - hex) << 4 | (lo - hex));
}

static struct nl_vocab *vocab_alloc(uint32_t n, uint64_t blob_bytes)
{
	struct nl_vocab *v = calloc(1, sizeof(*v));

	if (!v)
		return NULL;
	v->n = n;
	v->blob = malloc(blob_bytes ? blob_bytes : 1);
	v->piece_off = calloc(n, sizeof(*v->piece_off));
	v->piece_len = calloc(n, sizeof(*v->piece_len));
	v->scores = calloc(n, sizeof(*v->scores));
	v->types = calloc(n, sizeof(*v->types));
	if (!v->blob || !v->piece_off || !v->piece_len || !v->scores || !v->types) {
		nl_vocab_free(v);
		return NULL;
	}
	return v;
}

/* Fills the byte table and the lookup hash once pieces, scores and types are set. */
static int vocab_index(struct nl_vocab *v, const char *what)
{
	uint32_t size = 16;

	for (int b = 0; b < 256; b++)
		v->byte_id[b] = NO_TOKEN;
	while (size < 2 * (uint64_t)v->n)
		size *= 2;
	v->slots = calloc(size, sizeof(*v->slots));
	if (!v->slots)
		return nl_diag(-ENOMEM, "'%s': out of memory", what);
	v->mask = size - 1;
	v->split_at_spaces = true;
	for (uint32_t id = 0; id < v->n; id++) {
		const char *p = piece(v, id);
		uint32_t len = v->piece_len[id], i;

		if (!isfinite(v->scores[id]))
			return nl_diag(NL_E_FORMAT, "'%s': token %u has a non-finite score", what,
				       id);
		if (v->types[id] == NL_TOK_BYTE) {
			int b = parse_byte_piece(p, len);

			if (b < 0)
				return nl_diag(NL_E_FORMAT, "'%s': byte token %u is '%.*s', expected "
					       "<0xNN>", what, id, (int)(len < 32 ? len : 32), p);
			if (v->byte_id[b] == NO_TOKEN)
				v->byte_id[b] = id;
			continue;
		}
		if (v->types[id] != NL_TOK_NORMAL && v->types[id] != NL_TOK_USER)
			continue;
		if (len == 0)
			continue;
		/* a duplicate piece keeps its first (lowest) id */
		for (i = hash_bytes(p, len) & v->mask; v->slots[i]; i = (i + 1) & v->mask)
			if (v->piece_len[v->slots[i] - 1] == len &&
			    memcmp(piece(v, v->slots[i] - 1), p, len) == 0)
				break;
		if (v->slots[i])
			continue;
		v->slots[i] = id + 1;
		if (len > v->max_len)
			v->max_len = len;
		if (len > 1 && memchr(p + 1, ' ', len - 1))
			v->split_at_spaces = false;
	}
	return 0;
}

/* llama2.c has no token types: unk 0, bos 1, eos 2, <0xNN> bytes, the rest normal. */
static uint8_t infer_type(uint32_t id, const char *p, uint32_t len)
{
	if (id == 0)
		return NL_TOK_UNKNOWN;
	if (id == 1 || id == 2)
		return NL_TOK_CONTROL;
	if (parse_byte_piece(p, len) >= 0)
		return NL_TOK_BYTE;
	return NL_TOK_NORMAL;
}

int nl_vocab_parse_llama2c(struct nl_vocab **out, const char *what, const uint8_t *data,
			   size_t size, uint32_t vocab_size)
{
	struct nl_vocab *v = NULL;
	uint64_t pos = 4, blob_bytes = 0;
	int32_t max_token_length;
	int err;

	*out = NULL;
	if (vocab_size == 0 || vocab_size > NL_MODEL_MAX_VOCAB)
		return nl_diag(NL_E_INVAL, "'%s': vocab_size %u out of range 1..%u", what,
			       vocab_size, NL_MODEL_MAX_VOCAB);
	if (size < 4)
		return nl_diag(NL_E_TRUNCATED, "'%s': %zu bytes, too short for a tokenizer.bin "
			       "header", what, size);
	max_token_length = (int32_t)nl_le32(data);
	if (max_token_length <= 0 || max_token_length > (int32_t)PIECE_MAX_LEN)
		return nl_diag(NL_E_FORMAT, "'%s': max_token_length is %d, expected 1..%u; not a "
			       "llama2.c tokenizer.bin?", what, max_token_length, PIECE_MAX_LEN);
	/* first pass: validate and size the blob */
	for (uint32_t id = 0; id < vocab_size; id++) {
		int32_t len;

		if (size - pos < 8)
			return nl_diag(NL_E_TRUNCATED, "'%s': ends at token %u of %u (offset %llu); "
				       "the file is truncated or has fewer tokens than the model's "
				       "vocab_size", what, id, vocab_size, (unsigned long long)pos);
		len = (int32_t)nl_le32(data + pos + 4);
		if (len < 0 || len > max_token_length)
			return nl_diag(NL_E_FORMAT, "'%s': token %u has length %d, expected "
				       "0..%d (max_token_length)", what, id, len, max_token_length);
		pos += 8;
		if (size - pos < (uint64_t)len)
			return nl_diag(NL_E_TRUNCATED, "'%s': token %u (%d bytes at offset %llu) "
				       "runs past the end of the file", what, id, len,
				       (unsigned long long)pos);
		pos += (uint64_t)len;
		blob_bytes += (uint64_t)len + 1;
	}
	if (pos != size)
		return nl_diag(NL_E_MISMATCH, "'%s': %llu bytes left after %u tokens; the "
			       "tokenizer has more tokens than the model's vocab_size %u",
			       what, (unsigned long long)(size - pos), vocab_size, vocab_size);
	v = vocab_alloc(vocab_size, blob_bytes);
	if (!v)
		return nl_diag(-ENOMEM, "'%s': out of memory", what);
	pos = 4;
	blob_bytes = 0;
	for (uint32_t id = 0; id < vocab_size; id++) {
		uint32_t bits = nl_le32(data + pos), len = nl_le32(data + pos + 4);

		memcpy(&v->scores[id], &bits, sizeof(float));
		pos += 8;
		v->piece_off[id] = blob_bytes;
		v->piece_len[id] = len;
		memcpy(v->blob + blob_bytes, data + pos, len);
		v->blob[blob_bytes + len] = '\0';
		v->types[id] = infer_type(id, v->blob + blob_bytes, len);
		pos += len;
		blob_bytes += len + 1;
	}
	v->unk = 0;
	v->bos = vocab_size > 1 ? 1 : 0;
	v->eos = vocab_size > 2 ? 2 : 0;
	err = vocab_index(v, what);
	if (err) {
		nl_vocab_free(v);
		return err;
	}
	*out = v;
	return 0;
}

int nl_vocab_open_llama2c(struct nl_vocab **out, const char *path, uint32_t vocab_size)
{
	const uint8_t *map;
	size_t size;
	int err;

	*out = NULL;
	err = nl_map_file(path, &map, &size);
	if (err)
		return err;
	err = nl_vocab_parse_llama2c(out, path, map, size, vocab_size);
	nl_unmap_file(map, size);
	return err;
}

/* Array key of the expected element type; NL_E_MISSING when absent. */
static int gguf_array(const struct nl_gguf *g, const char *key, uint32_t type, uint64_t count,
		      const struct nl_gguf_kv **out)
{
	const struct nl_gguf_kv *kv = nl_gguf_find(g, key);

	*out = kv;
	if (!kv)
		return nl_diag(NL_E_MISSING, "'%s': metadata key '%s' is missing", g->what, key);
	if (kv->type != NL_GGUF_ARRAY || kv->arr_type != type)
		return nl_diag(NL_E_TYPE, "'%s': metadata key '%s' has type %u (elements %u), "
			       "expected an array of type %u", g->what, key, kv->type,
			       kv->arr_type, type);
	if (count && kv->arr_count != count)
		return nl_diag(NL_E_SHAPE, "'%s': metadata key '%s' has %llu entries, expected "
			       "%llu (one per token)", g->what, key,
			       (unsigned long long)kv->arr_count, (unsigned long long)count);
	return 0;
}

int nl_vocab_from_gguf(struct nl_vocab **out, const struct nl_gguf *g)
{
	const struct nl_gguf_kv *tokens, *scores = NULL, *types = NULL;
	struct nl_vocab *v = NULL;
	const uint8_t *s, *p;
	uint64_t len, blob_bytes = 0;
	uint32_t n, id;
	int err;

	*out = NULL;
	if (nl_gguf_find(g, "tokenizer.ggml.model")) {
		err = nl_gguf_get_str(g, "tokenizer.ggml.model", &s, &len);
		if (err)
			return err;
		if (!(len == 5 && memcmp(s, "llama", 5) == 0))
			return nl_diag(NL_E_UNSUPPORTED, "'%s': tokenizer.ggml.model is '%.*s'; "
				       "only the SentencePiece ('llama') tokenizer is supported",
				       g->what, (int)(len < 32 ? len : 32), (const char *)s);
	}
	err = gguf_array(g, "tokenizer.ggml.tokens", NL_GGUF_STRING, 0, &tokens);
	if (err)
		return err;
	if (tokens->arr_count == 0 || tokens->arr_count > NL_MODEL_MAX_VOCAB)
		return nl_diag(NL_E_FORMAT, "'%s': tokenizer.ggml.tokens has %llu entries, "
			       "expected 1..%u", g->what, (unsigned long long)tokens->arr_count,
			       NL_MODEL_MAX_VOCAB);
	n = (uint32_t)tokens->arr_count;
	if (nl_gguf_find(g, "tokenizer.ggml.scores") &&
	    (err = gguf_array(g, "tokenizer.ggml.scores", NL_GGUF_F32, n, &scores)))
		return err;
	if (nl_gguf_find(g, "tokenizer.ggml.token_type") &&
	    (err = gguf_array(g, "tokenizer.ggml.token_type", NL_GGUF_I32, n, &types)))
		return err;
	/* the parser bounds-checked every string of the array */
	for (p = tokens->arr_data, id = 0; id < n; id++) {
		len = nl_le64(p);
		if (len > PIECE_MAX_LEN)
			return nl_diag(NL_E_FORMAT, "'%s': token %u is %llu bytes long, expected "
				       "at most %u", g->what, id, (unsigned long long)len,
				       PIECE_MAX_LEN);
		blob_bytes += len + 1;
		p += 8 + len;
	}
	v = vocab_alloc(n, blob_bytes);
	if (!v)
		return nl_diag(-ENOMEM, "'%s': out of memory", g->what);
	blob_bytes = 0;
	for (p = tokens->arr_data, id = 0; id < n; id++) {
		uint32_t out_len = 0;

		len = nl_le64(p);
		p += 8;
		v->piece_off[id] = blob_bytes;
		/* U+2581 LOWER ONE EIGHTH BLOCK is SentencePiece's space */
		for (uint64_t i = 0; i < len; i++) {
			if (i + 2 < len && p[i] == 0xe2 && p[i + 1] == 0x96 && p[i + 2] == 0x81) {
				v->blob[blob_bytes + out_len++] = ' ';
				i += 2;
			} else {
				v->blob[blob_bytes + out_len++] = (char)p[i];
			}
		}
		v->blob[blob_bytes + out_len] = '\0';
		v->piece_len[id] = out_len;
		if (scores) {
			uint32_t bits = nl_le32(scores->arr_data + 4 * (uint64_t)id);

			memcpy(&v->scores[id], &bits, sizeof(float));
		}
		if (types) {
			int32_t t = (int32_t)nl_le32(types->arr_data + 4 * (uint64_t)id);

			if (t < NL_TOK_NORMAL || t > NL_TOK_BYTE) {
				err = nl_diag(NL_E_FORMAT, "'%s': tokenizer.ggml.token_type[%u] is "
					      "%d, expected 1..6", g->what, id, t);
				goto out_free;
			}
			v->types[id] = (uint8_t)t;
		} else {
			v->types[id] = infer_type(id, v->blob + blob_bytes, out_len);
		}
		blob_bytes += out_len + 1;
		p += len;
	}
	v->unk = 0;
	v->bos = n > 1 ? 1 : 0;
	v->eos = n > 2 ? 2 : 0;
	{
		const struct { const char *key; uint32_t *dst; } ids[] = {
			{ "tokenizer.ggml.bos_token_id", &v->bos },
			{ "tokenizer.ggml.eos_token_id", &v->eos },
			{ "tokenizer.ggml.unknown_token_id", &v->unk },
		};

		for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
			if (!nl_gguf_find(g, ids[i].key))
				continue;
			err = nl_gguf_get_u32(g, ids[i].key, ids[i].dst);
			if (err)
				goto out_free;
			if (*ids[i].dst >= n) {
				err = nl_diag(NL_E_FORMAT, "'%s': %s is %u, expected < %u tokens",
					      g->what, ids[i].key, *ids[i].dst, n);
				goto out_free;
			}
		}
	}
	err = vocab_index(v, g->what);
	if (err)
		goto out_free;
	*out = v;
	return 0;
out_free:
	nl_vocab_free(v);
	return err;
}

int nl_vocab_open_gguf(struct nl_vocab **out, const char *path)
{
	struct nl_gguf g;
	const uint8_t *map;
	size_t size;
	int err;

	*out = NULL;
	err = nl_map_file(path, &map, &size);
	if (err)
		return err;
	err = nl_gguf_parse(&g, path, map, size);
	if (!err) {
		err = nl_vocab_from_gguf(out, &g);
		nl_gguf_release(&g);
	}
	nl_unmap_file(map, size);
	return err;
}

uint32_t nl_vocab_size(const struct nl_vocab *v)
{
	return v->n;
}

uint32_t nl_vocab_bos(const struct nl_vocab *v)
{
	return v->bos;
}

uint32_t nl_vocab_eos(const struct nl_vocab *v)
{
	return v->eos;
}

const char *nl_vocab_piece(const struct nl_vocab *v, uint32_t id)
{
	if (id >= v->n)
		return "";
	return piece(v, id);
}

float nl_vocab_score(const struct nl_vocab *v, uint32_t id)
{
	return id < v->n ? v->scores[id] : 0.0f;
}

void nl_vocab_free(struct nl_vocab *v)
{
	if (!v)
		return;
	free(v->blob);
	free(v->piece_off);
	free(v->piece_len);
	free(v->scores);
	free(v->types);
	free(v->slots);
	free(v);
}

/* ---- encoder ---- */

struct symbol {
	uint32_t start;   /* into the working text */
	uint32_t len;     /* 0 once merged into its left neighbour */
	uint32_t id;
	int32_t prev, next;
	bool mergeable;   /* false for byte-fallback symbols */
};

struct pair {
	float score;
	uint32_t left, right;   /* symbol indices; left < right */
	uint32_t len;           /* combined length when pushed: detects stale pairs */
	uint32_t id;
};

struct heap {
	struct pair *items;
	size_t n, cap;
};

/* Higher score first; the leftmost pair on ties, as llama2.c's scan picks it. */
static bool pair_before(const struct pair *a, const struct pair *b)
{
	if (a->score != b->score)
		return a->score > b->score;
	return a->left < b->left;
}

static void heap_push(struct heap *h, struct pair p)
{
	size_t i = h->n++;

	while (i > 0) {
		size_t parent = (i - 1) / 2;

		if (!pair_before(&p, &h->items[parent]))
			break;
		h->items[i] = h->items[parent];
		i = parent;
	}
	h->items[i] = p;
}

static struct pair heap_pop(struct heap *h)
{
	struct pair top = h->items[0], last = h->items[--h->n];
	size_t i = 0;

	for (;;) {
		size_t child = 2 * i + 1;

		if (child >= h->n)
			break;
		if (child + 1 < h->n && pair_before(&h->items[child + 1], &h->items[child]))
			child++;
		if (!pair_before(&h->items[child], &last))
			break;
		h->items[i] = h->items[child];
		i = child;
	}
	if (h->n)
		h->items[i] = last;
	return top;
}

static void try_pair(const struct nl_vocab *v, const char *text, const struct symbol *sym,
		     int32_t left, int32_t right, struct heap *h)
{
	uint32_t len, id;

	if (left < 0 || right < 0 || !sym[left].mergeable || !sym[right].mergeable)
		return;
	len = sym[left].len + sym[right].len;
	id = lookup(v, text + sym[left].start, len);
	if (id == NO_TOKEN)
		return;
	heap_push(h, (struct pair){ .score = v->scores[id], .left = (uint32_t)left,
				    .right = (uint32_t)right, .len = len, .id = id });
}

/*
 * Encodes work[start, end) on its own: symbols per codepoint (or per byte when
 * the codepoint is not a token), then best-first merges. Appends to out.
 */
static void encode_segment(const struct nl_vocab *v, const char *work, size_t start, size_t end,
			   struct symbol *sym, struct heap *heap, uint32_t *out, size_t *n_out)
{
	size_t n_sym = 0;

	for (size_t i = start; i < end;) {
		size_t cp_len = 1;
		uint32_t id;

		/* a codepoint: a byte and the continuation bytes after it (at most 4) */
		while (i + cp_len < end && cp_len < 4 && ((uint8_t)work[i + cp_len] & 0xc0) == 0x80)
			cp_len++;
		id = lookup(v, work + i, (uint32_t)cp_len);
		if (id != NO_TOKEN) {
			sym[n_sym++] = (struct symbol){ .start = (uint32_t)i, .len = (uint32_t)cp_len,
							.id = id, .mergeable = true };
		} else {
			for (size_t b = 0; b < cp_len; b++) {
				uint32_t byte_tok = v->byte_id[(uint8_t)work[i + b]];

				sym[n_sym++] = (struct symbol){
					.start = (uint32_t)(i + b), .len = 1,
					.id = byte_tok != NO_TOKEN ? byte_tok : v->unk,
					.mergeable = false };
			}
		}
		i += cp_len;
	}
	for (size_t i = 0; i < n_sym; i++) {
		sym[i].prev = (int32_t)i - 1;
		sym[i].next = i + 1 < n_sym ? (int32_t)i + 1 : -1;
	}
	heap->n = 0;
	for (size_t i = 0; i + 1 < n_sym; i++)
		try_pair(v, work, sym, (int32_t)i, (int32_t)i + 1, heap);
	while (heap->n) {
		struct pair p = heap_pop(heap);
		struct symbol *left = &sym[p.left], *right = &sym[p.right];

		if (left->len == 0 || right->len == 0 || left->len + right->len != p.len)
			continue;  /* stale: one side was merged since */
		left->len = p.len;
		left->id = p.id;
		right->len = 0;
		left->next = right->next;
		if (right->next >= 0)
			sym[right->next].prev = (int32_t)p.left;
		try_pair(v, work, sym, left->prev, (int32_t)p.left, heap);
		try_pair(v, work, sym, (int32_t)p.left, left->next, heap);
	}
	/* the first symbol is never merged away: merges keep the left one */
	for (int32_t i = 0; i >= 0 && n_sym; i = sym[i].next)
		out[(*n_out)++] = sym[i].id;
}

int nl_vocab_encode(const struct nl_vocab *v, const char *text, size_t len, bool bos,
		    uint32_t **ids, size_t *n_ids)
{
	struct symbol *sym = NULL;
	struct heap heap = { 0 };
	char *work = NULL;
	uint32_t *out = NULL;
	size_t n_out = 0, work_len, seg;
	int err = 0;

	*ids = NULL;
	*n_ids = 0;
	if (len > (size_t)INT32_MAX - 8)
		return nl_diag(NL_E_INVAL, "text of %zu bytes is too long to encode at once "
			       "(limit 2 GiB)", len);
	work_len = len ? len + 1 : 0;
	/* each byte yields at most one symbol; each merge at most two new pairs */
	work = malloc(work_len + 1);
	sym = malloc((work_len + 1) * sizeof(*sym));
	heap.cap = 3 * work_len + 1;
	heap.items = malloc(heap.cap * sizeof(*heap.items));
	out = malloc((work_len + 2) * sizeof(*out));
	if (!work || !sym || !heap.items || !out) {
		err = nl_diag(-ENOMEM, "out of memory encoding %zu bytes", len);
		goto out_free;
	}
	if (bos)
		out[n_out++] = v->bos;
	if (len == 0)
		goto out_done;
	/* the dummy prefix: SentencePiece's leading space, llama2.c's " " token */
	work[0] = ' ';
	memcpy(work + 1, text, len);
	/*
	 * When no token has a space after its first byte, no merge can join
	 * anything to a symbol that starts with a space, so the text splits
	 * before every space into segments that encode independently, to the
	 * same ids: small heaps that stay in cache.
	 */
	seg = 0;
	for (size_t i = 1; i <= work_len; i++) {
		if (i < work_len && (!v->split_at_spaces || work[i] != ' '))
			continue;
		encode_segment(v, work, seg, i, sym, &heap, out, &n_out);
		seg = i;
	}
out_done:
	*ids = out;
	*n_ids = n_out;
	out = NULL;
out_free:
	free(out);
	free(heap.items);
	free(sym);
	free(work);
	return err;
}
