/*
 * HDF5 filter plugin for Zstandard (registered filter id 32015), so that
 * HDF5 tools that do not link the neuralink library read our files:
 *
 *   HDF5_PLUGIN_PATH=<builddir>/formats h5dump -d /layer_000/indices traces.h5
 *
 * The filter itself is nl_h5z_zstd_class in nl_h5.c, the same code the
 * library registers; this file only exports it through HDF5's plugin
 * interface (H5PLextern.h).
 */
#include <H5PLextern.h>

#include "nl_h5.h"

H5PL_type_t H5PLget_plugin_type(void)
{
	return H5PL_TYPE_FILTER;
}

const void *H5PLget_plugin_info(void)
{
	return &nl_h5z_zstd_class;
}
