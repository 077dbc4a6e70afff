#include "chat/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/status.h"

namespace moe::jinja {
namespace {

class Lexer {
public:
  explicit Lexer(const std::string &src) : s_(src) {
    if (!s_.empty() && s_.back() == '\n') s_.pop_back();  // keep_trailing_newline=False
  }

  std::vector<Token> run() {
    bool strip_next = false;  // previous tag ended with '-'
    bool trim_next = false;   // previous block/comment tag: drop one newline (trim_blocks)
    while (p_ < s_.size()) {
      const size_t open = find_tag(p_);
      std::string text = s_.substr(p_, open - p_);
      if (strip_next) {
        const size_t first = text.find_first_not_of(" \t\r\n");
        text.erase(0, first == std::string::npos ? text.size() : first);
      } else if (trim_next && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
      }
      strip_next = trim_next = false;
      if (open >= s_.size()) {
        emit_text(text);
        break;
      }
      const char kind = s_[open + 1];
      const char mod = open + 2 < s_.size() ? s_[open + 2] : '\0';
      if (mod == '-') {
        const size_t keep = text.find_last_not_of(" \t\r\n");
        text.erase(keep == std::string::npos ? 0 : keep + 1);
      } else if (kind != '{' && mod != '+') {
        lstrip_blocks(open, text);
      }
      emit_text(text);
      advance_to(open);
      const int tl = line_, tc = col_;
      advance_to(open + 2 + ((mod == '-' || mod == '+') ? 1 : 0));
      if (kind == '#') {
        const size_t close = s_.find("#}", p_);
        if (close == std::string::npos) fail(tl, tc, "unterminated comment");
        strip_next = close > p_ && s_[close - 1] == '-';
        trim_next = !strip_next;
        advance_to(close + 2);
        continue;
      }
      toks_.push_back({kind == '{' ? Tok::ExprOpen : Tok::StmtOpen, "", tl, tc});
      inside_tag(kind == '{' ? '}' : '%', tl, tc, strip_next);
      trim_next = kind == '%' && !strip_next;
    }
    toks_.push_back({Tok::End, "", line_, col_});
    return std::move(toks_);
  }

private:
  std::string s_;
  size_t p_ = 0;
  int line_ = 1, col_ = 1;
  std::vector<Token> toks_;

  [[noreturn]] static void fail(int line, int col, const char *why) {
    throw Error(Status::InvalidArgument, strfmt("chat template: %s at line %d, column %d", why, line, col));
  }

  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < s_.size(); ++k)
      if (s_[k] == '{' && (s_[k + 1] == '{' || s_[k + 1] == '%' || s_[k + 1] == '#')) return k;
    return s_.size();
  }

  void advance_to(size_t to) {
    for (; p_ < to && p_ < s_.size(); ++p_) {
      if (s_[p_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
    }
  }

  // lstrip_blocks: spaces/tabs between the start of a source line and a block or comment
  // tag are dropped (only when nothing else precedes the tag on that line).
  void lstrip_blocks(size_t open, std::string &text) const {
    size_t j = open;
    while (j > 0 && (s_[j - 1] == ' ' || s_[j - 1] == '\t')) --j;
    if (j != 0 && s_[j - 1] != '\n') return;
    const size_t n = std::min(open - j, text.size());
    text.erase(text.size() - n);
  }

  void emit_text(const std::string &text) {
    if (!text.empty()) toks_.push_back({Tok::Text, text, line_, col_});
  }

  void inside_tag(char closer, int tl, int tc, bool &strip_after) {
    for (;;) {
      while (p_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[p_]))) advance_to(p_ + 1);
      if (p_ >= s_.size()) fail(tl, tc, "unterminated tag");
      const int line = line_, col = col_;
      const char c = s_[p_];
      auto at = [&](const char *lit) { return s_.compare(p_, std::strlen(lit), lit) == 0; };
      if ((c == '-' || c == '+') && s_.compare(p_ + 1, 2, std::string(1, closer) + "}") == 0) {
        strip_after = c == '-';
        advance_to(p_ + 3);
        toks_.push_back({closer == '}' ? Tok::ExprClose : Tok::StmtClose, "", line, col});
        return;
      }
      if (c == closer && p_ + 1 < s_.size() && s_[p_ + 1] == '}') {
        strip_after = false;
        advance_to(p_ + 2);
        toks_.push_back({closer == '}' ? Tok::ExprClose : Tok::StmtClose, "", line, col});
        return;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p_;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        toks_.push_back({Tok::Name, s_.substr(p_, e - p_), line, col});
        advance_to(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p_;
        bool is_float = false;
        while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
        }
        toks_.push_back({is_float ? Tok::Float : Tok::Int, s_.substr(p_, e - p_), line, col});
        advance_to(e);
      } else if (c == '\'' || c == '"') {
        toks_.push_back({Tok::String, string_literal(c, line, col), line, col});
      } else {
        static const char *const two[] = {"==", "!=", "<=", ">=", "//", "**"};
        std::string op(1, c);
        for (const char *t : two)
          if (at(t)) op = t;
        if (std::strchr("+-*/%~<>=()[]{}.,:|!", c) == nullptr) fail(line, col, "unexpected character in tag");
        toks_.push_back({Tok::Op, op, line, col});
        advance_to(p_ + op.size());
      }
    }
  }

  std::string string_literal(char quote, int line, int col) {
    std::string out;
    size_t k = p_ + 1;
    for (;;) {
      if (k >= s_.size()) fail(line, col, "unterminated string literal");
      const char c = s_[k++];
      if (c == quote) break;
      if (c != '\\' || k >= s_.size()) {
        out += c;
        continue;
      }
      const char e = s_[k++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        default:
          out += '\\';
          out += e;
      }
    }
    advance_to(k);
    return out;
  }
};

}  // namespace

std::vector<Token> tokenize(const std::string &src) { return Lexer(src).run(); }

}  // namespace moe::jinja
