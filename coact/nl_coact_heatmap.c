/*
 * Heatmaps of a layer's co-activation matrix, as in Neuralink Figure 5:
 * element (i, j) is the co-activation of neurons i and j, brighter = more.
 * Large layers are block-averaged down to at most max_px pixels a side;
 * with a placement, rows and columns follow flash order so the clusters the
 * placer formed show up as bright squares along the diagonal.
 */
#include <errno.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nl_coact_internal.h"

#define DEFAULT_MAX_PX 1024
#define DEFAULT_MIN_PX 512   /* stories260K's 172 neurons become 516 px */
#define DEFAULT_GAMMA 0.5
#define LOG_DECADES 4.0   /* the log scale shows 4 decades below the maximum */

void nl_coact_heat_opts_default(struct nl_coact_heat_opts *opts)
{
	memset(opts, 0, sizeof(*opts));
	opts->value = NL_COACT_HEAT_NORM;
	opts->scale = NL_COACT_HEAT_GAMMA;
	opts->gamma = DEFAULT_GAMMA;
	opts->max_px = DEFAULT_MAX_PX;
	opts->min_px = DEFAULT_MIN_PX;
}

/* A perceptually ordered dark-to-bright ramp (close to matplotlib's inferno). */
static const uint8_t ramp[][3] = {
	{ 0, 0, 4 }, { 40, 11, 84 }, { 101, 21, 110 }, { 159, 42, 99 },
	{ 212, 72, 66 }, { 245, 125, 21 }, { 250, 193, 39 }, { 252, 255, 164 },
};

static void colour(double x, uint8_t *rgb)
{
	const int last = (int)(sizeof(ramp) / sizeof(ramp[0])) - 1;
	double f;
	int k;

	if (!(x > 0))
		x = 0;
	if (x > 1)
		x = 1;
	f = x * last;
	k = (int)f;
	if (k >= last)
		k = last - 1;
	f -= k;
	for (int c = 0; c < 3; c++)
		rgb[c] = (uint8_t)lround(ramp[k][c] + f * (ramp[k + 1][c] - ramp[k][c]));
}

int nl_coact_heatmap(const struct nl_coact_layer *layer, const uint32_t *perm,
		     const struct nl_coact_heat_opts *opts, uint8_t **rgb, uint32_t *side)
{
	struct nl_coact_heat_opts defaults;
	uint32_t n = layer->n_neurons, s;
	uint32_t *bin = NULL, *bin_size = NULL;
	double *sum = NULL, *scale = NULL;
	uint8_t *img = NULL, *big = NULL;
	uint32_t zoom = 1;
	double total = 0, max = 0, gamma;
	int ret = 0;

	if (!opts) {
		nl_coact_heat_opts_default(&defaults);
		opts = &defaults;
	}
	*rgb = NULL;
	*side = 0;
	if (n == 0)
		return nl_diag(NL_E_INVAL, "heatmap of a layer with 0 neurons");
	if (!layer->pairs && n > 1)
		return nl_diag(NL_E_MISSING,
			       "the heatmap needs the pair counts f(i,j), which this file does not store; re-run nl-coact count without --no-pairs");
	s = opts->max_px ? opts->max_px : DEFAULT_MAX_PX;
	if (s > n)
		s = n;
	gamma = opts->gamma > 0 ? opts->gamma : DEFAULT_GAMMA;

	bin = malloc(n * sizeof(*bin));
	bin_size = calloc(s, sizeof(*bin_size));
	scale = malloc(n * sizeof(*scale));
	sum = calloc((size_t)s * s, sizeof(*sum));
	img = malloc((size_t)s * s * 3);
	if (!bin || !bin_size || !scale || !sum || !img) {
		ret = nl_diag(-ENOMEM, "out of memory for a %ux%u heatmap of %u neurons", s, s, n);
		goto out_free;
	}
	/* Pixel of each neuron: its position (placement order or id) scaled. */
	for (uint32_t i = 0; i < n; i++)
		bin[i] = UINT32_MAX;
	for (uint32_t p = 0; p < n; p++) {
		uint32_t id = perm ? perm[p] : p;

		if (id >= n || bin[id] != UINT32_MAX) {
			ret = nl_diag(NL_E_INVAL,
				      "placement position %u holds neuron %u, expected a permutation of 0..%u; re-run nl-place",
				      p, id, n - 1);
			goto out_free;
		}
		bin[id] = (uint32_t)((uint64_t)p * s / n);
		bin_size[bin[id]]++;
	}
	if (opts->value == NL_COACT_HEAT_PROB) {
		/* equation 2: the denominator sums f(k,l) over all ordered k != l */
		uint64_t m = nl_tri_size(n);

		for (uint64_t q = 0; q < m; q++)
			total += layer->pairs[q];
		total *= 2;
		for (uint32_t i = 0; i < n; i++)
			scale[i] = 1;
	} else {
		for (uint32_t i = 0; i < n; i++)
			scale[i] = layer->count[i] ? 1.0 / sqrt((double)layer->count[i]) : 0;
	}
	for (uint32_t i = 0; i < n; i++) {
		double *row = sum + (size_t)bin[i] * s;

		/* the diagonal: f(i,i) = f(i), normalised to 1 */
		if (opts->value == NL_COACT_HEAT_PROB)
			row[bin[i]] += total > 0 ? (double)layer->count[i] / total : 0;
		else
			row[bin[i]] += layer->count[i] ? 1 : 0;
		if (i + 1 >= n)
			continue;
		const uint32_t *pr = layer->pairs + nl_tri_index(n, i, i + 1);
		double si = opts->value == NL_COACT_HEAT_PROB ? (total > 0 ? 1 / total : 0) : scale[i];

		for (uint32_t j = i + 1; j < n; j++) {
			uint32_t c = pr[j - i - 1];

			if (c) {
				double v = c * si * scale[j];

				row[bin[j]] += v;
				sum[(size_t)bin[j] * s + bin[i]] += v;
			}
		}
	}
	for (uint32_t y = 0; y < s; y++)
		for (uint32_t x = 0; x < s; x++) {
			double *v = sum + (size_t)y * s + x;

			*v /= (double)bin_size[y] * bin_size[x];
			if (*v > max)
				max = *v;
		}
	for (size_t q = 0; q < (size_t)s * s; q++) {
		double x = 0;

		if (max > 0 && sum[q] > 0) {
			if (opts->scale == NL_COACT_HEAT_LOG)
				x = (log10(sum[q] / max) + LOG_DECADES) / LOG_DECADES;
			else
				x = pow(sum[q] / max, gamma);
		}
		colour(x, img + q * 3);
	}
	if (opts->min_px > s)
		zoom = (opts->min_px + s - 1) / s;
	if (zoom > 1 && (uint64_t)s * zoom > (opts->max_px > opts->min_px ? opts->max_px : opts->min_px))
		zoom = 1;
	if (zoom > 1) {
		uint32_t bs = s * zoom;

		big = malloc((size_t)bs * bs * 3);
		if (!big) {
			ret = nl_diag(-ENOMEM, "out of memory for a %ux%u heatmap", bs, bs);
			goto out_free;
		}
		for (uint32_t y = 0; y < bs; y++)
			for (uint32_t x = 0; x < bs; x++)
				memcpy(big + ((size_t)y * bs + x) * 3,
				       img + ((size_t)(y / zoom) * s + x / zoom) * 3, 3);
		free(img);
		img = big;
		s = bs;
	}
	*rgb = img;
	*side = s;
	img = NULL;

out_free:
	free(img);
	free(sum);
	free(scale);
	free(bin_size);
	free(bin);
	return ret;
}

struct png_io {
	char msg[256];
	jmp_buf jmp;
};

static void png_error_fn(png_structp png, png_const_charp msg)
{
	struct png_io *io = png_get_error_ptr(png);

	snprintf(io->msg, sizeof(io->msg), "%s", msg);
	longjmp(io->jmp, 1);
}

static void png_warning_fn(png_structp png, png_const_charp msg)
{
	(void)png;
	(void)msg;
}

/* Separate from nl_coact_png_write so no local is live across setjmp. */
static int encode_png(FILE *f, struct png_io *io, png_bytep *rows, uint32_t width,
			  uint32_t height)
{
	png_structp png;
	png_infop info = NULL;

	png = png_create_write_struct(PNG_LIBPNG_VER_STRING, io, png_error_fn, png_warning_fn);
	if (!png)
		return -ENOMEM;
	info = png_create_info_struct(png);
	if (!info) {
		png_destroy_write_struct(&png, NULL);
		return -ENOMEM;
	}
	if (setjmp(io->jmp)) {
		png_destroy_write_struct(&png, &info);
		return NL_E_FORMAT;
	}
	png_init_io(png, f);
	png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	png_write_info(png, info);
	png_write_image(png, rows);
	png_write_end(png, info);
	png_destroy_write_struct(&png, &info);
	return 0;
}

int nl_coact_png_write(const char *path, const uint8_t *rgb, uint32_t width, uint32_t height)
{
	char tmp[4096];
	struct png_io io = { .msg = "" };
	png_bytep *rows = NULL;
	FILE *f = NULL;
	int ret;

	if (width == 0 || height == 0)
		return nl_diag(NL_E_INVAL, "'%s': image of %ux%u pixels, expected at least 1x1",
			       path, width, height);
	ret = nl_tmp_path(tmp, sizeof(tmp), path);
	if (ret < 0)
		return nl_diag(ret, "'%s': path too long", path);
	rows = malloc(height * sizeof(*rows));
	if (!rows)
		return nl_diag(-ENOMEM, "'%s': out of memory", path);
	for (uint32_t y = 0; y < height; y++)
		rows[y] = (png_bytep)(rgb + (size_t)y * width * 3);
	f = fopen(tmp, "wb");
	if (!f) {
		ret = nl_diag(-errno, "'%s': cannot create: %s", tmp, strerror(errno));
		goto out_free;
	}
	ret = encode_png(f, &io, rows, width, height);
	if (ret < 0) {
		fclose(f);
		unlink(tmp);
		nl_diag(ret, "'%s': PNG encoding failed: %s", path, io.msg[0] ? io.msg : nl_strerror(ret));
		goto out_free;
	}
	if (fflush(f) != 0 || ferror(f)) {
		ret = nl_diag(-errno, "'%s': write failed: %s", tmp, strerror(errno));
		fclose(f);
		unlink(tmp);
		goto out_free;
	}
	if (fclose(f) != 0) {
		ret = nl_diag(-errno, "'%s': write failed: %s", tmp, strerror(errno));
		unlink(tmp);
		goto out_free;
	}
	ret = nl_commit_tmp(tmp, path);
	if (ret < 0) {
		nl_diag_prefix(ret, "'%s': ", path);
		unlink(tmp);
	}
out_free:
	free(rows);
	return ret;
}
