// MatMulHeads out[:, h, t] = W_h x[:, h, t] with many tokens on the tensor-core GEMMs of
// MatMulId: head h plays expert h, visited by every token. The activations are rounded
// once (act_round_kernel: row t H + h holds x[:, h, t]), a small kernel writes the routing
// tables MatMulId's router would (entries and tiles of <= kMmaCols tokens per head; they
// depend only on H and T), and one GEMM launch computes every (row tile, head tile). The
// output row of (h, t) is t H + h: out is [M, H, T] contiguous, checked on the host.
// Few tokens stay on the warp-per-row kernel of matmul.cu.
#include "backends/cuda/ops/matmul_heads.h"

#include <algorithm>

#include "backends/cuda/ops/matmul_mma.h"
#include "backends/cuda/ops/pdl.cuh"

namespace moe {

namespace {

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// The tensor-core path's shape and scratch layout (work size and launcher agree on it).
struct HeadsPlan {
  bool tc = false;  // tensor-core path
  bool mmq = false, int8 = false;
  int64_t K = 0, M = 0, H = 0, T = 0;
  int tiles_per_head = 0;
  size_t act_bytes = 0, scale_bytes = 0, entry_bytes = 0, tile_bytes = 0;
  size_t total() const { return act_bytes + scale_bytes + entry_bytes + tile_bytes; }
};

HeadsPlan heads_plan(const Graph &g, const Node &n, const CudaPaths &paths) {
  const Node &w = g.node(n.src[0]), &x = g.node(n.src[1]);
  HeadsPlan p;
  p.K = w.ne[0];
  p.M = w.ne[1];
  p.H = x.ne[1];
  p.T = x.ne[2];
  const bool mma = cuda_mma_type_supported(w.type), mmq = cuda_mmq_type_supported(w.type);
  // out[:, h, t] is output row t H + h of M floats (the GEMMs' scatter).
  const bool dense_out = n.nb[0] == 4 && n.nb[1] == static_cast<size_t>(p.M) * 4 && n.nb[2] == static_cast<size_t>(p.M * p.H) * 4;
  p.tc = (mma || (mmq && p.K % 32 == 0)) && cuda_tensor_core_gemm(w.type, paths) && p.T >= kMmaMinCols && x.ne[3] == 1 && dense_out && p.H * p.T <= 0x7fffffff;
  if (!p.tc) return p;
  p.mmq = mmq;
  p.int8 = mmq && cuda_mmq_int8_type(w.type);
  p.tiles_per_head = static_cast<int>((p.T + kMmaCols - 1) / kMmaCols);
  if (p.H * p.tiles_per_head > 65535) {  // the GEMMs' grid.y
    p.tc = false;
    return p;
  }
  const size_t rows = static_cast<size_t>(p.H * p.T), K = static_cast<size_t>(p.K);
  p.act_bytes = align256(rows * K * (!mmq ? 4 : p.int8 ? 1 : 2));  // f32 values, or int8 / f16 integers
  p.scale_bytes = mmq ? align256(rows * (K / 16) * sizeof(float2)) : 0;
  p.entry_bytes = align256(rows * sizeof(int2));
  p.tile_bytes = align256(static_cast<size_t>(p.H) * p.tiles_per_head * sizeof(int4));
  return p;
}

// entries[h T + t] = (t H + h, t H + h); tiles[h tph + j] = (h, h T + 64 j, its count, 0).
// Launched with PDL: the work buffer may still be read by the previous kernel until pdl_wait.
__global__ void heads_tables_kernel(int H, int T, int tiles_per_head, int2 *entries, int4 *tiles) {
  pdl_wait();
  pdl_trigger();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = i0; i < static_cast<int64_t>(H) * T; i += stride) {
    const int h = static_cast<int>(i / T), t = static_cast<int>(i % T);
    const int r = t * H + h;
    entries[i] = make_int2(r, r);
  }
  for (int64_t j = i0; j < static_cast<int64_t>(H) * tiles_per_head; j += stride) {
    const int h = static_cast<int>(j / tiles_per_head), first = static_cast<int>(j % tiles_per_head) * kMmaCols;
    tiles[j] = make_int4(h, h * T + first, min(kMmaCols, T - first), 0);
  }
}

}  // namespace

size_t cuda_matmul_heads_work_size(const Graph &g, const Node &n, const CudaPaths &paths) {
  const HeadsPlan p = heads_plan(g, n, paths);
  return p.tc ? p.total() : 0;
}

bool cuda_fused_heads_concat(const CudaOpCtx &c, const Node &concat) {
  if (heads_plan(c.g, c.n, c.paths).tc) return false;
  cuda_matmul_heads_rows(c, &concat);
  return true;
}

void cuda_op_matmul_heads(const CudaOpCtx &c) {
  const HeadsPlan p = heads_plan(c.g, c.n, c.paths);
  if (!p.tc || c.n.work == nullptr || c.n.work_size < p.total()) return cuda_matmul_heads_rows(c);
  const Node &w = c.src(0);
  uint8_t *work = static_cast<uint8_t *>(c.n.work);
  void *xa = work;  // rounded activations: f32 (MMA) or integers (MMQ)
  float2 *xs = p.mmq ? reinterpret_cast<float2 *>(work + p.act_bytes) : nullptr;
  int2 *entries = reinterpret_cast<int2 *>(work + p.act_bytes + p.scale_bytes);
  int4 *tiles = reinterpret_cast<int4 *>(work + p.act_bytes + p.scale_bytes + p.entry_bytes);
  const int64_t rows = p.H * p.T;
  const DType vdt = type_traits(w.type).vec_dot_type;
  launch_act_round(c.stream, tview(c.src(1)), rows, p.K, vdt, p.mmq ? nullptr : static_cast<float *>(xa), p.mmq ? xa : nullptr, p.int8, xs);
  const int64_t n_tables = std::max<int64_t>(rows, p.H * p.tiles_per_head);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n_tables + 255) / 256, 1024));
  launch_pdl(heads_tables_kernel, dim3(blocks), dim3(256), 0, c.stream, static_cast<int>(p.H), static_cast<int>(p.T), p.tiles_per_head,
             entries, tiles);
  const uint8_t *W = static_cast<const uint8_t *>(w.data);
  float *Y = static_cast<float *>(c.n.data);
  const int n_tiles = static_cast<int>(p.H) * p.tiles_per_head;
  if (p.mmq)
    launch_mmq_matmul(w.type, c.stream, W, w.nb[1], w.nb[2], static_cast<int>(p.K), static_cast<int>(p.M), xa, xs, Y, 0, tiles, entries,
                      n_tiles);
  else
    launch_mma_matmul(w.type, c.stream, W, w.nb[1], w.nb[2], static_cast<int>(p.K), static_cast<int>(p.M), static_cast<const float *>(xa),
                      Y, 0, tiles, entries, n_tiles);
}

}  // namespace moe
