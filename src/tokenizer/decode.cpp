// Decoding: token -> bytes, whole sequences, and the streaming detokenizer.
#include "core/status.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace moe {

std::string Vocab::token_to_piece(int32_t id, bool render_special) const {
  check_id(id);
  int32_t t = types_[size_t(id)];
  if (!render_special && (t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_UNKNOWN)) return {};
  return pieces_[size_t(id)];
}

std::string Vocab::decode(const int32_t *ids, size_t n, bool render_special) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    check_id(ids[i]);
    int32_t t = types_[size_t(ids[i])];
    if (!render_special && (t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_UNKNOWN)) continue;
    const std::string &p = pieces_[size_t(ids[i])];
    // SentencePiece: the space the encoder put in front of the text goes away again (only on
    // the very first token, as in the reference).
    if (i == 0 && add_space_prefix_ && kind_ == VocabKind::SPM && !p.empty() && p[0] == ' ')
      out.append(p, 1, std::string::npos);
    else
      out += p;
  }
  return out;
}

StreamDetokenizer::StreamDetokenizer(const Vocab &vocab, bool render_special)
    : vocab_(vocab), render_special_(render_special) {}

std::string StreamDetokenizer::push(int32_t id) {
  pending_ += vocab_.token_to_piece(id, render_special_);
  std::string out;
  const auto *s = reinterpret_cast<const unsigned char *>(pending_.data());
  size_t n = pending_.size(), i = 0;
  while (i < n) {
    int len = utf8_valid_len(s + i, n - i);
    if (len < 0) break;  // unfinished character: hold it back
    if (len == 0) {
      out += "\xEF\xBF\xBD";  // a byte that can never be part of a valid character
      ++i;
      continue;
    }
    out.append(pending_, i, size_t(len));
    i += size_t(len);
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDetokenizer::flush() {
  std::string out;
  if (!pending_.empty()) out = "\xEF\xBF\xBD";  // the character never completed
  pending_.clear();
  return out;
}

}  // namespace moe
