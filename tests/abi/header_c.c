/* Compiled as C99 and as C++ with -Wall -Wextra -pedantic -Werror (CTest abi.header_*). */
#include "moeinfer/moeinfer.h"

int moe_header_check(void);
int moe_header_check(void) {
  moe_model_params mp = moe_model_default_params();
  moe_context_params cp = moe_context_default_params();
  moe_sampler_params sp = moe_sampler_default_params();
  moe_fit_plan plan;
  const float split[2] = {3.0f, 1.0f};
  const char *const rules[1] = {"ffn_.*_exps=cpu"};
  mp.tensor_split = split;
  mp.n_tensor_split = 2;
  mp.tensor_overrides = rules;
  mp.n_tensor_overrides = 1;
  mp.fit = 1;
  plan.struct_size = sizeof plan;
  if (moe_model_fit("x.gguf", &mp, &plan) != MOE_STATUS_OK) return -1;
  return (int)(mp.struct_size + cp.struct_size + sp.struct_size + plan.devices[0].total) + (int)MOE_STATUS_OK;
}
