// Open-addressing hash tables for the vocabulary: token text -> id and (left, right) id pair ->
// merge. Flat arrays keep a lookup to about one cache miss, which is what makes loading a
// 200k-token, 450k-merge vocabulary and encoding with it fast.
//
//   TextIndex idx;  idx.build(texts);            // texts must outlive idx and stay unchanged
//   int32_t id = idx.find("hello");              // -1 if absent
//   PairTable m;  m.reserve(n);  m.insert(key, value);  const uint64_t *v = m.find(key);
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace moe {

inline uint64_t hash_bytes(const char *p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 29;
  return h;
}

class TextIndex {
public:
  // Returns the id of the first duplicate found (and the id it duplicates) or -1.
  int32_t build(const std::vector<std::string> &texts, int32_t *dup_of) {
    texts_ = &texts;
    size_t cap = 16;
    while (cap < texts.size() * 2) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, Slot{0, 0});
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string &t = texts[i];
      uint64_t h = hash_bytes(t.data(), t.size());
      size_t k = h & mask_;
      while (slots_[k].id1) {
        if (slots_[k].tag == uint32_t(h >> 32) && texts[slots_[k].id1 - 1] == t) {
          *dup_of = int32_t(slots_[k].id1 - 1);
          return int32_t(i);
        }
        k = (k + 1) & mask_;
      }
      slots_[k] = Slot{uint32_t(i + 1), uint32_t(h >> 32)};
    }
    return -1;
  }
  int32_t find(std::string_view s) const { return find(s, hash_bytes(s.data(), s.size())); }
  // Split lookup for batched callers: hash, prefetch the home slot, find later.
  void prefetch(uint64_t h) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[h & mask_]);
  }
  int32_t find(std::string_view s, uint64_t h) const {
    if (slots_.empty()) return -1;
    for (size_t k = h & mask_;; k = (k + 1) & mask_) {
      const Slot &sl = slots_[k];
      if (!sl.id1) return -1;
      if (sl.tag == uint32_t(h >> 32) && (*texts_)[sl.id1 - 1] == s) return int32_t(sl.id1 - 1);
    }
  }

private:
  struct Slot { uint32_t id1, tag; };  // id + 1 (0 = empty), high hash bits
  const std::vector<std::string> *texts_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

class PairTable {
public:
  static constexpr uint64_t kEmpty = ~0ull;
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n + n / 2) cap <<= 1;
    mask_ = cap - 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, 0);
  }
  // Keeps the first value inserted for a key; returns false if the key was present.
  bool insert(uint64_t key, uint64_t val) {
    for (size_t k = slot(key);; k = (k + 1) & mask_) {
      if (keys_[k] == key) return false;
      if (keys_[k] == kEmpty) {
        keys_[k] = key;
        vals_[k] = val;
        ++size_;
        return true;
      }
    }
  }
  const uint64_t *find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    for (size_t k = slot(key);; k = (k + 1) & mask_) {
      if (keys_[k] == key) return &vals_[k];
      if (keys_[k] == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

private:
  size_t slot(uint64_t key) const {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return size_t(h ^ (h >> 29)) & mask_;
  }
  std::vector<uint64_t> keys_, vals_;
  size_t mask_ = 0, size_ = 0;
};

}  // namespace moe
