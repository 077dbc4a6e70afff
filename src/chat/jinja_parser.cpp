#include "chat/jinja_parser.h"

#include <cstdlib>

#include "core/status.h"

namespace moe::jinja {
namespace {

class Parser {
public:
  explicit Parser(const std::vector<Token> &t) : t_(t) {}

  Body program() {
    Body body = block({});
    if (cur().kind != Tok::End) fail_here("unexpected tag");
    return body;
  }

private:
  const std::vector<Token> &t_;
  size_t p_ = 0;
  std::string stop_;  // the statement keyword that ended the last block()
  int depth_ = 0;     // nesting of statements and expressions being parsed

  // Bounds the parser's (and so the evaluator's) recursion: a template is untrusted data.
  class Nest {
  public:
    explicit Nest(Parser &p) : p_(p) {
      if (++p_.depth_ > 200) p_.fail_here("template nested more than 200 levels deep");
    }
    ~Nest() { --p_.depth_; }
    Nest(const Nest &) = delete;
    Nest &operator=(const Nest &) = delete;
  private:
    Parser &p_;
  };

  const Token &cur() const { return t_[p_]; }
  const Token &peek(size_t n = 1) const { return t_[std::min(p_ + n, t_.size() - 1)]; }
  [[noreturn]] void fail(Status s, const Token &at, const std::string &why) const {
    throw Error(s, strfmt("chat template: %s at line %d, column %d", why.c_str(), at.line, at.col));
  }
  [[noreturn]] void fail_here(const std::string &why) const {
    fail(Status::InvalidArgument, cur(), why + (cur().text.empty() ? "" : " '" + cur().text + "'"));
  }
  bool is_op(const char *op) const { return cur().kind == Tok::Op && cur().text == op; }
  bool is_name(const char *n) const { return cur().kind == Tok::Name && cur().text == n; }
  void expect_op(const char *op) {
    if (!is_op(op)) fail_here(std::string("expected '") + op + "'");
    ++p_;
  }
  std::string expect_name() {
    if (cur().kind != Tok::Name) fail_here("expected a name");
    return t_[p_++].text;
  }
  void expect_stmt_close() {
    if (cur().kind != Tok::StmtClose) fail_here("expected '%}'");
    ++p_;
  }

  // Statements until one of `stops` opens a tag ({% elif %}, {% endfor %}, ...). The stop
  // keyword is left in stop_ with the parser positioned after it.
  Body block(const std::vector<const char *> &stops) {
    Body body;
    for (;;) {
      const Token &tk = cur();
      if (tk.kind == Tok::End) {
        if (!stops.empty()) fail(Status::InvalidArgument, tk, std::string("missing {% ") + stops.back() + " %}");
        return body;
      }
      if (tk.kind == Tok::Text) {
        auto s = node(Stmt::Kind::Text, tk);
        s->text = tk.text;
        body.push_back(std::move(s));
        ++p_;
      } else if (tk.kind == Tok::ExprOpen) {
        ++p_;
        auto s = node(Stmt::Kind::Output, tk);
        s->expr = expression();
        if (cur().kind != Tok::ExprClose) fail_here("expected '}}'");
        ++p_;
        body.push_back(std::move(s));
      } else if (tk.kind == Tok::StmtOpen) {
        ++p_;
        const Token &kw = cur();
        if (kw.kind != Tok::Name) fail_here("expected a statement name");
        for (const char *stop : stops)
          if (kw.text == stop) {
            stop_ = kw.text;
            ++p_;
            return body;
          }
        body.push_back(statement());
      } else {
        fail_here("unexpected token");
      }
    }
  }

  StmtPtr node(Stmt::Kind k, const Token &at) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = at.line;
    s->col = at.col;
    return s;
  }

  StmtPtr statement() {
    Nest nest(*this);
    const Token &kw = cur();
    const std::string name = kw.text;
    ++p_;
    if (name == "if") return if_stmt(kw);
    if (name == "for") return for_stmt(kw);
    if (name == "set") return set_stmt(kw);
    if (name == "macro") return macro_stmt(kw);
    static const char *const known[] = {"include", "import", "from", "extends", "block", "call", "filter",
                                        "raw", "with", "autoescape", "break", "continue", "do", "trans"};
    for (const char *k : known)
      if (name == k) fail(Status::Unsupported, kw, "unsupported template statement '{% " + name + " %}'");
    fail(Status::InvalidArgument, kw, "unknown template statement '" + name + "'");
  }

  StmtPtr if_stmt(const Token &kw) {
    auto s = node(Stmt::Kind::If, kw);
    for (;;) {
      ExprPtr cond = expression();
      expect_stmt_close();
      Body body = block({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (stop_ == "elif") continue;
      if (stop_ == "else") {
        expect_stmt_close();
        s->else_body = block({"endif"});
      }
      expect_stmt_close();
      return s;
    }
  }

  StmtPtr for_stmt(const Token &kw) {
    auto s = node(Stmt::Kind::For, kw);
    s->targets.push_back(expect_name());
    while (is_op(",")) {
      ++p_;
      s->targets.push_back(expect_name());
    }
    if (!is_name("in")) fail_here("expected 'in'");
    ++p_;
    s->expr = or_expr();  // no ternary: `if` here filters the loop
    if (is_name("if")) {
      ++p_;
      s->filter = or_expr();
    }
    if (is_name("recursive")) fail(Status::Unsupported, cur(), "unsupported recursive for loop");
    expect_stmt_close();
    s->body = block({"else", "endfor"});
    if (stop_ == "else") {
      expect_stmt_close();
      s->else_body = block({"endfor"});
    }
    expect_stmt_close();
    return s;
  }

  StmtPtr set_stmt(const Token &kw) {
    auto s = node(Stmt::Kind::Set, kw);
    s->targets.push_back(expect_name());
    if (is_op(".")) {
      ++p_;
      s->attr = expect_name();
    } else {
      while (is_op(",")) {
        ++p_;
        s->targets.push_back(expect_name());
      }
    }
    if (cur().kind == Tok::StmtClose) fail(Status::Unsupported, kw, "unsupported block assignment '{% set x %}...{% endset %}'");
    expect_op("=");
    s->expr = expression();
    expect_stmt_close();
    return s;
  }

  StmtPtr macro_stmt(const Token &kw) {
    auto s = node(Stmt::Kind::Macro, kw);
    s->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      std::string pname = expect_name();
      ExprPtr def;
      if (is_op("=")) {
        ++p_;
        def = expression();
      }
      s->params.emplace_back(std::move(pname), std::move(def));
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
    expect_stmt_close();
    s->body = block({"endmacro"});
    expect_stmt_close();
    return s;
  }

  // ---------------------------------------------------------------- expressions
  ExprPtr make(Expr::Kind k, const Token &at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->col = at.col;
    return e;
  }
  ExprPtr binary(const Token &at, std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::Binary, at);
    e->name = std::move(op);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprPtr expression() {
    Nest nest(*this);
    ExprPtr e = or_expr();
    if (is_name("if")) {
      const Token &at = cur();
      ++p_;
      auto t = make(Expr::Kind::Ternary, at);
      t->kids.push_back(std::move(e));
      t->kids.push_back(or_expr());
      if (is_name("else")) {
        ++p_;
        t->kids.push_back(expression());
      } else {
        t->kids.push_back(nullptr);
      }
      return t;
    }
    return e;
  }
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      const Token &at = cur();
      ++p_;
      e = binary(at, "or", std::move(e), and_expr());
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      const Token &at = cur();
      ++p_;
      e = binary(at, "and", std::move(e), not_expr());
    }
    return e;
  }
  ExprPtr not_expr() {
    Nest nest(*this);
    if (is_name("not")) {
      const Token &at = cur();
      ++p_;
      auto e = make(Expr::Kind::Unary, at);
      e->name = "not";
      e->kids.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = math1();
    for (;;) {
      const Token &at = cur();
      std::string op;
      if (at.kind == Tok::Op && (at.text == "==" || at.text == "!=" || at.text == "<" || at.text == ">" ||
                                 at.text == "<=" || at.text == ">=")) {
        op = at.text;
        ++p_;
      } else if (is_name("in")) {
        op = "in";
        ++p_;
      } else if (is_name("not") && peek().kind == Tok::Name && peek().text == "in") {
        op = "not in";
        p_ += 2;
      } else {
        return e;
      }
      e = binary(at, op, std::move(e), math1());
    }
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const Token &at = cur();
      ++p_;
      e = binary(at, at.text, std::move(e), concat());
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (is_op("~")) {
      const Token &at = cur();
      ++p_;
      e = binary(at, "~", std::move(e), math2());
    }
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token &at = cur();
      ++p_;
      e = binary(at, at.text, std::move(e), power());
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary();
    while (is_op("**")) {
      const Token &at = cur();
      ++p_;
      e = binary(at, "**", std::move(e), unary());
    }
    return e;
  }
  ExprPtr unary() {
    Nest nest(*this);
    if (is_op("-") || is_op("+")) {
      const Token &at = cur();
      ++p_;
      auto e = make(Expr::Kind::Unary, at);
      e->name = at.text;
      e->kids.push_back(unary());
      return e;
    }
    return filters_and_tests(postfix(primary()));
  }

  void call_args(Expr &e) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().kind == Tok::Name && peek().kind == Tok::Op && peek().text == "=") {
        std::string key = t_[p_].text;
        p_ += 2;
        e.kwargs.emplace_back(std::move(key), expression());
      } else {
        if (!e.kwargs.empty()) fail_here("positional argument after keyword argument");
        e.kids.push_back(expression());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }

  ExprPtr filters_and_tests(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        const Token &at = cur();
        auto f = make(Expr::Kind::Filter, at);
        f->name = expect_name();
        f->kids.push_back(std::move(e));
        if (is_op("(")) call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++p_;
        const Token &at = cur();
        auto t = make(Expr::Kind::Test, at);
        if (is_name("not")) {
          t->negated = true;
          ++p_;
        }
        // `none`, `true`, `false` are test names here, not literals.
        t->name = expect_name();
        t->kids.push_back(std::move(e));
        if (is_op("(")) call_args(*t);
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      const Token &at = cur();
      if (is_op(".")) {
        ++p_;
        auto a = make(Expr::Kind::Attr, at);
        if (cur().kind == Tok::Int) {  // x.0 is x[0] in Jinja
          auto lit = make(Expr::Kind::Literal, cur());
          lit->value = Value(static_cast<int64_t>(std::strtoll(cur().text.c_str(), nullptr, 10)));
          ++p_;
          a->kind = Expr::Kind::Index;
          a->kids.push_back(std::move(e));
          a->kids.push_back(std::move(lit));
        } else {
          a->name = expect_name();
          a->kids.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        ++p_;
        e = subscript(at, std::move(e));
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::Call, at);
        c->kids.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(const Token &at, ExprPtr target) {
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    for (;;) {
      if (!is_op(":") && !is_op("]")) parts[n] = expression();
      if (is_op(":")) {
        slice = true;
        ++p_;
        if (++n > 2) fail_here("too many ':' in slice");
        continue;
      }
      break;
    }
    expect_op("]");
    auto e = make(slice ? Expr::Kind::Slice : Expr::Kind::Index, at);
    e->kids.push_back(std::move(target));
    if (slice) {
      for (auto &part : parts) e->kids.push_back(std::move(part));
    } else {
      if (!parts[0]) fail(Status::InvalidArgument, at, "empty subscript");
      e->kids.push_back(std::move(parts[0]));
    }
    return e;
  }

  ExprPtr primary() {
    const Token &at = cur();
    if (at.kind == Tok::String) {
      auto e = make(Expr::Kind::Literal, at);
      std::string s;
      while (cur().kind == Tok::String) s += t_[p_++].text;  // adjacent literals concatenate
      e->value = Value(std::move(s));
      return e;
    }
    if (at.kind == Tok::Int || at.kind == Tok::Float) {
      auto e = make(Expr::Kind::Literal, at);
      std::string digits;
      for (char c : at.text)
        if (c != '_') digits += c;
      e->value = at.kind == Tok::Int ? Value(static_cast<int64_t>(std::strtoll(digits.c_str(), nullptr, 10)))
                                     : Value(std::strtod(digits.c_str(), nullptr));
      ++p_;
      return e;
    }
    if (at.kind == Tok::Name) {
      ++p_;
      auto e = make(Expr::Kind::Literal, at);
      if (at.text == "true" || at.text == "True") e->value = Value(true);
      else if (at.text == "false" || at.text == "False") e->value = Value(false);
      else if (at.text == "none" || at.text == "None") e->value = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = at.text;
      }
      return e;
    }
    if (is_op("(")) {
      ++p_;
      if (is_op(")")) {
        ++p_;
        return make(Expr::Kind::List, at);
      }
      ExprPtr first = expression();
      if (!is_op(",")) {
        expect_op(")");
        return first;
      }
      auto tuple = make(Expr::Kind::List, at);
      tuple->kids.push_back(std::move(first));
      while (is_op(",")) {
        ++p_;
        if (is_op(")")) break;
        tuple->kids.push_back(expression());
      }
      expect_op(")");
      return tuple;
    }
    if (is_op("[")) {
      ++p_;
      auto list = make(Expr::Kind::List, at);
      while (!is_op("]")) {
        list->kids.push_back(expression());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("]");
      return list;
    }
    if (is_op("{")) {
      ++p_;
      auto dict = make(Expr::Kind::Dict, at);
      while (!is_op("}")) {
        dict->kids.push_back(expression());
        expect_op(":");
        dict->kids.push_back(expression());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("}");
      return dict;
    }
    fail_here("expected an expression");
  }
};

}  // namespace

Body parse(const std::vector<Token> &tokens) { return Parser(tokens).program(); }

}  // namespace moe::jinja
