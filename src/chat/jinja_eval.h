// Evaluator of parsed chat templates: renders a program against a context of variables.
//
//   Body program = parse(tokenize(text));
//   Value ctx = Value::object();
//   ctx.set("messages", ...);
//   std::string prompt = render(program, ctx, RenderOptions{});
//
// Errors are moe::Error naming the construct, line and column: Unsupported for a filter,
// test, method or statement this interpreter lacks; InvalidArgument for a template error
// (type mismatch, reading an attribute of an undefined value) or raise_exception().
#pragma once
#include <cstdint>
#include <string>

#include "chat/jinja_ast.h"

namespace moe::jinja {

struct RenderOptions {
  int64_t now_unix = 0;   // the time strftime_now() formats (UTC); 0: the current time
  int max_depth = 256;    // macro recursion limit
};

std::string render(const Body &program, const Value &context, const RenderOptions &opts);

// Filters, tests and methods (chat/jinja_builtins.cpp). Each returns false when it does not
// know `name`, so the caller can report an unsupported feature at the right location.
bool apply_filter(const std::string &name, const Value &input, CallArgs &args, Value &out);
bool apply_test(const std::string &name, const Value &input, CallArgs &args, bool &out);
bool call_method(const Value &self, const std::string &name, CallArgs &args, Value &out);

}  // namespace moe::jinja
