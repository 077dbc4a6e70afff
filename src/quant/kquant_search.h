// Scale searches behind GGML's K-quant reference quantizers. The arithmetic (operation
// order, float vs int, tie handling) follows GGML exactly, because a different choice of
// scale on a near-tie changes the bytes of the quantized model.
//
//   int8_t L[16];
//   float d = make_qx_quants(16, 32, x, L, 1);            // Q6_K sub-block, L in [0,63]
//   float d3 = make_q3_quants(16, 4, x, L, true);         // Q3_K sub-block, L in [0,7]
//   uint8_t Lu[32], aux[32]; float mn;
//   float s = make_qkx2_quants(32, 15, x, w, Lu, &mn, aux, -1.f, 0.1f, 20, false);  // Q4_K
#pragma once
#include <cstdint>

namespace moe {

// Symmetric: values L - nmax in [-nmax, nmax-1]; rmse_type 1 weights errors by x^2.
float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type);
// Symmetric with iterative per-element refinement (Q3_K).
float make_q3_quants(int n, int nmax, const float *x, int8_t *L, bool do_rmse);
// Affine (scale + min) search over nstep+1 candidate scales, weighted errors.
float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                       float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                       bool use_mad);

// One Q4_K/Q5_K super-block (256 values): per-32 make_qkx2_quants, 6-bit scale/min packing
// into packed_scales (12 bytes, zeroed by the caller), f16 d/dmin, then the final codes in L
// (0..nmax) against the rounded scales. Q4_K: nmax 15, rmin -1, 20 steps; Q5_K: 31, -0.5, 15.
void quantize_qk_affine_block(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                              uint8_t *packed_scales, uint16_t *d_out, uint16_t *dmin_out);

constexpr float kGroupMaxEps = 1e-15f;  // below this a group counts as all zero

}  // namespace moe
