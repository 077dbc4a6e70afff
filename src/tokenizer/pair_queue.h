// Merge queue for very long words: hands out waiting pairs in (key, left position) order, like
// a priority queue over every pair, but with one queue entry per distinct key. Pairs of one key
// wait in a list by position; in a merge loop they are almost always appended in position
// order, so each pair is appended and taken once (linear time, and a list is walked in
// position order, which the caches like), and the few that arrive behind the list's head go
// to a small per-key heap instead.
//
//   PairQueue q(n_keys);
//   q.push(key, left, tag);                 // key < n_keys: lower keys first, then lower left
//   uint32_t key, left, tag;
//   while (q.pop(&key, &left, &tag)) { if (still_valid(left, key, tag)) merge(left); }
//
// Entries are never removed: callers skip stale ones when popped (tag: whatever identifies the
// pair the entry was made for).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace moe {

class PairQueue {
public:
  explicit PairQueue(size_t n_keys) : list_of_(n_keys, kNone) {}

  // Empty again, for the next word (cost: the keys used, not n_keys).
  void clear() {
    for (const List &l : lists_) list_of_[l.key] = kNone;
    lists_.clear();
    keys_ = decltype(keys_)();
  }

  void push(uint32_t key, uint32_t left, uint32_t tag) {
    uint32_t &li = list_of_[key];
    if (li == kNone) {
      li = uint32_t(lists_.size());
      lists_.emplace_back();
      lists_.back().key = key;
    }
    List &l = lists_[li];
    if (l.done == l.in_order.size()) {  // nothing waiting in order: start over
      l.in_order.clear();
      l.done = 0;
    }
    if (l.in_order.size() == l.done || l.in_order.back().left <= left) {
      l.in_order.push_back({left, tag});
    } else {
      l.late.push_back({left, tag});
      std::push_heap(l.late.begin(), l.late.end(), later);
    }
    if (!l.queued) {
      l.queued = true;
      keys_.push(key);
    }
  }

  // The waiting entry with the lowest key, leftmost among equal keys; false when none is left.
  bool pop(uint32_t *key, uint32_t *left, uint32_t *tag) {
    while (!keys_.empty()) {
      const uint32_t k = keys_.top();
      List &l = lists_[list_of_[k]];
      const bool have_in_order = l.done < l.in_order.size();
      if (!have_in_order && l.late.empty()) {  // finished (for now): free the list's memory
        keys_.pop();
        l.queued = false;
        std::vector<Entry>().swap(l.in_order);
        std::vector<Entry>().swap(l.late);
        l.done = 0;
        continue;
      }
      Entry e;
      if (have_in_order && (l.late.empty() || l.in_order[l.done].left <= l.late.front().left)) {
        e = l.in_order[l.done++];
      } else {
        std::pop_heap(l.late.begin(), l.late.end(), later);
        e = l.late.back();
        l.late.pop_back();
      }
      *key = k;
      *left = e.left;
      *tag = e.tag;
      return true;
    }
    return false;
  }

private:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;
  struct Entry { uint32_t left, tag; };
  static bool later(const Entry &a, const Entry &b) { return a.left > b.left; }  // min-heap by left
  struct List {
    std::vector<Entry> in_order;  // [done, size) ascending by left
    size_t done = 0;
    std::vector<Entry> late;      // min-heap: entries that arrived left of in_order's tail
    bool queued = false;          // key is in keys_
    uint32_t key = 0;
  };
  std::vector<uint32_t> list_of_;  // key -> index into lists_
  std::vector<List> lists_;
  std::priority_queue<uint32_t, std::vector<uint32_t>, std::greater<uint32_t>> keys_;
};

}  // namespace moe
