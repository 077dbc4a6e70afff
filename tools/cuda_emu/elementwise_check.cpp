// Checks the flat elementwise kernel of elementwise.cu (ew_flat_kernel, 16-byte vectors and
// scalars) against the row kernel (ew_kernel) bit for bit on same-shape operands, for every op
// the flat path takes, rows whose ends fall inside a vector (SwiGLU's column); and the row
// kernel's Slice, Concat and broadcast Mul against plain host loops. Included at the end of the
// generated elementwise_emu.cpp (gen_elementwise.py). Exit status 1 on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace moe;

TView view2(float *p, int64_t n, int64_t rows) { return TView{p, {n, rows, 1, 1}, {4, n * 4, n * rows * 4, n * rows * 4}}; }

bool same(const std::vector<float> &a, const std::vector<float> &b) { return std::memcmp(a.data(), b.data(), a.size() * 4) == 0; }

}  // namespace

int main() {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 2);
  int fails = 0, checks = 0;
  auto report = [&](bool ok, const char *what, int64_t n, int64_t rows) {
    ++checks;
    if (!ok) {
      ++fails;
      std::printf("FAIL %s n=%lld rows=%lld\n", what, static_cast<long long>(n), static_cast<long long>(rows));
    }
  };
  struct Shape { int64_t n, rows; };
  const int ops[] = {kMul, kAdd, kScale, kSigmoid, kSwiGLU, kCopy, kSwiGLUOai};
  const char *names[] = {"mul", "add", "scale", "sigmoid", "swiglu", "copy", "swiglu_oai"};
  for (const Shape sh : {Shape{45, 4}, Shape{45, 1}, Shape{301, 3}, Shape{64, 5}, Shape{7, 9}, Shape{2048, 2}})
    for (int k = 0; k < 7; ++k) {
      const int op = ops[k];
      const int64_t n = sh.n, rows = sh.rows, total = n * rows;
      std::vector<float> a(static_cast<size_t>(total) + 4), b(a.size());
      for (float &v : a) v = nd(rng);
      for (float &v : b) v = nd(rng);
      const bool two = op == kMul || op == kAdd || op == kSwiGLU || op == kSwiGLUOai;
      std::vector<float> row_out(static_cast<size_t>(total)), vec_out(row_out.size()), sc_out(row_out.size() + 1);
      launch_pdl(ew_kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(row_threads(n))), 0, nullptr,
                 view2(row_out.data(), n, rows), view2(a.data(), n, rows), view2(b.data(), n, rows), op, 0.5f, 0.7f, int64_t{0});
      const dim3 grid(static_cast<unsigned>((total + 1023) / 1024));
      if (total % 4 == 0) {
        launch_pdl(ew_flat_kernel<true>, grid, dim3(256), 0, nullptr, vec_out.data(), a.data(), two ? b.data() : nullptr, total, n, op, 0.5f,
                   0.7f);
        report(same(row_out, vec_out), names[k], n, rows);
      }
      // Scalar path at a 4-byte offset (what a misaligned view takes).
      launch_pdl(ew_flat_kernel<false>, grid, dim3(256), 0, nullptr, sc_out.data() + 1, a.data(), two ? b.data() : nullptr, total, n, op,
                 0.5f, 0.7f);
      report(std::memcmp(row_out.data(), sc_out.data() + 1, row_out.size() * 4) == 0, names[k], n, rows);
    }
  // Row kernel: Slice, Concat, broadcast Mul against host loops (exact).
  for (const Shape sh : {Shape{45, 3}, Shape{600, 2}, Shape{2048, 2}}) {
    const int64_t n = sh.n, rows = sh.rows, start = 3, len = n - 5;
    std::vector<float> a(static_cast<size_t>(n * rows)), b(a.size()), w(static_cast<size_t>(n));
    for (float &v : a) v = nd(rng);
    for (float &v : b) v = nd(rng);
    for (float &v : w) v = nd(rng);
    std::vector<float> sl(static_cast<size_t>(len * rows)), cc(static_cast<size_t>(2 * n * rows)), mw(a.size());
    launch_pdl(ew_kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(row_threads(len))), 0, nullptr,
               view2(sl.data(), len, rows), view2(a.data(), n, rows), view2(a.data(), n, rows), int(kSlice), 0.0f, 0.0f, start);
    launch_pdl(ew_kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(row_threads(2 * n))), 0, nullptr,
               view2(cc.data(), 2 * n, rows), view2(a.data(), n, rows), view2(b.data(), n, rows), int(kConcat), 0.0f, 0.0f, int64_t{0});
    launch_pdl(ew_kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(row_threads(n))), 0, nullptr,
               view2(mw.data(), n, rows), view2(a.data(), n, rows), view2(w.data(), n, 1), int(kMul), 0.0f, 0.0f, int64_t{0});
    bool s_ok = true, c_ok = true, m_ok = true;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < len; ++i) s_ok &= sl[r * len + i] == a[r * n + start + i];
      for (int64_t i = 0; i < 2 * n; ++i) c_ok &= cc[r * 2 * n + i] == (i < n ? a[r * n + i] : b[r * n + i - n]);
      for (int64_t i = 0; i < n; ++i) m_ok &= mw[r * n + i] == a[r * n + i] * w[i];
    }
    report(s_ok, "slice", n, rows);
    report(c_ok, "concat", n, rows);
    report(m_ok, "broadcast mul", n, rows);
  }
  std::printf("%d of %d checks failed\n", fails, checks);
  return fails ? 1 : 0;
}
