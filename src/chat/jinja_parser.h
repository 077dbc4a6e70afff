// Parser of the chat-template language into a syntax tree (chat/jinja_ast.h).
//
//   Body program = parse(tokenize(text));
// Throws moe::Error: InvalidArgument for syntax errors, Unsupported for Jinja features this
// interpreter does not implement (include, extends, block, call, filter blocks, raw, ...),
// both naming the construct, line and column.
#pragma once
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace moe::jinja {

Body parse(const std::vector<Token> &tokens);

}  // namespace moe::jinja
