// AVX2/FMA build of the reference-order dot kernels (chosen at run time by
// ref_order_dot.cpp; the same bits as the portable build, faster).
#if defined(MOEINFER_X86)
#define REFDOT_NS refdot_avx2
#include "backends/cpu/kernels/ref_order_dot_impl.h"
#endif
