#include "memory/planner.h"

#include <algorithm>
#include <map>

#include "core/status.h"

namespace moe {

bool op_can_run_in_place(Op op) {
  switch (op) {
    case Op::Mul: case Op::Add: case Op::Scale: case Op::Rope: case Op::Softmax:
    case Op::Sigmoid: case Op::NormSum: case Op::SwiGLU: case Op::RmsNorm:
      return true;
    default:
      return false;
  }
}

namespace {

// First-fit free list with coalescing; `top` is the arena's high-water mark.
class Arena {
public:
  size_t alloc(size_t size) {
    size = (size + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
    if (size == 0) size = kArenaAlign;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= size) {
        size_t off = it->first, rest = it->second - size;
        free_.erase(it);
        if (rest) free_[off + size] = rest;
        return off;
      }
    }
    // Extend the top; if the last free block touches the top, start there.
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == top_) {
        size_t off = last->first;
        free_.erase(last);
        top_ = off + size;
        return off;
      }
    }
    size_t off = top_;
    top_ += size;
    return off;
  }
  void release(size_t off, size_t size) {
    size = (size + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
    if (size == 0) size = kArenaAlign;
    auto it = free_.emplace(off, size).first;
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  size_t top() const { return top_; }

private:
  std::map<size_t, size_t> free_;
  size_t top_ = 0;
};

bool needs_arena(const Node &n) {
  if (n.leaf == LeafKind::Weight) return false;
  if (n.op == Op::KvStore) return false;  // writes into the KV cache, produces nothing
  return true;
}

}  // namespace

PlanStats plan_memory(Graph &g, const WorkSizeFn &work_size, const std::vector<int> &keep_until) {
  auto &nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  PlanStats st;

  // Raw last use of each node's value.
  std::vector<int> last_use(static_cast<size_t>(n), -1);
  for (int i = 0; i < n; ++i) {
    last_use[static_cast<size_t>(i)] = std::max(last_use[static_cast<size_t>(i)], i);
    for (int s : nodes[static_cast<size_t>(i)].src)
      if (s >= 0) last_use[static_cast<size_t>(s)] = std::max(last_use[static_cast<size_t>(s)], i);
  }
  for (size_t i = 0; i < keep_until.size() && i < last_use.size(); ++i) last_use[i] = std::max(last_use[i], std::min(keep_until[i], n - 1));
  std::vector<bool> pinned(static_cast<size_t>(n), false);  // inputs and outputs: live for the whole run
  for (int id : g.outputs()) pinned[static_cast<size_t>(id)] = true;
  for (int i = 0; i < n; ++i)
    if (nodes[static_cast<size_t>(i)].leaf == LeafKind::Input) pinned[static_cast<size_t>(i)] = true;

  Arena arenas[kMaxDevices];
  // Storage roots: end of life per root (extended by views and in-place successors).
  std::vector<int> root_end(static_cast<size_t>(n), -1);

  auto root_of = [&](int id) { return nodes[static_cast<size_t>(id)].storage; };

  // Inputs are uploaded before the run starts, so they are live from its first node, not from
  // where they were declared: place them before anything else (a late-declared input must
  // not reuse the bytes of a value computed earlier in the run).
  for (int i = 0; i < n; ++i) {
    Node &nd = nodes[static_cast<size_t>(i)];
    if (nd.leaf != LeafKind::Input || nd.op == Op::View || !needs_arena(nd)) continue;
    if (nd.device < 0 || nd.device >= kMaxDevices) fail(Status::Internal, "node %d has no device", i);
    nd.storage = i;
    nd.offset = arenas[nd.device].alloc(nd.nbytes());
    root_end[static_cast<size_t>(i)] = n;
    nd.work_size = 0;
  }

  for (int i = 0; i < n; ++i) {
    Node &nd = nodes[static_cast<size_t>(i)];
    if (nd.device < 0 || nd.device >= kMaxDevices) fail(Status::Internal, "node %d has no device", i);
    if (!needs_arena(nd)) { nd.storage = -1; continue; }
    if (nd.leaf == LeafKind::Input && nd.op != Op::View) continue;  // placed above
    if (nd.op == Op::View) {
      int r = root_of(nd.src[0]);
      nd.storage = r;
      if (r >= 0) {
        nd.offset = nodes[static_cast<size_t>(r)].offset + nd.view_offset;
        int end = pinned[static_cast<size_t>(i)] ? n : last_use[static_cast<size_t>(i)];
        if (end > root_end[static_cast<size_t>(r)]) root_end[static_cast<size_t>(r)] = end;
        if (pinned[static_cast<size_t>(i)]) pinned[static_cast<size_t>(r)] = true;
      }
      continue;
    }
    const int my_end = pinned[static_cast<size_t>(i)] ? n : last_use[static_cast<size_t>(i)];
    int r0 = nd.src[0] >= 0 ? root_of(nd.src[0]) : -1;
    bool in_place = false;
    if (op_can_run_in_place(nd.op) && r0 >= 0 && !pinned[static_cast<size_t>(r0)] &&
        root_end[static_cast<size_t>(r0)] == i && nodes[static_cast<size_t>(r0)].device == nd.device &&
        nodes[static_cast<size_t>(nd.src[0])].op != Op::View && nodes[static_cast<size_t>(r0)].nbytes() == nd.nbytes()) {
      // src0's storage dies here: take it over.
      in_place = true;
      nd.storage = r0;
      nd.offset = nodes[static_cast<size_t>(r0)].offset;
      root_end[static_cast<size_t>(r0)] = my_end;
      st.n_inplace++;
    } else {
      nd.storage = i;
      nd.offset = arenas[nd.device].alloc(nd.nbytes());
      root_end[static_cast<size_t>(i)] = my_end;
    }
    // Scratch lives only while this node runs.
    nd.work_size = work_size ? work_size(i) : 0;
    if (nd.work_size) {
      if (nd.work_size > st.work_bytes[nd.device]) st.work_bytes[nd.device] = nd.work_size;
      nd.work_offset = arenas[nd.device].alloc(nd.work_size);
      arenas[nd.device].release(nd.work_offset, nd.work_size);
    }
    // Free roots whose life ends at this node. Roots are scanned lazily: any root whose
    // recorded end is i is released now (after the output was placed, so no overlap).
    for (int s : nd.src) {
      if (s < 0) continue;
      int r = root_of(s);
      if (r < 0 || r == nd.storage || pinned[static_cast<size_t>(r)]) continue;
      if (root_end[static_cast<size_t>(r)] == i) {
        arenas[nodes[static_cast<size_t>(r)].device].release(nodes[static_cast<size_t>(r)].offset, nodes[static_cast<size_t>(r)].nbytes());
        root_end[static_cast<size_t>(r)] = -2;  // released
      }
    }
    // A value nobody reads (e.g. an unused intermediate) dies immediately.
    if (!in_place && my_end == i && !pinned[static_cast<size_t>(i)]) {
      arenas[nd.device].release(nd.offset, nd.nbytes());
      root_end[static_cast<size_t>(i)] = -2;
    }
  }
  for (int d = 0; d < kMaxDevices; ++d) st.arena_bytes[d] = arenas[d].top();
  return st;
}

}  // namespace moe
