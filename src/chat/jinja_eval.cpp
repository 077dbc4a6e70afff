#include "chat/jinja_eval.h"

#include <climits>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "core/status.h"

namespace moe::jinja {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};

// A macro sees the scope it was defined in. Weak: that scope holds the macro itself, and a
// strong reference would be a cycle that is never freed.
struct Macro {
  const Stmt *def;
  std::weak_ptr<Scope> closure;
};

[[noreturn]] void fail_at(Status s, int line, int col, const std::string &why) {
  throw Error(s, strfmt("chat template: %s at line %d, column %d", why.c_str(), line, col));
}

// Python-style index into [0, n): negative counts from the end; false when out of range.
bool norm_index(int64_t k, size_t n, size_t &out) {
  if (k < 0) k += static_cast<int64_t>(n);
  if (k < 0 || k >= static_cast<int64_t>(n)) return false;
  out = static_cast<size_t>(k);
  return true;
}

std::vector<std::string> utf8_chars(const std::string &s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    size_t n = 1;
    const unsigned char c = static_cast<unsigned char>(s[k]);
    if (c >= 0xF0) n = 4;
    else if (c >= 0xE0) n = 3;
    else if (c >= 0xC0) n = 2;
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

class Evaluator {
public:
  Evaluator(const Value &context, const RenderOptions &opts) : opts_(opts) {
    root_ = std::make_shared<Scope>();
    for (const auto &kv : context.obj->items) root_->vars[kv.first] = kv.second;
    install_globals();
  }

  // A namespace may hold itself (`{% set ns.me = ns %}`): a reference cycle. Its attributes
  // are dropped once the render is over, so every value it held is freed.
  ~Evaluator() {
    for (Value &ns : namespaces_) ns.obj->items.clear();
  }
  Evaluator(const Evaluator &) = delete;
  Evaluator &operator=(const Evaluator &) = delete;

  std::string run(const Body &program) {
    std::string out;
    exec(program, root_, out);
    return out;
  }

private:
  RenderOptions opts_;
  std::shared_ptr<Scope> root_;
  std::vector<Value> namespaces_;  // every namespace() this render made
  int depth_ = 0;

  void define_global(const char *name, Function f) {
    if (!root_->vars.count(name)) root_->vars[name] = Value::function(std::move(f));
  }

  void install_globals() {
    define_global("namespace", [this](CallArgs &a) {
      Value ns = Value::namespace_object();
      if (!a.args.empty() && a.args[0].is_object())
        for (const auto &kv : a.args[0].obj->items) ns.set(kv.first, kv.second);
      for (auto &kv : a.kwargs) ns.set(kv.first, kv.second);
      namespaces_.push_back(ns);
      return ns;
    });
    define_global("raise_exception", [](CallArgs &a) -> Value {
      throw Error(Status::InvalidArgument, "raise_exception: " + to_str(a.get(0, "message")));
    });
    const int64_t now = opts_.now_unix;
    define_global("strftime_now", [now](CallArgs &a) {
      const Value fmt = a.get(0, "format");
      if (!fmt.is_string()) throw Error(Status::InvalidArgument, "strftime_now: the format must be a string");
      const std::time_t t = now != 0 ? static_cast<std::time_t>(now) : std::time(nullptr);
      std::tm tm{};
      gmtime_r(&t, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, fmt.s.c_str(), &tm);
      return Value(std::string(buf, n));
    });
    define_global("range", [](CallArgs &a) {
      int64_t start = 0, stop = 0, step = 1;
      if (a.args.size() == 1) stop = a.args[0].i;
      if (a.args.size() >= 2) {
        start = a.args[0].i;
        stop = a.args[1].i;
      }
      if (a.args.size() >= 3) step = a.args[2].i;
      const double count = (static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step ? step : 1);
      if (step == 0 || count > 100000) throw Error(Status::InvalidArgument, "range: a step of 0 or more than 100000 items");
      Value out = Value::array();
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push(Value(k));
      return out;
    });
    define_global("dict", [](CallArgs &a) {
      Value d = Value::object();
      for (auto &kv : a.kwargs) d.set(kv.first, kv.second);
      return d;
    });
  }

  static Value lookup(const std::shared_ptr<Scope> &scope, const std::string &name) {
    for (const Scope *s = scope.get(); s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    return Value();
  }

  // ---------------------------------------------------------------- statements
  void exec(const Body &body, const std::shared_ptr<Scope> &scope, std::string &out) {
    for (const auto &s : body) exec_one(*s, scope, out);
  }

  void exec_one(const Stmt &s, const std::shared_ptr<Scope> &scope, std::string &out) {
    switch (s.kind) {
      case Stmt::Kind::Text: out += s.text; return;
      case Stmt::Kind::Output: {
        const Value v = eval(*s.expr, scope);
        if (v.kind == Value::Kind::Function) fail_at(Status::InvalidArgument, s.line, s.col, "cannot print a function");
        out += to_str(v);
        return;
      }
      case Stmt::Kind::If:
        for (const auto &br : s.branches)
          if (truthy(eval(*br.first, scope))) {
            exec(br.second, scope, out);
            return;
          }
        exec(s.else_body, scope, out);
        return;
      case Stmt::Kind::For: exec_for(s, scope, out); return;
      case Stmt::Kind::Set: exec_set(s, scope); return;
      case Stmt::Kind::Macro: {
        auto m = std::make_shared<Macro>(Macro{&s, scope});
        scope->vars[s.text] = Value::function([this, m](CallArgs &a) { return call_macro(*m, a); });
        return;
      }
    }
  }

  void assign(const Stmt &s, const std::vector<std::string> &targets, const Value &v, Scope &scope) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    if (!v.is_array() || v.arr->size() != targets.size())
      fail_at(Status::InvalidArgument, s.line, s.col,
              strfmt("cannot unpack a %s into %zu names", kind_name(v.kind), targets.size()));
    for (size_t k = 0; k < targets.size(); ++k) scope.vars[targets[k]] = (*v.arr)[k];
  }

  void exec_set(const Stmt &s, const std::shared_ptr<Scope> &scope) {
    Value v = eval(*s.expr, scope);
    if (s.attr.empty()) {
      assign(s, s.targets, v, *scope);
      return;
    }
    Value ns = lookup(scope, s.targets[0]);
    if (!ns.is_namespace())
      fail_at(Status::InvalidArgument, s.line, s.col, "cannot assign an attribute of '" + s.targets[0] + "' (not a namespace())");
    ns.set(s.attr, std::move(v));
  }

  void exec_for(const Stmt &s, const std::shared_ptr<Scope> &scope, std::string &out) {
    const Value seq = eval(*s.expr, scope);
    std::vector<Value> items;
    if (seq.is_array()) items = *seq.arr;
    else if (seq.is_object()) for (const auto &kv : seq.obj->items) items.emplace_back(kv.first);
    else if (seq.is_string()) for (auto &c : utf8_chars(seq.s)) items.emplace_back(c);
    else if (!seq.is_undefined() && !seq.is_none())
      fail_at(Status::InvalidArgument, s.line, s.col, strfmt("cannot iterate over a %s", kind_name(seq.kind)));
    else if (seq.is_none()) fail_at(Status::InvalidArgument, s.line, s.col, "cannot iterate over none");
    if (s.filter) {
      std::vector<Value> kept;
      for (const auto &item : items) {
        auto tmp = std::make_shared<Scope>();
        tmp->parent = scope;
        assign(s, s.targets, item, *tmp);
        if (truthy(eval(*s.filter, tmp))) kept.push_back(item);
      }
      items.swap(kept);
    }
    if (items.empty()) {
      exec(s.else_body, scope, out);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      Value loop = Value::object();
      loop.set("index", Value(k + 1));
      loop.set("index0", Value(k));
      loop.set("revindex", Value(n - k));
      loop.set("revindex0", Value(n - k - 1));
      loop.set("first", Value(k == 0));
      loop.set("last", Value(k == n - 1));
      loop.set("length", Value(n));
      loop.set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value());
      loop.set("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value());
      inner->vars["loop"] = loop;
      assign(s, s.targets, items[static_cast<size_t>(k)], *inner);
      exec(s.body, inner, out);
    }
  }

  Value call_macro(const Macro &m, CallArgs &a) {
    const Stmt &def = *m.def;
    if (a.args.size() > def.params.size())
      fail_at(Status::InvalidArgument, def.line, def.col,
              strfmt("macro '%s' takes %zu arguments, %zu given", def.text.c_str(), def.params.size(), a.args.size()));
    if (++depth_ > opts_.max_depth) {
      depth_ = 0;
      fail_at(Status::InvalidArgument, def.line, def.col, "macro recursion too deep in '" + def.text + "'");
    }
    auto scope = std::make_shared<Scope>();
    scope->parent = m.closure.lock();
    if (!scope->parent) scope->parent = root_;
    for (size_t k = 0; k < def.params.size(); ++k) {
      const auto &param = def.params[k];
      Value v = a.get(k, param.first.c_str());
      if (k >= a.args.size() && v.is_undefined() && param.second) v = eval(*param.second, scope);
      scope->vars[param.first] = v;
    }
    for (const auto &kv : a.kwargs) {
      bool known = false;
      for (const auto &param : def.params) known = known || param.first == kv.first;
      if (!known)
        fail_at(Status::InvalidArgument, def.line, def.col,
                "macro '" + def.text + "' has no parameter '" + kv.first + "'");
    }
    std::string out;
    exec(def.body, scope, out);
    --depth_;
    return Value(std::move(out));
  }

  // ---------------------------------------------------------------- expressions
  CallArgs eval_args(const Expr &e, size_t first, const std::shared_ptr<Scope> &scope) {
    CallArgs a;
    for (size_t k = first; k < e.kids.size(); ++k) a.args.push_back(eval(*e.kids[k], scope));
    for (const auto &kv : e.kwargs) a.kwargs.emplace_back(kv.first, eval(*kv.second, scope));
    return a;
  }

  Value eval(const Expr &e, const std::shared_ptr<Scope> &scope) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.value;
      case Expr::Kind::Name: return lookup(scope, e.name);
      case Expr::Kind::Attr: return get_attr(e, eval(*e.kids[0], scope));
      case Expr::Kind::Index: return get_index(e, eval(*e.kids[0], scope), eval(*e.kids[1], scope));
      case Expr::Kind::Slice: return slice(e, scope);
      case Expr::Kind::Call: return call(e, scope);
      case Expr::Kind::Filter: {
        const Value input = eval(*e.kids[0], scope);
        CallArgs a = eval_args(e, 1, scope);
        Value out;
        try {
          if (!apply_filter(e.name, input, a, out))
            fail_at(Status::Unsupported, e.line, e.col, "unsupported filter '" + e.name + "'");
        } catch (const Error &err) {
          rethrow_at(err, e);
        }
        return out;
      }
      case Expr::Kind::Test: {
        const Value input = eval(*e.kids[0], scope);
        CallArgs a = eval_args(e, 1, scope);
        bool out = false;
        if (!apply_test(e.name, input, a, out))
          fail_at(Status::Unsupported, e.line, e.col, "unsupported test 'is " + e.name + "'");
        return Value(out != e.negated);
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.kids[0], scope);
        if (e.name == "not") return Value(!truthy(v));
        if (v.kind == Value::Kind::Int) {
          if (e.name == "-" && v.i == INT64_MIN) fail_at(Status::InvalidArgument, e.line, e.col, "integer overflow in unary -");
          return Value(e.name == "-" ? -v.i : v.i);
        }
        if (v.kind == Value::Kind::Float) return Value(e.name == "-" ? -v.f : v.f);
        fail_at(Status::InvalidArgument, e.line, e.col, strfmt("bad operand type for unary %s: %s", e.name.c_str(), kind_name(v.kind)));
      }
      case Expr::Kind::Binary: return binary(e, scope);
      case Expr::Kind::Ternary:
        if (truthy(eval(*e.kids[1], scope))) return eval(*e.kids[0], scope);
        return e.kids[2] ? eval(*e.kids[2], scope) : Value();
      case Expr::Kind::List: {
        Value out = Value::array();
        for (const auto &k : e.kids) out.push(eval(*k, scope));
        return out;
      }
      case Expr::Kind::Dict: {
        Value out = Value::object();
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          const Value key = eval(*e.kids[k], scope);
          if (!key.is_string()) fail_at(Status::Unsupported, e.line, e.col, "unsupported non-string dict key");
          out.set(key.s, eval(*e.kids[k + 1], scope));
        }
        return out;
      }
    }
    return Value();
  }

  [[noreturn]] static void rethrow_at(const Error &err, const Expr &e) {
    const std::string msg = err.what();
    if (msg.find(" at line ") != std::string::npos) throw err;
    fail_at(err.code(), e.line, e.col, msg);
  }

  static Value get_attr(const Expr &e, const Value &obj) {
    if (obj.is_undefined() || obj.is_none())
      fail_at(Status::InvalidArgument, e.line, e.col,
              strfmt("cannot read attribute '%s' of %s value", e.name.c_str(), kind_name(obj.kind)));
    return obj.get(e.name);
  }

  static Value get_index(const Expr &e, const Value &obj, const Value &key) {
    size_t k = 0;
    if (obj.is_array() && key.kind == Value::Kind::Int) return norm_index(key.i, obj.arr->size(), k) ? (*obj.arr)[k] : Value();
    if (obj.is_object() && key.is_string()) return obj.get(key.s);
    if (obj.is_string() && key.kind == Value::Kind::Int) {
      const auto chars = utf8_chars(obj.s);
      return norm_index(key.i, chars.size(), k) ? Value(chars[k]) : Value();
    }
    if (obj.is_undefined() || obj.is_none())
      fail_at(Status::InvalidArgument, e.line, e.col, strfmt("cannot index a %s value", kind_name(obj.kind)));
    if (obj.is_object()) return Value();
    fail_at(Status::InvalidArgument, e.line, e.col,
            strfmt("cannot index a %s with a %s", kind_name(obj.kind), kind_name(key.kind)));
  }

  Value slice(const Expr &e, const std::shared_ptr<Scope> &scope) {
    const Value obj = eval(*e.kids[0], scope);
    int64_t parts[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k)
      if (e.kids[static_cast<size_t>(k) + 1]) {
        const Value v = eval(*e.kids[static_cast<size_t>(k) + 1], scope);
        if (v.is_none()) continue;
        if (v.kind != Value::Kind::Int) fail_at(Status::InvalidArgument, e.line, e.col, "slice bounds must be integers");
        parts[k] = v.i;
        given[k] = true;
      }
    if (parts[2] == 0) fail_at(Status::InvalidArgument, e.line, e.col, "slice step cannot be zero");
    std::vector<Value> src;
    if (obj.is_array()) src = *obj.arr;
    else if (obj.is_string()) for (auto &c : utf8_chars(obj.s)) src.emplace_back(c);
    else fail_at(Status::InvalidArgument, e.line, e.col, strfmt("cannot slice a %s value", kind_name(obj.kind)));
    const int64_t n = static_cast<int64_t>(src.size()), step = parts[2];
    auto clamp = [&](int64_t v, bool is_given, int64_t dflt) {
      if (!is_given) return dflt;
      if (v < 0) v += n;
      if (step > 0) return v < 0 ? 0 : (v > n ? n : v);
      return v < -1 ? -1 : (v > n - 1 ? n - 1 : v);
    };
    const int64_t start = clamp(parts[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(parts[1], given[1], step > 0 ? n : -1);
    std::vector<Value> picked;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) picked.push_back(src[static_cast<size_t>(k)]);
    if (obj.is_array()) return Value::array(std::move(picked));
    std::string s;
    for (const auto &c : picked) s += c.s;
    return Value(std::move(s));
  }

  Value call(const Expr &e, const std::shared_ptr<Scope> &scope) {
    const Expr &callee = *e.kids[0];
    CallArgs a = eval_args(e, 1, scope);
    if (callee.kind == Expr::Kind::Attr) {
      const Value self = eval(*callee.kids[0], scope);
      Value out;
      if (!self.is_object() || !self.get(callee.name).fn) {
        try {
          if (call_method(self, callee.name, a, out)) return out;
        } catch (const Error &err) {
          rethrow_at(err, e);
        }
        if (self.is_string() || self.is_array() || self.is_object())
          fail_at(Status::Unsupported, e.line, e.col,
                  strfmt("unsupported method '%s' of a %s", callee.name.c_str(), kind_name(self.kind)));
      }
      return invoke(e, get_attr(callee, self), a, callee.name);
    }
    return invoke(e, eval(callee, scope), a, callee.kind == Expr::Kind::Name ? callee.name : "expression");
  }

  static Value invoke(const Expr &e, const Value &fn, CallArgs &a, const std::string &what) {
    if (fn.kind != Value::Kind::Function) {
      if (fn.is_undefined())
        fail_at(Status::Unsupported, e.line, e.col, "unsupported or undefined function '" + what + "'");
      fail_at(Status::InvalidArgument, e.line, e.col, "'" + what + "' is not callable");
    }
    try {
      return (*fn.fn)(a);
    } catch (const Error &err) {
      rethrow_at(err, e);
    }
  }

  Value binary(const Expr &e, const std::shared_ptr<Scope> &scope) {
    const std::string &op = e.name;
    const Value a = eval(*e.kids[0], scope);
    if (op == "and") return truthy(a) ? eval(*e.kids[1], scope) : a;
    if (op == "or") return truthy(a) ? a : eval(*e.kids[1], scope);
    const Value b = eval(*e.kids[1], scope);
    if (op == "==") return Value(equals(a, b));
    if (op == "!=") return Value(!equals(a, b));
    if (op == "~") return Value(to_str(a) + to_str(b));
    if (op == "in" || op == "not in") return Value(contains(e, b, a) == (op == "in"));
    const bool nums = a.is_number() && b.is_number();
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (nums) c = a.as_double() < b.as_double() ? -1 : (a.as_double() > b.as_double() ? 1 : 0);
      else if (a.is_string() && b.is_string()) c = a.s.compare(b.s) < 0 ? -1 : (a.s == b.s ? 0 : 1);
      else bad_operands(e, a, b);
      return Value(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.s + b.s);
      if (a.is_array() && b.is_array()) {
        Value out = Value::array(*a.arr);
        for (const auto &v : *b.arr) out.push(v);
        return out;
      }
    }
    if (op == "*" && a.is_string() && b.kind == Value::Kind::Int) {
      std::string out;
      for (int64_t k = 0; k < b.i && k < 100000; ++k) out += a.s;
      return Value(out);
    }
    if (!nums) bad_operands(e, a, b);
    const bool ints = a.kind == Value::Kind::Int && b.kind == Value::Kind::Int;
    const double x = a.as_double(), y = b.as_double();
    int64_t r = 0;
    const bool overflow = ints && ((op == "+" && __builtin_add_overflow(a.i, b.i, &r)) ||
                                   (op == "-" && __builtin_sub_overflow(a.i, b.i, &r)) ||
                                   (op == "*" && __builtin_mul_overflow(a.i, b.i, &r)));
    if (overflow) fail_at(Status::InvalidArgument, e.line, e.col, "integer overflow in " + op);
    if (op == "+" || op == "-" || op == "*") return ints ? Value(r) : Value(op == "+" ? x + y : op == "-" ? x - y : x * y);
    if (op == "**") {
      const double p = std::pow(x, y);
      if (ints && b.i >= 0) {
        if (!(std::fabs(p) < 9.2e18)) fail_at(Status::InvalidArgument, e.line, e.col, "integer overflow in **");
        return Value(static_cast<int64_t>(p));
      }
      return Value(p);
    }
    if (y == 0) fail_at(Status::InvalidArgument, e.line, e.col, "division by zero");
    if (ints && b.i == -1 && a.i == INT64_MIN) fail_at(Status::InvalidArgument, e.line, e.col, "integer overflow in " + op);
    if (op == "/") return Value(x / y);
    if (op == "//") {
      if (!ints) return Value(std::floor(x / y));
      const int64_t q = a.i / b.i;
      return Value((a.i % b.i != 0 && ((a.i < 0) != (b.i < 0))) ? q - 1 : q);
    }
    if (op == "%") {
      if (ints) {
        int64_t rem = a.i % b.i;
        if (rem != 0 && ((rem < 0) != (b.i < 0))) rem += b.i;
        return Value(rem);
      }
      return Value(x - y * std::floor(x / y));
    }
    bad_operands(e, a, b);
  }

  [[noreturn]] static void bad_operands(const Expr &e, const Value &a, const Value &b) {
    fail_at(Status::InvalidArgument, e.line, e.col,
            strfmt("unsupported operand types for %s: %s and %s", e.name.c_str(), kind_name(a.kind), kind_name(b.kind)));
  }

  static bool contains(const Expr &e, const Value &container, const Value &item) {
    if (container.is_string() && item.is_string()) return container.s.find(item.s) != std::string::npos;
    if (container.is_array()) {
      for (const auto &v : *container.arr)
        if (equals(v, item)) return true;
      return false;
    }
    if (container.is_object()) return item.is_string() && container.has(item.s);
    if (container.is_undefined()) return false;
    fail_at(Status::InvalidArgument, e.line, e.col,
            strfmt("'in' needs a string, list or dict on the right, got %s", kind_name(container.kind)));
  }
};

}  // namespace

std::string render(const Body &program, const Value &context, const RenderOptions &opts) {
  return Evaluator(context, opts).run(program);
}

}  // namespace moe::jinja
