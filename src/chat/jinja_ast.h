// Syntax tree of a parsed chat template. One generic node type per layer (expressions,
// statements) keeps the parser and evaluator short; `kind` says which fields are used.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace moe::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    Attr,     // kids[0].name
    Index,    // kids[0][kids[1]]
    Slice,    // kids[0][kids[1]:kids[2]:kids[3]] (null kids for omitted parts)
    Call,     // kids[0](kids[1..], kwargs)
    Filter,   // kids[0] | name(kids[1..], kwargs)
    Test,     // kids[0] is [not] name(kids[1..])
    Unary,    // op kids[0]: "not", "-", "+"
    Binary,   // kids[0] op kids[1]: or and == != < > <= >= in "not in" + - ~ * / // % **
    Ternary,  // kids[0] if kids[1] else kids[2] (kids[2] null: undefined)
    List,     // [kids...] (tuples too)
    Dict      // {kwargs-like pairs: keys in kids at even, values at odd}
  };
  Kind kind;
  int line = 0, col = 0;
  Value value;
  std::string name;  // Name, Attr, Filter, Test, Unary/Binary operator
  bool negated = false;
  std::vector<ExprPtr> kids;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,    // text
    Output,  // {{ expr }}
    If,      // branches: (cond, body)...; else_body
    For,     // targets in expr [if filter]: body [else else_body]
    Set,     // targets = expr, or target.attr = expr (attr non-empty)
    Macro    // name(params with defaults): body
  };
  Kind kind;
  int line = 0, col = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<std::string, ExprPtr>> params;
};

}  // namespace moe::jinja
