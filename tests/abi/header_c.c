/* Compiled as C99 and as C++ with -Wall -Wextra -pedantic -Werror (CTest abi.header_*). */
#include "moeinfer/moeinfer.h"

int moe_header_check(void);
int moe_header_check(void) {
  moe_model_params mp = moe_model_default_params();
  moe_context_params cp = moe_context_default_params();
  moe_sampler_params sp = moe_sampler_default_params();
  return (int)(mp.struct_size + cp.struct_size + sp.struct_size) + (int)MOE_STATUS_OK;
}
