// Byte-level BPE ("gpt2") vocabularies for synthetic models: generated, or read from a
// Hugging Face tokenizer.json and padded to the preset's vocab size.
//
//   SynthVocab v = make_synthetic_vocab(synth_preset("tiny"));     // 512 tokens
//   SynthVocab h = load_hf_vocab("tokenizer.json", synth_preset("medium"));
//   // v.tokens[i], v.types[i] (1 normal, 3 control, 4 user-defined, 5 unused), v.merges
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/synth/synth_preset.h"

namespace moe {

enum SynthTokenType : int32_t { kTokNormal = 1, kTokControl = 3, kTokUserDefined = 4, kTokUnused = 5 };

struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // "left right", in rank order
  uint32_t bos = 0, eos = 0, pad = 0;
};

// GPT-2 bytes_to_unicode: the token text of raw byte b (UTF-8).
std::string byte_token(uint8_t b);

// Ids of the preset's control tokens are kept; the other ids up to n_vocab_real are the 256
// byte tokens (GPT-2 order) then generated merges; the rest are "[PADn]" unused fillers.
SynthVocab make_synthetic_vocab(const SynthPreset &p);

// tokenizer.json: model.vocab, model.merges ("a b" strings or [a, b] pairs), added_tokens
// (special or <|..|>-shaped -> CONTROL, else USER_DEFINED). Ids missing up to
// max(p.n_vocab, largest id + 1) become "[PADn]" unused. bos/eos/pad: the preset's control
// texts looked up by text, else the preset's ids. Throws InvalidArgument / IoError.
SynthVocab load_hf_vocab(const std::string &path, const SynthPreset &p);

}  // namespace moe
