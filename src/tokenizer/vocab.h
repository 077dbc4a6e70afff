// Tokenizer vocabulary loaded from GGUF metadata (tokenizer.ggml.*): byte-level BPE ("gpt2") and
// SentencePiece-style BPE with byte fallback ("llama"); encode, decode and streaming decode.
//
//   auto f = GgufFile::open("model.gguf");
//   std::unique_ptr<Vocab> v = Vocab::from_gguf(*f);            // nullptr: file has no tokenizer
//   std::vector<int32_t> ids = v->encode("Hello", /*add_special=*/true, /*parse_special=*/false);
//   std::string text = v->decode(ids.data(), ids.size(), /*render_special=*/false);
//   StreamDetokenizer sd(*v, false);  for (int32_t id : generated) emit(sd.push(id));  emit(sd.flush());
//
// Behaviour follows the reference implementation (llama.cpp) token for token; inconsistent
// vocabularies throw Error(Status::InvalidVocab) naming the offending token, merge or key.
// A loaded Vocab is immutable: every method may be called from several threads at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/flat_map.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/stream_detokenizer.h"

namespace moe {

class GgufFile;
class PairQueue;

// tokenizer.ggml.token_type values.
enum TokenType : int32_t {
  TOKEN_TYPE_UNDEFINED = 0,
  TOKEN_TYPE_NORMAL = 1,
  TOKEN_TYPE_UNKNOWN = 2,
  TOKEN_TYPE_CONTROL = 3,
  TOKEN_TYPE_USER_DEFINED = 4,
  TOKEN_TYPE_UNUSED = 5,
  TOKEN_TYPE_BYTE = 6,
};

enum class VocabKind { BPE, SPM };

class Vocab {
public:
  // nullptr when the file has no tokenizer.ggml.model. allow_unknown_pre: an unrecognised
  // tokenizer.ggml.pre falls back to the gpt2 pattern instead of failing.
  static std::unique_ptr<Vocab> from_gguf(const GgufFile &f, bool allow_unknown_pre = false);
  ~Vocab();
  Vocab(const Vocab &) = delete;
  Vocab &operator=(const Vocab &) = delete;

  // add_special: BOS/EOS per add_bos()/add_eos(). parse_special: control tokens written in the
  // text become their ids (user-defined tokens always do, as in the reference).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // Bytes of one token. render_special=false hides control/unknown tokens (empty string).
  // Throws InvalidArgument for an id outside [0, n_tokens()).
  std::string token_to_piece(int32_t id, bool render_special) const;
  // Concatenated pieces; for SentencePiece vocabularies the space the encoder put in front of
  // the text is dropped from the first token, so decode(encode(s)) == s.
  std::string decode(const int32_t *ids, size_t n, bool render_special) const;

  int32_t n_tokens() const { return int32_t(texts_.size()); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t eom() const { return eom_; }
  int32_t pad() const { return pad_; }
  int32_t unk() const { return unk_; }
  bool is_eog(int32_t id) const { return eog_.count(id) != 0; }
  const std::vector<int32_t> &eog_ids() const { return eog_list_; }
  // Effective type after the reference's load-time re-flagging (see vocab.cpp).
  int32_t token_type(int32_t id) const;
  const std::string &token_text(int32_t id) const;
  int32_t text_to_token(std::string_view text) const;  // -1 if absent
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  VocabKind kind() const { return kind_; }
  const PreTokenizer &pre_tokenizer() const { return pre_; }
  size_t n_merges() const { return n_merges_; }
  // BPE words and SentencePiece texts longer than kLongInput bytes are merged in windows of
  // kLongInput + kLookahead bytes (time and memory linear in the length; see encode.cpp and
  // docs/tokenizer.md); shorter input takes the reference's merge over the whole word (from
  // kQueueInput bytes on through a PairQueue instead of a heap: same order, less time).
  static constexpr size_t kLongInput = size_t(1) << 16;
  static constexpr size_t kLookahead = size_t(1) << 12;
  static constexpr size_t kQueueInput = size_t(1) << 13;

private:
  Vocab() = default;
  void check_id(int32_t id) const;
  void load_bpe_merges(const GgufFile &f);
  void finish_specials();
  void encode_text_bpe(std::string_view text, std::vector<int32_t> &out) const;
  void encode_text_spm(std::string_view text, std::vector<int32_t> &out) const;
  void bpe_word(std::string_view bytes, std::vector<int32_t> &out) const;
  void bpe_word_windows(std::string_view bytes, std::vector<int32_t> &out) const;
  size_t bpe_merge_window(std::string_view bytes, size_t cut, PairQueue &q, std::vector<int32_t> &out) const;
  int32_t spm_byte_token(uint8_t b) const;
  void spm_emit(const std::string &text, size_t off, size_t n, std::vector<int32_t> &out) const;
  void spm_windows(const std::string &text, std::vector<int32_t> &out) const;
  size_t spm_merge_window(const std::string &text, size_t begin, size_t end, size_t cut, PairQueue &q,
                          std::vector<int32_t> &out) const;

  VocabKind kind_ = VocabKind::BPE;
  PreTokenizer pre_;
  std::vector<std::string> texts_;
  std::vector<int32_t> types_;
  std::vector<float> scores_;
  // SentencePiece: each token's score as a dense rank, highest score 0 (equal scores, equal
  // rank): the PairQueue key of a pair that would make this token.
  std::vector<uint32_t> score_rank_;
  size_t n_score_ranks_ = 0;
  // SentencePiece: no token has U+2581 right after another character, so a cut just before
  // such a U+2581 in the text is never crossed by a merge (see spm_windows).
  bool spm_space_cut_ = false;
  TextIndex to_id_;  // over texts_
  std::vector<std::string> pieces_;                       // decoded bytes of each token
  // BPE: merges keyed by the pair of token ids; value = rank << 32 | merged id.
  PairTable merges_;
  size_t n_merges_ = 0;
  int32_t byte_token_[256];  // byte-level BPE: token of each single byte (-1 if absent)
  // Tokens cut out of the text before BPE, in the reference's priority order (longest text
  // first): all control/user-defined/unknown tokens (parse_special) or only user-defined ones.
  struct SpecialSet {
    std::vector<std::string> texts;  // by priority
    std::vector<int32_t> ids;
    TextIndex index;                 // text -> priority
    bool first_byte[256] = {};
    std::vector<size_t> lengths;     // distinct text lengths, ascending
    void build();
  };
  SpecialSet specials_all_, specials_user_;
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, pad_ = -1, unk_ = -1;
  std::unordered_set<int32_t> eog_;
  std::vector<int32_t> eog_list_;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
};

}  // namespace moe
