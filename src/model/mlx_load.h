/*
 * mlx_load.h - loading MLX-quantized matrices (the mlx-community layout:
 * "<module>.weight" packed U32 codes, "<module>.scales", "<module>.biases")
 * from a safetensors weight store into Ember's MLX block dtypes.
 */
#ifndef EMBER_MODEL_MLX_LOAD_H
#define EMBER_MODEL_MLX_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "family.h"
#include "formats/config.h"
#include "formats/weights.h"

/*
 * Looks at the weight `name` ("<module>.weight", a [N, K] matrix, or with
 * n_stack > 0 a stack of n_stack such matrices [n_stack, N, K]: mlx-lm's
 * experts, "<...>.switch_mlp.gate_proj.weight") of w. If
 * it is MLX-quantized (its module has "<module>.scales", or config.json
 * quantizes it explicitly), checks the three tensors against the module's
 * bits and group size from cfg and repacks them: *blocks is then a malloc'd
 * buffer of *nbytes bytes of dtype *dtype (a stack's matrices one after the
 * other, n_stack * N rows), which the caller frees. When the
 * weight is a plain float matrix, returns EMBER_OK with *blocks NULL.
 * Errors are one line naming the file and tensor: scales without a
 * quantization config, scales for a module the config marks false, missing
 * scales or biases, wrong shapes or dtypes (a stack's three tensors must be
 * [n_stack, N, K * bits / 32], [n_stack, N, K / G] twice), a wrong packed
 * width.
 */
int ember_mlx_load_weight(const ember_weights *w, const ember_model_config *cfg, const char *name, int64_t n_stack,
                          int64_t N, int64_t K, void **blocks, size_t *nbytes, ember_dtype *dtype, ember_error *err);

/*
 * The loader's matrix_source for a safetensors store (family.h): probes the
 * weight `name` (ndim 2: a matrix [N, K]; 3: a stack [n_stack, N, K]) with
 * ember_mlx_load_weight; when it is MLX-quantized, binds t to the repacked
 * blocks (ember_load_blocks), claims "<module>.weight", ".scales" and
 * ".biases", and sets *bound. A float matrix: *bound false, EMBER_OK (the
 * loader reads it as stored). Errors as ember_mlx_load_weight's and
 * ember_load_blocks's.
 */
int ember_mlx_matrix_source(ember_loader *L, ember_tensor *t, const char *name, int ndim, const int64_t *shape,
                            bool *bound);

#endif
