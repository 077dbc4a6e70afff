// Attention over an F32 cache in the CPU backend's reference float order, bit for bit
// (attention_ref_order.cu; the CPU side is attend_f32_reference_order in
// src/backends/cpu/ops/attention.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cuda/ops/attention.cuh"

namespace moe {

// Scratch of the reference-order kernel for a node of T tokens, n_head heads and a cache of
// n_cells cells, or 0 where the kernel does not apply to the node (sinks, MLA, too many
// tokens, scratch over its cap, a cache type other than F32 on the node). A node that does
// not name its cache type gets the scratch; the type is checked again at launch.
size_t attn_ref_order_work_size(const Graph &g, const Node &n, const GpuTuning &tuning);
// Launches it for c.n when it applies (F32 cache, no sinks, separate V, the planned scratch);
// false: the caller takes another path.
bool attn_ref_order_launch(const CudaOpCtx &c, TView q, TView out, const AttnArgs &a);

}  // namespace moe
