// Matrix products against weights of any supported type. Activations are first converted
// to the weight type's vec_dot_type (Q8_0 / Q8_K blocks, F16, BF16), exactly as the
// reference engine does, then each output is one vec_dot against a weight row. F32, Q8_0,
// Q4_K, Q5_K and Q6_K use the reference's own float grouping, including the path it takes
// for multi-token products (ref_order_path): the K-quant conformance files need those bits.
#include <cstring>

#include "backends/cpu/kernels/f16_halfsum_dot.h"
#include "backends/cpu/kernels/gemm.h"
#include "backends/cpu/kernels/ref_order_dot.h"
#include "backends/cpu/kernels/vec_dot.h"
#include "backends/cpu/ops/cpu_ops.h"

namespace moe {

namespace {

// Convert rows [0, nrows) of x (row stride x_nb1) into work: the threads split the rows
// and meet at a barrier, or with private_activations(nrows) each thread converts them all
// into its own copy (work: this thread's; see cpu_work_size). Returns the base of the
// converted rows and their stride.
const uint8_t *prepare_activations(const CpuKernelArgs &a, const Node &x, int64_t nrows, int64_t K,
                                   const CpuTypeKernels &k, uint8_t *work, size_t *stride) {
  if (k.vec_dot_type == DType::F32) {
    *stride = x.nb[1];
    return static_cast<const uint8_t *>(x.data);
  }
  const size_t rs = row_size(k.vec_dot_type, K);
  const bool priv = private_activations(nrows);
  int64_t r0 = 0, r1 = nrows;
  if (!priv) split_rows(nrows, a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r)
    k.from_float(reinterpret_cast<const float *>(static_cast<const uint8_t *>(x.data) + r * x.nb[1]), work + r * rs, K);
  if (!priv) a.pool.barrier();
  *stride = rs;
  return work;
}

// Types with a reference-order kernel use it (bit-exact with the conformance reference,
// see kernels/ref_order_dot.h); the rest keep the fast per-ISA vec_dot.
inline void dot_rows(DType t, int n, int nrows, float *out, const void *w, size_t ws, const void *x, RefPath path) {
  if (ref_order_dot_supported(t)) ref_order_dot_rows(t, n, nrows, out, w, ws, x, path);
  else cpu_vec_dot_rows(t, n, nrows, out, w, ws, x);
}

// F16 weights where the reference runs its one-row ggml_vec_dot_f16 (one activation column,
// and every MoE expert product): FP16 accumulation for k >= 128, a double sum below
// (kernels/f16_halfsum_dot.h). Its multi-column dense products use tinyBLAS (F32 sums).
inline bool f16_halfsum_path(DType t, int64_t n_cols, bool moe) { return t == DType::F16 && (moe || n_cols == 1); }

constexpr int64_t kRowChunk = 16;  // weight rows per work item: stays in L1 across tokens

// Q4_K on the reference's repacked paths runs as row x column tiles (kernels/gemm.h): each
// weight block is unpacked once for all the columns, with the same bits as the per-row
// reference-order kernels.
// Q6_K (always the reference's vec_dot order) likewise.
enum class Tiles { None, Q4K, Q6K };
inline Tiles tile_kind(const Node &w, int64_t K, int64_t M) {
  if (ref_order_path(w.type, K, M, 1, 0, true) == RefPath::RepackGemv && cpu_gemm_q4_K_supported()) return Tiles::Q4K;
  if (w.type == DType::Q6_K && ref_order_path(w.type, K, M, 1, 0, true) == RefPath::VecDot && cpu_gemm_q6_K_supported())
    return Tiles::Q6K;
  return Tiles::None;
}
inline void run_tiles(Tiles kind, int64_t K, int64_t nrows, int nc, float *const *outs, const uint8_t *w, size_t ws,
                      const void *const *xs, bool gemm) {
  if (kind == Tiles::Q6K) cpu_gemm_q6_K(static_cast<int>(K), static_cast<int>(nrows), nc, outs, w, ws, xs);
  else cpu_gemm_q4_K(static_cast<int>(K), static_cast<int>(nrows), nc, outs, w, ws, xs, gemm ? Q4kOrder::Gemm : Q4kOrder::Gemv);
}
constexpr int kTileCols = 64;  // columns per tile call; a multiple of 4 keeps the 4-column groups

// Rows per work item out of rows_total. Several activation columns: kRowChunk (the rows
// stay in L1 while every column passes). One column (decode): about 16 items per thread,
// a multiple of 16 rows: long sequential streams, yet a thread that loses its core
// delays the step by one item at most.
inline int64_t row_chunk(int64_t rows_total, int64_t cols, int nth) {
  if (cols > 1) return kRowChunk;
  const int64_t c = (rows_total / (16 * static_cast<int64_t>(nth)) + 15) / 16 * 16;
  return c < kRowChunk ? kRowChunk : c;
}

}  // namespace

size_t cpu_matmul_work_per_copy(DType wt, int64_t k, int64_t n_rows) {
  const CpuTypeKernels &kt = cpu_type_kernels(wt);
  if (kt.vec_dot_type == DType::F32) return 0;
  return (row_size(kt.vec_dot_type, k) * static_cast<size_t>(n_rows) + 63) / 64 * 64;
}

size_t cpu_matmul_id_work_per_copy(size_t act_bytes, int64_t n_expert, int64_t n_entries) {
  return (act_bytes + 63) / 64 * 64 + (static_cast<size_t>(2 * n_expert + n_entries) * 4 + 63) / 64 * 64;
}

void cpu_matmul(const CpuKernelArgs &a) {
  const Node &w = a.src(0), &x = a.src(1);
  const int64_t K = w.ne[0], M = w.ne[1];
  const int64_t N = x.ne[1] * x.ne[2] * x.ne[3];
  const CpuTypeKernels &k = cpu_type_kernels(w.type);
  size_t xs;  // the item counter starts at 0 after the previous node's barrier
  const size_t copy = private_activations(N) ? cpu_matmul_work_per_copy(w.type, K, N) : 0;
  const uint8_t *xq = prepare_activations(a, x, N, K, k, a.work + static_cast<size_t>(a.ith) * copy, &xs);
  const uint8_t *wd = static_cast<const uint8_t *>(w.data);
  float *dst = static_cast<float *>(a.n.data);
  // Threads take row chunks from a shared counter (each weight byte is read by one thread).
  const int64_t chunk = row_chunk(M, N, a.nth);
  const int64_t n_chunks = (M + chunk - 1) / chunk;
  const Tiles tiles = tile_kind(w, K, M);
  const bool halfsum = f16_halfsum_path(w.type, N, false);
  for (int64_t c = a.pool.take_items(); c < n_chunks; c = a.pool.take_items()) {
    const int64_t m0 = c * chunk, m1 = m0 + chunk < M ? m0 + chunk : M;
    if (tiles != Tiles::None) {
      for (int64_t n0 = 0; n0 < N; n0 += kTileCols) {
        const int nc = static_cast<int>(N - n0 < kTileCols ? N - n0 : kTileCols);
        float *outs[kTileCols];
        const void *xs_[kTileCols];
        for (int q = 0; q < nc; ++q) { outs[q] = dst + (n0 + q) * M + m0; xs_[q] = xq + (n0 + q) * xs; }
        const bool gemm = ref_order_path(w.type, K, M, N, n0, false) == RefPath::RepackGemm;
        run_tiles(tiles, K, m1 - m0, nc, outs, wd + m0 * w.nb[1], w.nb[1], xs_, gemm);
      }
      continue;
    }
    if (halfsum) {
      f16_halfsum_dot_rows(static_cast<int>(K), static_cast<int>(m1 - m0), dst + m0, wd + m0 * w.nb[1], w.nb[1], xq);
      continue;
    }
    for (int64_t n = 0; n < N; ++n)
      dot_rows(w.type, static_cast<int>(K), static_cast<int>(m1 - m0), dst + n * M + m0, wd + m0 * w.nb[1], w.nb[1], xq + n * xs,
               ref_order_path(w.type, K, M, N, n, false));
  }
}

// MoE: out[:, j, t] = W[ids[j, t]] @ x[:, j or 0, t]. Tokens are grouped by expert so each
// expert's weight rows are read once for all the tokens routed to it.
void cpu_matmul_id(const CpuKernelArgs &a) {
  const Node &w = a.src(0), &x = a.src(1), &ids = a.src(2);
  const int64_t K = w.ne[0], M = w.ne[1], E = w.ne[2];
  const int64_t n_used = ids.ne[0], T = ids.ne[1], X = x.ne[1];
  const CpuTypeKernels &k = cpu_type_kernels(w.type);
  // Work layout: [converted activations][counts E][offsets E][entries n_used*T], once, or
  // once per thread (private_activations: each thread converts and routes on its own).
  const bool priv = private_activations(X * T);
  const size_t act_bytes = k.vec_dot_type == DType::F32 ? 0 : row_size(k.vec_dot_type, K) * static_cast<size_t>(X * T);
  const size_t act_pad = (act_bytes + 63) / 64 * 64;
  uint8_t *work = a.work + (priv ? static_cast<size_t>(a.ith) * cpu_matmul_id_work_per_copy(act_bytes, E, n_used * T) : 0);
  int32_t *counts = reinterpret_cast<int32_t *>(work + act_pad);
  int32_t *offsets = counts + E;
  int32_t *entries = offsets + E;  // (j * T + t) grouped by expert
  if (priv || a.ith == 0) {
    std::memset(counts, 0, static_cast<size_t>(E) * 4);
    const int32_t *id = static_cast<const int32_t *>(ids.data);
    bool bad = false;
    for (int64_t i = 0; i < n_used * T; ++i) {
      const int32_t e = id[i];
      if (e < 0 || e >= E) { bad = true; continue; }
      counts[e]++;
    }
    if (bad) a.error->store(kErrBadExpertId);
    int32_t acc = 0;
    for (int64_t e = 0; e < E; ++e) { offsets[e] = acc; acc += counts[e]; }
    std::memset(counts, 0, static_cast<size_t>(E) * 4);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < n_used; ++j) {
        const int32_t e = id[t * n_used + j];
        if (e < 0 || e >= E) continue;
        entries[offsets[e] + counts[e]++] = static_cast<int32_t>(j * T + t);
      }
  }
  size_t xs;
  const uint8_t *xq = prepare_activations(a, x, X * T, K, k, work, &xs);
  if (!priv) a.pool.barrier();  // routing tables (thread 0) and converted activations are ready
  const uint8_t *wd = static_cast<const uint8_t *>(w.data);
  float *dst = static_cast<float *>(a.n.data);
  int64_t n_active = 0;
  for (int64_t e = 0; e < E; ++e) n_active += counts[e] != 0;
  // Work items: (active expert, row chunk) in expert order, taken from a shared counter so
  // the threads that are running do the work (see ThreadPool::take_items). Batch 1: long
  // chunks, each one sequential stream for the prefetchers.
  const int64_t chunk_all = row_chunk(M * n_active, n_used * T == n_active ? 1 : 2, a.nth);
  const int64_t chunk = chunk_all < M ? chunk_all : M;
  const int64_t n_chunks = (M + chunk - 1) / chunk;
  const Tiles tiles = tile_kind(w, K, M);
  const bool halfsum = f16_halfsum_path(w.type, 1, true);
  // Each thread's items increase, so it walks the experts forward: e, and first = the
  // index of e's first item.
  int64_t e = 0, first = 0;
  for (int64_t item = a.pool.take_items();; item = a.pool.take_items()) {
    while (e < E && (counts[e] == 0 || item >= first + n_chunks)) {
      if (counts[e]) first += n_chunks;
      ++e;
    }
    if (e >= E) break;
    const int32_t cnt = counts[e];
    const uint8_t *we = wd + e * w.nb[2];
    {
      const int64_t c = item - first;
      const int64_t m0 = c * chunk, m1 = m0 + chunk < M ? m0 + chunk : M;
      if (tiles != Tiles::None) {  // the reference runs experts one token at a time: Q4_K gemv order
        for (int32_t q0 = 0; q0 < cnt; q0 += kTileCols) {
          const int nc = cnt - q0 < kTileCols ? cnt - q0 : kTileCols;
          float *outs[kTileCols];
          const void *xs_[kTileCols];
          for (int q = 0; q < nc; ++q) {
            const int32_t jt = entries[offsets[e] + q0 + q];
            const int64_t j = jt / T, t = jt % T;
            outs[q] = dst + (t * n_used + j) * M + m0;
            xs_[q] = xq + (X == 1 ? t : t * X + j) * xs;
          }
          run_tiles(tiles, K, m1 - m0, nc, outs, we + m0 * w.nb[1], w.nb[1], xs_, false);
        }
        continue;
      }
      for (int32_t q = 0; q < cnt; ++q) {
        const int32_t jt = entries[offsets[e] + q];
        const int64_t j = jt / T, t = jt % T;
        const uint8_t *xrow = xq + (X == 1 ? t : t * X + j) * xs;
        if (halfsum) {
          f16_halfsum_dot_rows(static_cast<int>(K), static_cast<int>(m1 - m0), dst + (t * n_used + j) * M + m0,
                               we + m0 * w.nb[1], w.nb[1], xrow);
          continue;
        }
        dot_rows(w.type, static_cast<int>(K), static_cast<int>(m1 - m0), dst + (t * n_used + j) * M + m0,
                 we + m0 * w.nb[1], w.nb[1], xrow, ref_order_path(w.type, K, M, 1, 0, true));
      }
    }
  }
}

void cpu_get_rows(const CpuKernelArgs &a) {
  const Node &t = a.src(0), &ids = a.src(1);
  const int32_t *id = static_cast<const int32_t *>(ids.data);
  const int64_t n = ids.ne[0];
  int64_t r0, r1;
  split_rows(n, a.ith, a.nth, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t row = id[r];
    float *dst = reinterpret_cast<float *>(static_cast<uint8_t *>(a.n.data) + r * a.n.nb[1]);
    if (row < 0 || row >= t.ne[1]) { a.error->store(kErrBadTokenId); std::memset(dst, 0, static_cast<size_t>(t.ne[0]) * 4); continue; }
    dequantize_row(t.type, static_cast<const uint8_t *>(t.data) + row * t.nb[1], dst, t.ne[0]);
  }
}

}  // namespace moe
