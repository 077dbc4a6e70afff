// moeinfer-cli tokenize: one line in, one line of token ids out, in order. A line that parses
// as a JSON object is the contract {"text","add_special","parse_special"}; any other line is
// plain text (add_special true, parse_special false).
//
//   echo '{"text": "Hello", "add_special": true, "parse_special": false}' | moeinfer-cli tokenize -m model.gguf
//   -> {"ids":[9707]}
//   echo 'Hello' | moeinfer-cli tokenize -m model.gguf
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace {

void usage(FILE *out) {
  std::fprintf(out,
               "usage: moeinfer-cli tokenize -m MODEL.gguf [--allow-unknown-pre] [--words]\n\n"
               "Reads lines on stdin and prints one line {\"ids\": [...]} per non-blank input line. A line that is\n"
               "a JSON object is {\"text\": str, \"add_special\": bool, \"parse_special\": bool}; any other line is\n"
               "plain text (special tokens added, special-token text not parsed). Only the GGUF metadata is read.\n\n"
               "  -m, --model PATH        GGUF file whose tokenizer.ggml.* vocabulary is used\n"
               "  --allow-unknown-pre     fall back to the gpt2 pre-tokenizer for an unknown tokenizer.ggml.pre\n"
               "  --words                 print the pre-tokenizer's words {\"words\": [...]} instead of ids\n"
               "                          (no special-token handling; for checking the splitters)\n"
               "  -h, --help              this text\n");
}

// The pre-tokenizer's words of a text (code points decoded as the encoder does).
std::vector<std::string> split_words(const moe::Vocab &v, const std::string &text) {
  std::vector<uint32_t> cps;
  std::vector<size_t> offs;
  for (size_t i = 0; i < text.size();) {
    size_t n;
    offs.push_back(i);
    cps.push_back(moe::utf8_decode(text.data() + i, text.size() - i, &n));
    i += n;
  }
  offs.push_back(text.size());
  std::vector<uint32_t> lens;
  v.pre_tokenizer().split(cps.data(), cps.size(), lens);
  std::vector<std::string> words;
  size_t at = 0;
  for (uint32_t l : lens) {
    words.push_back(text.substr(offs[at], offs[at + l] - offs[at]));
    at += l;
  }
  return words;
}

}  // namespace

int cmd_tokenize(int argc, char **argv) {
  std::string model;
  bool allow_unknown_pre = false;
  bool words_mode = false;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    if (!std::strcmp(a, "-h") || !std::strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!std::strcmp(a, "-m") || !std::strcmp(a, "--model")) {
      model = cli::value(argc, argv, i);
    } else if (!std::strcmp(a, "--allow-unknown-pre")) {
      allow_unknown_pre = true;
    } else if (!std::strcmp(a, "--words")) {
      words_mode = true;
    } else {
      return cli::report(2, std::string("unknown option '") + a + "' (see moeinfer-cli tokenize --help)");
    }
  }
  if (model.empty()) return cli::report(2, "-m MODEL is required (the GGUF file whose vocabulary is used)");

  std::unique_ptr<moe::Vocab> vocab;
  try {
    auto f = moe::GgufFile::open(model);
    vocab = moe::Vocab::from_gguf(*f, allow_unknown_pre);
  } catch (const moe::Error &e) {
    return cli::report(1, std::string(e.what()) + " [" + moe::status_name(e.code()) + "]");
  }
  if (!vocab) {
    return cli::report(1, model + " has no tokenizer (tokenizer.ggml.model missing): pass a model with a vocabulary");
  }

  std::string line, out;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line: nothing to answer
    std::vector<int32_t> ids;
    try {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions*/ false);
      if (!j.is_object()) j = {{"text", line}, {"add_special", true}, {"parse_special", false}};  // plain text
      if (!j.contains("text") || !j["text"].is_string())
        throw std::runtime_error("a JSON line needs a string \"text\"");
      if (words_mode) {
        std::cout << nlohmann::json{{"words", split_words(*vocab, j["text"].get_ref<const std::string &>())}}.dump()
                  << "\n";
        continue;
      }
      bool add_special = j.value("add_special", true);
      bool parse_special = j.value("parse_special", false);
      ids = vocab->encode(j["text"].get_ref<const std::string &>(), add_special, parse_special);
    } catch (const std::exception &e) {
      return cli::report(1, "line " + std::to_string(line_no) + ": " + e.what());
    }
    out = "{\"ids\":[";
    for (size_t k = 0; k < ids.size(); ++k) {
      if (k) out += ',';
      out += std::to_string(ids[k]);
    }
    out += "]}\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  return 0;
}
