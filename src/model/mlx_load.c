/*
 * mlx_load.c - see mlx_load.h. Decides from config.json's quantization
 * entries and the tensors present whether a matrix is MLX-quantized (as
 * mlx-lm does: an explicit per-module entry wins, otherwise the presence
 * of "<module>.scales"), then hands the three tensors to
 * formats/mlx_quant.h to be checked and repacked. ember_mlx_matrix_source
 * is how the generic loader (blocks.c) reaches this file: it is the
 * safetensors loader's matrix_source, so MLX's names (".scales",
 * ".biases") and rules stay here.
 *
 * Ownership: the returned block buffer belongs to the caller. No state.
 */
#include "mlx_load.h"

#include <stdio.h>
#include <string.h>

#include "formats/mlx_quant.h"

/* A stack's tensor t ([n_stack, N, cols]) checked and seen as the 2-D
   [n_stack * N, cols] the repacker reads (into *flat). */
static int flatten(const char *file, const char *name, const ember_st_tensor *t, int64_t n_stack, int64_t N,
                   int64_t cols, ember_st_tensor *flat, ember_error *err) {
    if (t->ndim != 3 || t->shape[0] != n_stack || t->shape[1] != N || t->shape[2] != cols) {
        char got[96];
        size_t o = (size_t)snprintf(got, sizeof got, "[");
        for (int i = 0; i < t->ndim && o < sizeof got; i++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (o < sizeof got) snprintf(got + o, sizeof got - o, "]");
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%lld, %lld, %lld]", file, name,
                         got, (long long)n_stack, (long long)N, (long long)cols);
    }
    *flat = *t;
    flat->ndim = 2;
    flat->shape[0] = n_stack * N;
    flat->shape[1] = cols;
    flat->shape[2] = 0;
    return EMBER_OK;
}

int ember_mlx_load_weight(const ember_weights *w, const ember_model_config *cfg, const char *name, int64_t n_stack,
                          int64_t N, int64_t K, void **blocks, size_t *nbytes, ember_dtype *dtype, ember_error *err) {
    *blocks = NULL;
    *nbytes = 0;
    *dtype = EMBER_DTYPE_INVALID;
    static const char suffix[] = ".weight";
    size_t len = strlen(name), sl = sizeof suffix - 1;
    if (len <= sl || len - sl >= 200 || strcmp(name + len - sl, suffix) != 0) return EMBER_OK;
    char module[200], sname[216], bname[216];
    memcpy(module, name, len - sl);
    module[len - sl] = '\0';
    snprintf(sname, sizeof sname, "%s.scales", module);
    snprintf(bname, sizeof bname, "%s.biases", module);
    const char *wfile = w->primary, *sfile = w->primary, *bfile = w->primary;
    const ember_st_tensor *wt = ember_weights_find(w, name, &wfile);
    const ember_st_tensor *st = ember_weights_find(w, sname, &sfile);
    const ember_st_tensor *bt = ember_weights_find(w, bname, &bfile);
    int bits, G;
    ember_qmod_kind kind = ember_config_quant_module(cfg, module, &bits, &G);
    if (cfg->quant.bits == 0) {
        if (st)
            return ember_err(err, EMBER_ERR_FORMAT,
                             "%s: tensor '%s' is present but config.json has no \"quantization\" (MLX group_size / bits)",
                             sfile, sname);
        return EMBER_OK;
    }
    if (kind == EMBER_QMOD_FLOAT) {
        if (st)
            return ember_err(err, EMBER_ERR_FORMAT,
                             "%s: tensor '%s' is present but config.json's quantization marks '%s' false (unquantized)",
                             sfile, sname, module);
        return EMBER_OK;
    }
    if (!st) {
        if (kind == EMBER_QMOD_QUANT || (wt && wt->dtype == EMBER_U32))
            return ember_err(err, EMBER_ERR_FORMAT, "%s: missing tensor '%s' for the MLX-quantized '%s' (%d bits, group %d)",
                             w->primary, sname, name, bits, G);
        return EMBER_OK;
    }
    if (!wt) return ember_err(err, EMBER_ERR_FORMAT, "%s: missing tensor '%s' (its scales are in %s)", w->primary, name, sfile);
    if (!bt)
        return ember_err(err, EMBER_ERR_FORMAT,
                         "%s: missing tensor '%s' (MLX affine quantization needs scales and biases)", w->primary, bname);
    ember_st_tensor fw, fs, fb; /* a stack as one matrix of n_stack * N rows */
    if (n_stack > 0) {
        int rc;
        if (K < 1 || K % G)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': rows of %lld elements are not whole groups of %d",
                             wfile, name, (long long)K, G);
        if ((rc = flatten(wfile, name, wt, n_stack, N, K * bits / 32, &fw, err)) ||
            (rc = flatten(sfile, sname, st, n_stack, N, K / G, &fs, err)) ||
            (rc = flatten(bfile, bname, bt, n_stack, N, K / G, &fb, err)))
            return rc;
        wt = &fw;
        st = &fs;
        bt = &fb;
        N *= n_stack;
    }
    ember_mlx_part pw = {name, wfile, wt}, ps = {sname, sfile, st}, pb = {bname, bfile, bt};
    int rc = ember_mlx_repack(&pw, &ps, &pb, bits, G, N, K, blocks, nbytes, err);
    if (!rc) *dtype = ember_dtype_mlx(bits, G);
    return rc;
}

int ember_mlx_matrix_source(ember_loader *L, ember_tensor *t, const char *name, int ndim, const int64_t *shape,
                            bool *bound) {
    *bound = false;
    if (!L->w || (ndim != 2 && ndim != 3)) return EMBER_OK;
    void *blocks;
    size_t nb;
    ember_dtype dt;
    int rc = ember_mlx_load_weight(L->w, &L->m->cfg, name, ndim == 3 ? shape[0] : 0, shape[ndim - 2], shape[ndim - 1],
                                   &blocks, &nb, &dt, L->err);
    if (rc || !blocks) return rc;
    char part[216];
    size_t len = strlen(name) - (sizeof ".weight" - 1); /* ember_mlx_load_weight checked the suffix */
    ember_load_claim(L, name);
    snprintf(part, sizeof part, "%.*s.scales", (int)len, name);
    ember_load_claim(L, part);
    snprintf(part, sizeof part, "%.*s.biases", (int)len, name);
    ember_load_claim(L, part);
    rc = ember_load_blocks(L, t, name, blocks, nb, dt, ndim, shape);
    *bound = rc == EMBER_OK;
    return rc;
}
