// Tokenizer of the chat-template language: text runs and the tokens inside {{ }} / {% %}
// tags, with Jinja's whitespace control applied the way Hugging Face renders chat templates
// (trim_blocks and lstrip_blocks on, one trailing newline dropped, `-` strips, `+` keeps).
//
//   std::vector<Token> toks = tokenize(template_text);
#pragma once
#include <string>
#include <vector>

namespace moe::jinja {

enum class Tok { Text, ExprOpen, ExprClose, StmtOpen, StmtClose, Name, String, Int, Float, Op, End };

struct Token {
  Tok kind;
  std::string text;  // Text: the literal; Name/Op: the spelling; String: the decoded value; numbers: digits
  int line = 1;
  int col = 1;
};

// Throws moe::Error(InvalidArgument) for malformed templates (unterminated tag or string),
// naming line and column.
std::vector<Token> tokenize(const std::string &src);

}  // namespace moe::jinja
