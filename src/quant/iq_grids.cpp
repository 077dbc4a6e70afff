// Host copies of the i-quant tables; the numbers live in quant/iq_grids.inc.
#include "quant/iq_grids.h"

namespace moe {

#define MOE_IQ_TABLE
#include "quant/iq_grids.inc"
#undef MOE_IQ_TABLE

}  // namespace moe
