// Encoding: special/added tokens are cut out first (reference order: longest token text first,
// leftmost non-overlapping occurrences), the remaining text goes through the pre-tokenizer and
// BPE (byte-level) or the SentencePiece merge loop.
#include <algorithm>
#include <cstdio>
#include <map>
#include <queue>

#include "core/status.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pair_queue.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace moe {

namespace {

struct Fragment {
  size_t begin, end;  // raw text span, or
  int32_t token;      // >= 0: a special token
};

}  // namespace

// Split text into raw spans and special tokens. Equivalent to the reference's sequential
// algorithm (for each special token, longest first, split every remaining raw span at its
// leftmost non-overlapping occurrences), but finds all candidate occurrences in one pass.
template <typename Set>
static void partition(const Set &set, std::string_view text, std::vector<Fragment> &out) {
  out.clear();
  struct Cand { size_t prio, pos, len; };
  std::vector<Cand> cands;
  if (!set.ids.empty()) {
    for (size_t p = 0; p < text.size(); ++p) {
      if (!set.first_byte[uint8_t(text[p])]) continue;
      for (size_t len : set.lengths) {
        if (p + len > text.size()) break;
        int32_t prio = set.index.find(text.substr(p, len));
        if (prio >= 0) cands.push_back({size_t(prio), p, len});
      }
    }
  }
  if (cands.empty()) {
    if (!text.empty()) out.push_back({0, text.size(), -1});
    return;
  }
  std::sort(cands.begin(), cands.end(), [](const Cand &a, const Cand &b) {
    return a.prio != b.prio ? a.prio < b.prio : a.pos < b.pos;
  });
  std::map<size_t, std::pair<size_t, int32_t>> taken;  // start -> (end, token)
  for (const Cand &c : cands) {
    size_t e = c.pos + c.len;
    auto it = taken.lower_bound(c.pos);
    if (it != taken.end() && it->first < e) continue;
    if (it != taken.begin() && std::prev(it)->second.first > c.pos) continue;
    taken.emplace(c.pos, std::make_pair(e, set.ids[c.prio]));
  }
  size_t at = 0;
  for (const auto &t : taken) {
    if (t.first > at) out.push_back({at, t.first, -1});
    out.push_back({t.first, t.second.first, t.second.second});
    at = t.second.first;
  }
  if (at < text.size()) out.push_back({at, text.size(), -1});
}

std::vector<int32_t> Vocab::encode(std::string_view text, bool add_special, bool parse_special) const {
  if (text.size() >= size_t(UINT32_MAX))  // word lengths and offsets are 32-bit
    fail(Status::InvalidArgument, "encode: text of %zu bytes is too long (limit 4 GiB)", text.size());
  std::vector<int32_t> out;
  if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
  std::vector<Fragment> frags;
  partition(parse_special ? specials_all_ : specials_user_, text, frags);
  bool prev_special = true;  // SentencePiece: a space is prefixed at the start and after specials
  for (const Fragment &fr : frags) {
    if (fr.token >= 0) {
      out.push_back(fr.token);
      prev_special = true;
      continue;
    }
    std::string_view raw = text.substr(fr.begin, fr.end - fr.begin);
    if (kind_ == VocabKind::BPE) {
      encode_text_bpe(raw, out);
    } else {
      std::string s;
      if (add_space_prefix_ && prev_special) s.push_back(' ');
      s.append(raw);
      encode_text_spm(s, out);
    }
    prev_special = false;
  }
  if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

// ---- byte-level BPE -------------------------------------------------------------------------

void Vocab::encode_text_bpe(std::string_view text, std::vector<int32_t> &out) const {
  std::vector<uint32_t> cps, offs;
  cps.reserve(text.size());
  offs.reserve(text.size() + 1);
  // The reference re-encodes the decoded code points, so ill-formed input becomes U+FFFD; when
  // every sequence re-encodes to itself, words are plain slices of the input.
  bool exact = true;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    uint32_t cp = utf8_decode(text.data() + i, text.size() - i, &len);
    exact &= len == (cp < 0x80 ? 1u : cp < 0x800 ? 2u : cp < 0x10000 ? 3u : 4u);
    cps.push_back(cp);
    offs.push_back(uint32_t(i));
    i += len;
  }
  offs.push_back(uint32_t(text.size()));
  std::vector<uint32_t> words;
  pre_.split(cps.data(), cps.size(), words);
  std::string bytes, encoded;
  size_t at = 0;
  for (uint32_t wl : words) {
    std::string_view word;
    if (exact) {
      word = text.substr(offs[at], offs[at + wl] - offs[at]);
    } else {
      bytes.clear();
      for (size_t k = at; k < at + wl; ++k) utf8_append(bytes, cps[k]);
      word = bytes;
    }
    at += wl;
    if (pre_.ignore_merges()) {
      encoded.clear();
      for (unsigned char b : word) utf8_append(encoded, byte_to_cp_table()[b]);
      int32_t id = text_to_token(encoded);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    bpe_word(word, out);
  }
}

// Merge loop of one word: always merge the adjacent pair with the lowest rank (leftmost on
// ties), like the reference's priority queue. Symbols carry the byte offset they start at.
void Vocab::bpe_word(std::string_view bytes, std::vector<int32_t> &out) const {
  const size_t n = bytes.size();
  constexpr uint32_t kNone = 0xFFFFFFFFu;
  auto lookup = [&](int32_t a, int32_t b, int32_t *merged) -> uint32_t {
    if (a < 0 || b < 0) return kNone;
    const uint64_t *m = merges_.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
    if (!m) return kNone;
    *merged = int32_t(uint32_t(*m));
    return uint32_t(*m >> 32);
  };
  auto emit = [&](int32_t id, size_t pos) {
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    // Not a token: a single byte whose byte-level character is missing from the vocabulary;
    // the reference then looks up each byte of that character's text on its own.
    std::string ch;
    utf8_append(ch, byte_to_cp_table()[uint8_t(bytes[pos])]);
    for (char c : ch) {
      int32_t b = text_to_token(std::string_view(&c, 1));
      if (b >= 0) out.push_back(b);
    }
  };
  if (n == 0) return;
  if (n == 1) {
    emit(byte_token_[uint8_t(bytes[0])], 0);
    return;
  }

  // Short words: linear scan over the pair ranks (O(n^2) but cache-friendly); longer ones (CJK
  // runs, long identifiers) use the priority queue. 32 measured best on bench-tokenizer.
  constexpr size_t kShortWord = 32;
  if (n <= kShortWord) {
    int32_t sym[kShortWord], merged[kShortWord];
    uint32_t rank[kShortWord];
    uint8_t pos[kShortWord];
    size_t m = n;
    for (size_t i = 0; i < n; ++i) { sym[i] = byte_token_[uint8_t(bytes[i])]; pos[i] = uint8_t(i); }
    for (size_t i = 0; i + 1 < m; ++i) rank[i] = lookup(sym[i], sym[i + 1], &merged[i]);
    while (m > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < m; ++i)
        if (rank[i] < rank[best]) best = i;
      if (rank[best] == kNone) break;
      sym[best] = merged[best];
      for (size_t i = best + 1; i + 1 < m; ++i) { sym[i] = sym[i + 1]; pos[i] = pos[i + 1]; }
      for (size_t i = best + 1; i + 2 < m; ++i) { rank[i] = rank[i + 1]; merged[i] = merged[i + 1]; }
      --m;
      if (best > 0) rank[best - 1] = lookup(sym[best - 1], sym[best], &merged[best - 1]);
      if (best + 1 < m) rank[best] = lookup(sym[best], sym[best + 1], &merged[best]);
    }
    for (size_t i = 0; i < m; ++i) emit(sym[i], pos[i]);
    return;
  }

  if (n > kLongInput) {
    bpe_word_windows(bytes, out);
    return;
  }
  if (n >= kQueueInput) {  // the same order, faster than the heap below on long words
    PairQueue q(n_merges_);
    bpe_merge_window(bytes, n, q, out);
    return;
  }

  // long words: linked list over byte positions + priority queue with stale-entry checks
  struct Node { int32_t id; int prev, next; };
  std::vector<Node> nodes(n);
  for (size_t i = 0; i < n; ++i) nodes[i] = {byte_token_[uint8_t(bytes[i])], int(i) - 1, i + 1 < n ? int(i) + 1 : -1};
  struct Item { uint32_t rank; int left; int32_t a, b, merged; };
  auto cmp = [](const Item &x, const Item &y) { return x.rank != y.rank ? x.rank > y.rank : x.left > y.left; };
  std::priority_queue<Item, std::vector<Item>, decltype(cmp)> q(cmp);
  auto push = [&](int l) {
    if (l < 0 || nodes[size_t(l)].next < 0) return;
    int r = nodes[size_t(l)].next;
    int32_t mid = -1;
    uint32_t rk = lookup(nodes[size_t(l)].id, nodes[size_t(r)].id, &mid);
    if (rk != kNone) q.push({rk, l, nodes[size_t(l)].id, nodes[size_t(r)].id, mid});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int(i));
  while (!q.empty()) {
    Item it = q.top();
    q.pop();
    Node &L = nodes[size_t(it.left)];
    if (L.id != it.a || L.next < 0 || nodes[size_t(L.next)].id != it.b) continue;  // stale
    int r = L.next;
    L.id = it.merged;
    L.next = nodes[size_t(r)].next;
    if (L.next >= 0) nodes[size_t(L.next)].prev = it.left;
    nodes[size_t(r)].id = -2;  // unlinked
    push(L.prev);
    push(it.left);
  }
  for (int i = 0; i >= 0; i = nodes[size_t(i)].next) emit(nodes[size_t(i)].id, size_t(i));
}

// Words longer than kLongInput (a run of letters megabytes long) are merged window by window.
// The merge over every pair of a 10 MB word took 11-29 s and 568 MB: its heap outgrows the
// caches, and the time per pair grows with the word. A window of kLongInput + kLookahead bytes
// is merged exactly (bpe_merge_window: the reference's order, lowest rank then leftmost), its
// symbols up to the last boundary at or before kLongInput are emitted, and the next window
// starts at that boundary. Time and memory are then linear in the word. A window's cut is a
// boundary its own merge made with kLookahead bytes of text to the right, so the ids are the
// reference's unless a merge there depended on text more than kLookahead bytes away (an
// unbounded chain of merge decisions, which no vocabulary of the supported models produced on
// the texts tested; docs/tokenizer.md).
void Vocab::bpe_word_windows(std::string_view bytes, std::vector<int32_t> &out) const {
  PairQueue q(n_merges_);
  for (size_t s = 0; s < bytes.size();) {
    const size_t e = std::min(bytes.size(), s + kLongInput + kLookahead);
    s += bpe_merge_window(bytes.substr(s, e - s), e == bytes.size() ? e - s : kLongInput, q, out);
  }
}

// One window's merge (or a whole word of kQueueInput..kLongInput bytes), through a PairQueue
// (one queue entry per rank; pairs waiting by position): on 8-64 KiB it is 3-6x faster than the
// heap of every pair, whose stale entries pile up. An entry is still valid
// when its node's current pair has the entry's rank: ranks are unique per pair (the first of
// duplicate merges wins), and once (a, b) merged at a node the node's token only grows, so
// (a, b) never comes back there. Emits the symbols that end at or before cut (at least half of
// cut, or one symbol, so every window makes progress) and returns the bytes they cover.
size_t Vocab::bpe_merge_window(std::string_view bytes, size_t cut, PairQueue &q, std::vector<int32_t> &out) const {
  const size_t n = bytes.size();
  constexpr uint32_t kNone = 0xFFFFFFFFu;
  struct Node { int32_t id; int32_t prev, next; uint32_t rank; };  // rank: of the pair (this, next)
  std::vector<Node> nodes(n);
  q.clear();
  auto set_pair = [&](int32_t l) {
    Node &L = nodes[size_t(l)];
    L.rank = kNone;
    if (L.next < 0 || L.id < 0 || nodes[size_t(L.next)].id < 0) return;
    const uint64_t *m = merges_.find((uint64_t(uint32_t(L.id)) << 32) | uint32_t(nodes[size_t(L.next)].id));
    if (!m) return;
    L.rank = uint32_t(*m >> 32);
    q.push(L.rank, uint32_t(l), 0);
  };
  for (size_t i = 0; i < n; ++i)
    nodes[i] = {byte_token_[uint8_t(bytes[i])], int32_t(i) - 1, i + 1 < n ? int32_t(i) + 1 : -1, kNone};
  for (size_t i = 0; i + 1 < n; ++i) set_pair(int32_t(i));
  uint32_t r, left, tag;
  while (q.pop(&r, &left, &tag)) {
    Node &L = nodes[left];
    if (L.rank != r) continue;  // stale: the pair at left changed, or left was merged away
    const int32_t rr = L.next;
    const uint64_t *m = merges_.find((uint64_t(uint32_t(L.id)) << 32) | uint32_t(nodes[size_t(rr)].id));
    L.id = int32_t(uint32_t(*m));
    L.next = nodes[size_t(rr)].next;
    if (L.next >= 0) nodes[size_t(L.next)].prev = int32_t(left);
    nodes[size_t(rr)].id = -2;  // unlinked
    nodes[size_t(rr)].rank = kNone;
    if (L.prev >= 0) set_pair(L.prev);
    set_pair(int32_t(left));
  }
  size_t done = 0;
  for (int32_t i = 0; i >= 0; i = nodes[size_t(i)].next) {
    const size_t end = nodes[size_t(i)].next < 0 ? n : size_t(nodes[size_t(i)].next);
    if (end > cut && done > 0 && done >= cut / 2) break;
    const int32_t id = nodes[size_t(i)].id;
    if (id >= 0) {
      out.push_back(id);
    } else {
      // As bpe_word's emit: a byte whose byte-level character is not a token.
      std::string ch;
      utf8_append(ch, byte_to_cp_table()[uint8_t(bytes[size_t(i)])]);
      for (char c : ch) {
        int32_t b = text_to_token(std::string_view(&c, 1));
        if (b >= 0) out.push_back(b);
      }
    }
    done = end;
  }
  return done;
}

// ---- SentencePiece BPE ----------------------------------------------------------------------

int32_t Vocab::spm_byte_token(uint8_t b) const {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  int32_t id = text_to_token(buf);
  if (id >= 0) return id;
  char c = char(b);
  id = text_to_token(std::string_view(&c, 1));
  return id >= 0 ? id : unk_;
}

void Vocab::spm_emit(const std::string &text, size_t off, size_t n, std::vector<int32_t> &out) const {
  int32_t id = text_to_token(std::string_view(text.data() + off, n));
  if (id >= 0) {
    out.push_back(id);
    return;
  }
  for (size_t k = 0; k < n; ++k) {
    int32_t bt = spm_byte_token(uint8_t(text[off + k]));
    if (bt >= 0) out.push_back(bt);
  }
}

void Vocab::encode_text_spm(std::string_view in, std::vector<int32_t> &out) const {
  std::string text;
  text.reserve(in.size() + 8);
  for (char c : in) {
    if (c == ' ') text.append("\xe2\x96\x81");
    else text.push_back(c);
  }
  if (text.size() > kLongInput) {
    spm_windows(text, out);
    return;
  }
  if (text.size() >= kQueueInput) {  // the same order, faster than the heap below on long texts
    PairQueue q(n_score_ranks_);
    spm_merge_window(text, 0, text.size(), text.size(), q, out);
    return;
  }
  struct Sym { size_t off, n; int prev, next; };
  std::vector<Sym> syms;
  static const uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  for (size_t off = 0; off < text.size();) {
    size_t len = std::min<size_t>(kLen[uint8_t(text[off]) >> 4], text.size() - off);
    int idx = int(syms.size());
    syms.push_back({off, len, idx - 1, off + len == text.size() ? -1 : idx + 1});
    off += len;
  }
  struct Big { float score; int left, right; size_t size; };
  auto cmp = [](const Big &a, const Big &b) { return a.score < b.score || (a.score == b.score && a.left > b.left); };
  std::priority_queue<Big, std::vector<Big>, decltype(cmp)> q(cmp);
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    std::string_view t(text.data() + syms[size_t(l)].off, syms[size_t(l)].n + syms[size_t(r)].n);
    int32_t id = text_to_token(t);
    if (id < 0) return;
    q.push({scores_[size_t(id)], l, r, t.size()});
  };
  for (size_t i = 1; i < syms.size(); ++i) try_add(int(i) - 1, int(i));
  while (!q.empty()) {
    Big b = q.top();
    q.pop();
    Sym &L = syms[size_t(b.left)];
    Sym &R = syms[size_t(b.right)];
    if (L.n == 0 || R.n == 0 || L.n + R.n != b.size) continue;
    L.n += R.n;
    R.n = 0;
    L.next = R.next;
    if (R.next >= 0) syms[size_t(R.next)].prev = b.left;
    try_add(L.prev, b.left);
    try_add(b.left, L.next);
  }
  for (int i = syms.empty() ? -1 : 0; i != -1; i = syms[size_t(i)].next) spm_emit(text, syms[size_t(i)].off, syms[size_t(i)].n, out);
}

// SentencePiece has no pre-tokenizer: the whole text between special tokens is one merge, so
// long documents are normal input here. Texts longer than kLongInput are merged window by
// window like long BPE words (bpe_word_windows), preferring a cut no merge can cross: just
// before a U+2581 that follows another character, when no token has a U+2581 after another
// character (spm_space_cut_, true for SentencePiece models trained with whitespace splitting,
// such as llama's). Such a cut keeps the ids exactly the reference's; without one in the
// window's second half, the cut is a symbol boundary of the window's merge with kLookahead
// bytes of text to its right.
void Vocab::spm_windows(const std::string &text, std::vector<int32_t> &out) const {
  static const char kSpace[] = "\xe2\x96\x81";
  PairQueue q(n_score_ranks_);
  for (size_t s = 0; s < text.size();) {
    if (text.size() - s <= kLongInput + kLookahead) {
      s += spm_merge_window(text, s, text.size(), text.size() - s, q, out);
      continue;
    }
    if (spm_space_cut_) {
      size_t p = s + kLongInput;
      while (p > s + kLongInput / 2 && !(text.compare(p, 3, kSpace) == 0 && text.compare(p - 3, 3, kSpace) != 0)) --p;
      if (p > s + kLongInput / 2) {
        s += spm_merge_window(text, s, p, p - s, q, out);
        continue;
      }
    }
    s += spm_merge_window(text, s, s + kLongInput + kLookahead, kLongInput, q, out);
  }
}

// One window [begin, end) of text: the same merge order as encode_text_spm (highest score,
// then leftmost) through a PairQueue keyed by the merged token's score rank. An entry carries
// the pair's byte length: the pair at its left symbol is still the one it was made for when
// the length matches (the left symbol only grows, and a pair of that length starting there is
// that text, so that token and score). Emits the symbols ending at or before begin + cut (at
// least half of it, or one symbol) and returns the bytes they cover.
size_t Vocab::spm_merge_window(const std::string &text, size_t begin, size_t end, size_t cut, PairQueue &q,
                               std::vector<int32_t> &out) const {
  struct Sym { uint32_t off, n; int32_t prev, next; };  // off: from begin
  std::vector<Sym> syms;
  syms.reserve(end - begin);
  static const uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  for (size_t off = 0; off < end - begin;) {
    const size_t len = std::min<size_t>(kLen[uint8_t(text[begin + off]) >> 4], end - begin - off);
    const int32_t idx = int32_t(syms.size());
    syms.push_back({uint32_t(off), uint32_t(len), idx - 1, off + len == end - begin ? -1 : idx + 1});
    off += len;
  }
  const char *base = text.data() + begin;
  q.clear();
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t size = syms[size_t(l)].n + syms[size_t(r)].n;
    const int32_t id = text_to_token(std::string_view(base + syms[size_t(l)].off, size));
    if (id >= 0) q.push(score_rank_[size_t(id)], uint32_t(l), size);
  };
  for (size_t i = 1; i < syms.size(); ++i) try_add(int32_t(i) - 1, int32_t(i));
  uint32_t key, left, size;
  while (q.pop(&key, &left, &size)) {
    Sym &L = syms[left];
    if (L.n == 0 || L.next < 0) continue;
    Sym &R = syms[size_t(L.next)];
    if (L.n + R.n != size) continue;  // stale
    L.n += R.n;
    R.n = 0;
    L.next = R.next;
    if (L.next >= 0) syms[size_t(L.next)].prev = int32_t(left);
    try_add(L.prev, int32_t(left));
    try_add(int32_t(left), L.next);
  }
  size_t done = 0;
  for (int32_t i = syms.empty() ? -1 : 0; i != -1; i = syms[size_t(i)].next) {
    const Sym &sy = syms[size_t(i)];
    if (sy.off + sy.n > cut && done > 0 && done >= cut / 2) break;
    spm_emit(text, begin + sy.off, sy.n, out);
    done = sy.off + sy.n;
  }
  return done;
}

}  // namespace moe
