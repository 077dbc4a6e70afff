// One token of the gated delta rule for one value head (ops/delta_net.cpp): the state S_in
// (d rows j of d floats i, S[j][i] = S_ij) decays by `decay`, takes the delta-rule update with
// key k, value v and rate beta into S (S_in == S: in place; else S_in is only read, so the
// first token of a call reads the committed copy without copying it first), then
// o = scale * S^T q. Scalar and AVX2 versions.
#pragma once
#include <cstdint>

namespace moe {

void delta_step_scalar(float *S, const float *S_in, int64_t d, const float *q, const float *k, const float *v, float decay, float beta, float scale, float *o);
#if defined(MOEINFER_X86)
void delta_step_avx2(float *S, const float *S_in, int64_t d, const float *q, const float *k, const float *v, float decay, float beta, float scale, float *o);
#endif

}  // namespace moe
