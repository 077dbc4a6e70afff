// Vocabulary loading and special-token bookkeeping. Encoding lives in encode_bpe.cpp /
// encode_spm.cpp, decoding in decode.cpp.
#include "tokenizer/vocab.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace moe {

namespace {

const GgufValue *find_array(const GgufFile &f, const char *key, bool strings) {
  const GgufValue *v = f.find(key);
  if (!v) return nullptr;
  if (!v->is_array()) fail(Status::InvalidVocab, "%s is not an array", key);
  if (strings != (v->elem_type == GgufType::STRING))
    fail(Status::InvalidVocab, "%s has elements of type %s", key, gguf_type_name(v->elem_type));
  return v;
}

bool get_flag(const GgufFile &f, const char *key, bool def) {
  const GgufValue *v = f.find(key);
  if (!v) return def;
  if (v->type == GgufType::BOOL || v->is_integer()) return v->u != 0;
  fail(Status::InvalidVocab, "%s must be a bool, not %s", key, gguf_type_name(v->type));
}

// Token texts the reference recognises when the file does not name these ids.
const char *const kEotNames[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                 "<|end_of_text|>", "<EOT>", "_<EOT>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                 "<end_of_utterance>"};
const char *const kEogNames[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
                                 "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
                                 "<end_of_utterance>"};
const char *const kFimPadNames[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"};
const char *const kFimRepNames[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
const char *const kFimSepNames[] = {"<|file_sep|>"};
const char *const kFimPreNames[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
                                    "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>"};
const char *const kFimSufNames[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>",
                                    "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>"};
const char *const kFimMidNames[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
                                    "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>"};

}  // namespace

Vocab::~Vocab() = default;

void Vocab::check_id(int32_t id) const {
  if (id < 0 || id >= n_tokens())
    fail(Status::InvalidArgument, "token id %d out of range [0, %d)", id, n_tokens());
}

int32_t Vocab::token_type(int32_t id) const {
  check_id(id);
  return types_[size_t(id)];
}

const std::string &Vocab::token_text(int32_t id) const {
  check_id(id);
  return texts_[size_t(id)];
}

int32_t Vocab::text_to_token(std::string_view text) const { return to_id_.find(text); }

std::unique_ptr<Vocab> Vocab::from_gguf(const GgufFile &f, bool allow_unknown_pre) {
  const GgufValue *model = f.find("tokenizer.ggml.model");
  if (!model) return nullptr;
  if (model->type != GgufType::STRING)
    fail(Status::InvalidVocab, "tokenizer.ggml.model must be a string, not %s", gguf_type_name(model->type));

  std::unique_ptr<Vocab> v(new Vocab());
  if (model->str == "gpt2") {
    v->kind_ = VocabKind::BPE;
  } else if (model->str == "llama") {
    v->kind_ = VocabKind::SPM;
  } else {
    fail(Status::InvalidVocab, "unsupported tokenizer.ggml.model '%s' (supported: gpt2, llama)", model->str.c_str());
  }

  const GgufValue *tokens = find_array(f, "tokenizer.ggml.tokens", true);
  if (!tokens) fail(Status::InvalidVocab, "tokenizer.ggml.tokens is missing");
  const size_t n = tokens->strs.size();
  if (n == 0) fail(Status::InvalidVocab, "tokenizer.ggml.tokens is empty");
  if (n >= size_t(INT32_MAX)) fail(Status::InvalidVocab, "tokenizer.ggml.tokens has %zu entries", n);

  // What the tables below will hold, estimated before anything is built: like the GGUF
  // reader's metadata, a vocabulary may take at most kMemPerFileByte x its file (+ slack). A
  // hostile file (millions of empty or one-byte tokens: 8-9 bytes each on disk, ~110 bytes
  // each as strings, pieces and index slots) is refused here at once.
  {
    const GgufValue *mg = v->kind_ == VocabKind::BPE ? f.find("tokenizer.ggml.merges") : nullptr;
    const uint64_t n_merges = mg && mg->is_array() ? mg->count : 0;
    uint64_t est = uint64_t(n) * (2 * sizeof(std::string) + 3 * sizeof(uint32_t) + 4 * 8) + n_merges * 48;
    for (const std::string &t : tokens->strs)
      if (t.size() >= 16) est += 2 * (t.size() + 1);  // texts and pieces beyond the inline buffer
    const uint64_t limit = uint64_t(f.file_size()) * kMemPerFileByte + kMemSlack;
    if (est > limit)
      fail(Status::InvalidVocab,
           "vocabulary of %zu tokens and %llu merges would take about %llu MiB, more than %zu times its file of %.1f MiB + %zu MiB",
           n, (unsigned long long)n_merges, (unsigned long long)(est >> 20), kMemPerFileByte, double(f.file_size()) / 1048576.0,
           kMemSlack >> 20);
  }

  v->texts_ = tokens->strs;
  for (size_t i = 0; i < n; ++i) {
    // Same placeholder as the reference, so that an empty entry cannot match everywhere.
    if (v->texts_[i].empty()) v->texts_[i] = "[EMPTY_" + std::to_string(i) + "]";
  }
  int32_t dup_of = -1;
  int32_t dup = v->to_id_.build(v->texts_, &dup_of);
  if (dup >= 0)
    fail(Status::InvalidVocab, "duplicate token '%s' at ids %d and %d", v->texts_[size_t(dup)].c_str(), dup_of, dup);

  v->types_.assign(n, TOKEN_TYPE_NORMAL);
  if (const GgufValue *tt = find_array(f, "tokenizer.ggml.token_type", false)) {
    if (tt->count != n)
      fail(Status::InvalidVocab, "tokenizer.ggml.token_type has %llu entries for %zu tokens",
           (unsigned long long)tt->count, n);
    if (!(tt->elem_type == GgufType::I32 || tt->elem_type == GgufType::U32 || tt->elem_type == GgufType::I8 ||
          tt->elem_type == GgufType::U8 || tt->elem_type == GgufType::I16 || tt->elem_type == GgufType::U16 ||
          tt->elem_type == GgufType::I64 || tt->elem_type == GgufType::U64))
      fail(Status::InvalidVocab, "tokenizer.ggml.token_type must hold integers, not %s", gguf_type_name(tt->elem_type));
    for (size_t i = 0; i < n; ++i) {
      int64_t t = tt->elem_i64(i);
      if (t < TOKEN_TYPE_UNDEFINED || t > TOKEN_TYPE_BYTE)
        fail(Status::InvalidVocab, "token %zu '%s' has unknown token type %lld", i, v->texts_[i].c_str(), (long long)t);
      v->types_[i] = int32_t(t);
    }
  }
  if (const GgufValue *sc = find_array(f, "tokenizer.ggml.scores", false)) {
    if (sc->count != n)
      fail(Status::InvalidVocab, "tokenizer.ggml.scores has %llu entries for %zu tokens", (unsigned long long)sc->count, n);
    if (!(sc->elem_type == GgufType::F32 || sc->elem_type == GgufType::F64))
      fail(Status::InvalidVocab, "tokenizer.ggml.scores must hold floats, not %s", gguf_type_name(sc->elem_type));
    v->scores_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      v->scores_[i] = float(sc->elem_f64(i));
      // SentencePiece merges by score: a NaN has no place in that order.
      if (v->kind_ == VocabKind::SPM && std::isnan(v->scores_[i]))
        fail(Status::InvalidVocab, "token %zu '%s' has score NaN", i, v->texts_[i].c_str());
    }
  } else {
    v->scores_.assign(n, 0.0f);
  }

  // Defaults before the file's keys, as in the reference.
  auto in_range = [&](int32_t id) { return id >= 0 && size_t(id) < n ? id : -1; };
  if (v->kind_ == VocabKind::BPE) {
    std::string pre_name = "(missing)";
    if (const GgufValue *pre = f.find("tokenizer.ggml.pre")) {
      if (pre->type != GgufType::STRING)
        fail(Status::InvalidVocab, "tokenizer.ggml.pre must be a string, not %s", gguf_type_name(pre->type));
      pre_name = pre->str;
    }
    if (!PreTokenizer::from_name(pre_name, &v->pre_)) {
      if (!allow_unknown_pre)
        fail(Status::InvalidVocab, "unknown pre-tokenizer tokenizer.ggml.pre = '%s' (allow_unknown_pre falls back to gpt2)",
             pre_name.c_str());
      v->pre_ = PreTokenizer(PreType::Gpt2, false);
    }
    v->bos_ = in_range(11);
    v->eos_ = in_range(11);
    if (pre_name == "glm4" || pre_name == "chatglm-bpe") v->bos_ = -1;
    v->add_bos_ = v->pre_.ignore_merges();  // llama3 family adds BOS unless the file says otherwise
    v->add_space_prefix_ = false;
  } else {
    v->bos_ = in_range(1);
    v->eos_ = in_range(2);
    v->unk_ = in_range(0);
    v->add_bos_ = true;
    v->add_space_prefix_ = true;
  }
  v->add_space_prefix_ = get_flag(f, "tokenizer.ggml.add_space_prefix", v->add_space_prefix_);
  v->add_bos_ = get_flag(f, "tokenizer.ggml.add_bos_token", v->add_bos_);
  v->add_eos_ = get_flag(f, "tokenizer.ggml.add_eos_token", v->add_eos_);

  int32_t sep = -1, mask = -1, fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  const struct { const char *key; int32_t *dst; } keys[] = {
      {"tokenizer.ggml.bos_token_id", &v->bos_},     {"tokenizer.ggml.eos_token_id", &v->eos_},
      {"tokenizer.ggml.eot_token_id", &v->eot_},     {"tokenizer.ggml.eom_token_id", &v->eom_},
      {"tokenizer.ggml.unknown_token_id", &v->unk_}, {"tokenizer.ggml.seperator_token_id", &sep},
      {"tokenizer.ggml.padding_token_id", &v->pad_}, {"tokenizer.ggml.mask_token_id", &mask},
      {"tokenizer.ggml.fim_pre_token_id", &fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &fim_sep},
      {"tokenizer.ggml.prefix_token_id", &fim_pre},  {"tokenizer.ggml.suffix_token_id", &fim_suf},
      {"tokenizer.ggml.middle_token_id", &fim_mid},
  };
  for (const auto &k : keys) {
    const GgufValue *val = f.find(k.key);
    if (!val) continue;
    if (!val->is_integer()) fail(Status::InvalidVocab, "%s must be an integer, not %s", k.key, gguf_type_name(val->type));
    bool neg = (val->type == GgufType::I8 || val->type == GgufType::I16 || val->type == GgufType::I32 ||
                val->type == GgufType::I64) && val->i < 0;
    if (neg || val->u >= n)
      fail(Status::InvalidVocab, "%s = %lld is not a token id (vocabulary has %zu tokens)", k.key,
           neg ? (long long)val->i : (long long)val->u, n);
    *k.dst = int32_t(val->u);
  }

  // Ids the file does not give are found by token text and forced to CONTROL, like the
  // reference does (first name in list order wins).
  Vocab &vv = *v;
  auto by_name = [&vv](int32_t *dst, const auto &names) {
    if (*dst >= 0) return;
    for (const char *name : names) {
      int32_t id = vv.text_to_token(name);
      if (id >= 0) {
        *dst = id;
        vv.types_[size_t(id)] = TOKEN_TYPE_CONTROL;
        return;
      }
    }
  };
  static const char *const kEomNames[] = {"<|eom_id|>"};
  by_name(&v->eot_, kEotNames);
  by_name(&v->eom_, kEomNames);
  by_name(&fim_pre, kFimPreNames);
  by_name(&fim_suf, kFimSufNames);
  by_name(&fim_mid, kFimMidNames);
  by_name(&fim_pad, kFimPadNames);
  by_name(&fim_rep, kFimRepNames);
  by_name(&fim_sep, kFimSepNames);

  // End-of-generation set.
  for (int32_t id : {fim_pad, fim_rep, fim_sep})
    if (id >= 0) v->eog_.insert(id);
  for (const char *name : kEogNames) {
    int32_t id = v->text_to_token(name);
    if (id >= 0) {
      v->eog_.insert(id);
      v->types_[size_t(id)] = TOKEN_TYPE_CONTROL;
    }
  }
  // gpt-oss (harmony): the reference always renders these, i.e. treats them as user-defined.
  for (const char *name : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    int32_t id = v->text_to_token(name);
    if (id >= 0) v->types_[size_t(id)] = TOKEN_TYPE_USER_DEFINED;
  }
  for (int32_t id : {v->eos_, v->eot_, v->eom_})
    if (id >= 0) v->eog_.insert(id);
  {
    // harmony: <|end|> closes a message, not the generation, when <|return|> and <|call|> exist.
    int32_t ret = v->text_to_token("<|return|>"), call = v->text_to_token("<|call|>"), end = v->text_to_token("<|end|>");
    if (ret >= 0 && call >= 0 && end >= 0 && v->eog_.count(ret) && v->eog_.count(call) && v->eog_.count(end)) {
      v->eog_.erase(end);
      v->types_[size_t(end)] = TOKEN_TYPE_USER_DEFINED;
    }
  }
  v->eog_list_.assign(v->eog_.begin(), v->eog_.end());
  std::sort(v->eog_list_.begin(), v->eog_list_.end());

  if (v->kind_ == VocabKind::BPE) v->load_bpe_merges(f);
  if (v->kind_ == VocabKind::SPM) {
    std::vector<float> distinct = v->scores_;
    std::sort(distinct.begin(), distinct.end(), std::greater<float>());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());  // -0 == +0: one rank
    v->n_score_ranks_ = distinct.size();
    v->score_rank_.resize(n);
    for (size_t i = 0; i < n; ++i)
      v->score_rank_[i] = uint32_t(std::lower_bound(distinct.begin(), distinct.end(), v->scores_[i], std::greater<float>()) - distinct.begin());
    // A token holding U+2581 after a character other than U+2581 could be made across such a
    // cut. (Pieces decode U+2581 only: other types never take part in merges but count here
    // too, which only costs the exact cut.)
    v->spm_space_cut_ = true;
    static const char kSpace[] = "\xe2\x96\x81";
    for (size_t i = 0; i < n && v->spm_space_cut_; ++i) {
      const std::string &t = v->texts_[i];
      for (size_t p = t.find(kSpace, 1); p != std::string::npos; p = t.find(kSpace, p + 1))
        if (p < 3 || t.compare(p - 3, 3, kSpace) != 0) {
          v->spm_space_cut_ = false;
          break;
        }
    }
  }
  v->finish_specials();
  return v;
}

void Vocab::load_bpe_merges(const GgufFile &f) {
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, byte_to_cp(uint8_t(b)));
    byte_token_[b] = text_to_token(s);
  }
  const GgufValue *m = find_array(f, "tokenizer.ggml.merges", true);
  if (!m) fail(Status::InvalidVocab, "tokenizer.ggml.merges is missing (required by the gpt2 tokenizer model)");
  n_merges_ = m->strs.size();
  merges_.reserve(n_merges_);
  // Batches of merges: hash all three texts and prefetch their slots before looking them up,
  // so the cache misses of a batch overlap (loading is dominated by these lookups).
  constexpr size_t kBatch = 16;
  struct Job { std::string_view a, b; uint64_t ha, hb, hm; std::string joined; };
  std::vector<Job> jobs(kBatch);
  for (size_t r0 = 0; r0 < n_merges_; r0 += kBatch) {
    size_t nb = std::min(kBatch, n_merges_ - r0);
    for (size_t k = 0; k < nb; ++k) {
      const std::string &s = m->strs[r0 + k];
      size_t sp = s.size() > 1 ? s.find(' ', 1) : std::string::npos;
      if (sp == std::string::npos)
        fail(Status::InvalidVocab, "merge %zu '%s' is not two tokens separated by a space", r0 + k, s.c_str());
      Job &j = jobs[k];
      j.a = std::string_view(s.data(), sp);
      j.b = std::string_view(s.data() + sp + 1, s.size() - sp - 1);
      j.joined.assign(j.a);
      j.joined.append(j.b);
      j.ha = hash_bytes(j.a.data(), j.a.size());
      j.hb = hash_bytes(j.b.data(), j.b.size());
      j.hm = hash_bytes(j.joined.data(), j.joined.size());
      to_id_.prefetch(j.ha);
      to_id_.prefetch(j.hb);
      to_id_.prefetch(j.hm);
    }
    for (size_t k = 0; k < nb; ++k) {
      const Job &j = jobs[k];
      size_t r = r0 + k;
      const char *s = m->strs[r].c_str();
      int32_t ia = to_id_.find(j.a, j.ha), ib = to_id_.find(j.b, j.hb), im = to_id_.find(j.joined, j.hm);
      if (ia < 0) fail(Status::InvalidVocab, "merge %zu '%s' names missing token '%.*s'", r, s, int(j.a.size()), j.a.data());
      if (ib < 0) fail(Status::InvalidVocab, "merge %zu '%s' names missing token '%.*s'", r, s, int(j.b.size()), j.b.data());
      if (im < 0) fail(Status::InvalidVocab, "merge %zu '%s' produces '%s', which is not a token", r, s, j.joined.c_str());
      uint64_t key = (uint64_t(uint32_t(ia)) << 32) | uint32_t(ib);
      merges_.insert(key, (uint64_t(r) << 32) | uint32_t(im));  // first rank wins, as in the reference
    }
  }
}

void Vocab::finish_specials() {
  const size_t n = texts_.size();
  // Pieces: what each token decodes to when special tokens are rendered.
  int bl_inverse[0x100 + 68];
  for (uint32_t cp = 0; cp < 0x100 + 68; ++cp) bl_inverse[cp] = cp_to_byte(cp);
  pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string &t = texts_[i];
    std::string &p = pieces_[i];
    int32_t type = types_[i];
    if (type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN || type == TOKEN_TYPE_USER_DEFINED) {
      p = t;
    } else if (type == TOKEN_TYPE_NORMAL) {
      if (kind_ == VocabKind::BPE) {
        p.reserve(t.size());
        for (size_t k = 0; k < t.size();) {
          size_t len;
          uint32_t cp = utf8_decode(t.data() + k, t.size() - k, &len);
          int b = cp < 0x100 + 68 ? bl_inverse[cp] : -1;
          if (b >= 0) p.push_back(char(b));
          else p.append(t, k, len);  // not in the byte alphabet: keep the text
          k += len;
        }
      } else {
        // SentencePiece: U+2581 stands for a space
        for (size_t k = 0; k < t.size();) {
          if (t.compare(k, 3, "\xe2\x96\x81") == 0) { p.push_back(' '); k += 3; }
          else p.push_back(t[k++]);
        }
      }
    } else if (type == TOKEN_TYPE_BYTE && kind_ == VocabKind::SPM) {
      auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) >= 0 && hex(t[4]) >= 0)
        p.push_back(char(hex(t[3]) * 16 + hex(t[4])));
      else
        fail(Status::InvalidVocab, "byte token %zu '%s' is not of the form <0xXX>", i, t.c_str());
    }  // unused / undefined tokens decode to nothing
  }

  std::vector<int32_t> order;
  for (size_t i = 0; i < n; ++i) {
    int32_t type = types_[i];
    if (type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_USER_DEFINED || type == TOKEN_TYPE_UNKNOWN)
      order.push_back(int32_t(i));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return texts_[size_t(a)].size() > texts_[size_t(b)].size(); });
  for (int32_t id : order) {
    specials_all_.ids.push_back(id);
    specials_all_.texts.push_back(texts_[size_t(id)]);
    if (types_[size_t(id)] == TOKEN_TYPE_USER_DEFINED) {  // matched even when parse_special is off
      specials_user_.ids.push_back(id);
      specials_user_.texts.push_back(texts_[size_t(id)]);
    }
  }
  specials_all_.build();
  specials_user_.build();
}

void Vocab::SpecialSet::build() {
  int32_t dup_of;
  index.build(texts, &dup_of);  // texts are distinct token texts
  for (const std::string &t : texts) {
    first_byte[uint8_t(t[0])] = true;
    lengths.push_back(t.size());
  }
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
}

}  // namespace moe
