// moeinfer-cli chat: an interactive conversation on stdin/stdout with the model's chat
// template. Each turn renders the whole conversation, keeps the KV cache of the longest
// token prefix it shares with what is already decoded and decodes only the rest (normally
// just the new turn); the reply streams until an end-of-generation token or -n tokens.
// Commands: /reset (forget the conversation and the cache), /exit.
// --verbose reports per turn on stderr: "[turn N] prompt P tokens: R reused, D decoded; G generated".
#include <algorithm>
#include <climits>
#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/chat_prompt.h"
#include "cli/commands.h"
#include "cli/demo_model.h"
#include "cli/placement_args.h"
#include "core/status.h"
#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "sampler/grammar_sampler.h"
#include "sampler/json_schema.h"
#include "sampler/sampler.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/vocab.h"

using namespace moe;

namespace cli {

std::string read_text_file(const std::string &path, const char *what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Status::IoError, std::string("cannot read the ") + what + " file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChatTemplate chat_template_for(const Model &model, const std::string &template_file) {
  if (!template_file.empty()) return {read_text_file(template_file, "template"), false};
  const GgufValue *v = model.gguf().find("tokenizer.chat_template");
  if (v && v->type == GgufType::STRING) return {v->str, false};
  return {chat::chatml_template(), true};
}

std::string render_chat(const Model &model, const ChatTemplate &tmpl, const std::vector<chat::Message> &messages,
                        int enable_thinking) {
  chat::Options opt;
  opt.enable_thinking = enable_thinking;
  if (const Vocab *v = model.vocab()) {
    if (v->bos() >= 0) opt.bos_token = v->token_text(v->bos());
    if (v->eos() >= 0) opt.eos_token = v->token_text(v->eos());
  }
  return chat::apply_template(tmpl.text, messages, opt);
}

std::string one_shot_chat_prompt(const Model &model, const std::string &system, const std::string &user) {
  std::vector<chat::Message> msgs;
  if (!system.empty()) msgs.push_back({"system", system});
  msgs.push_back({"user", user});
  std::string prompt = render_chat(model, chat_template_for(model, ""), msgs, -1);
  // generate tokenizes with the vocabulary's own BOS: a template's BOS text would double it.
  const Vocab *v = model.vocab();
  if (v && v->add_bos() && v->bos() >= 0 && prompt.rfind(v->token_text(v->bos()), 0) == 0)
    prompt.erase(0, v->token_text(v->bos()).size());
  return prompt;
}

}  // namespace cli

namespace {

void usage() {
  std::printf(
      "usage: moeinfer-cli chat [-m MODEL] [options] < conversation\n"
      "  Reads one user message per line from stdin and streams the reply. /reset starts over,\n"
      "  /exit (or end of input) quits.\n"
      "  -m MODEL            GGUF file (default: the built-in demo model with random weights)\n"
      "  --system TEXT       system prompt of the conversation\n"
      "  --template FILE     Jinja chat template to use instead of the model's (default: the\n"
      "                      model's tokenizer.chat_template; ChatML when it has none)\n"
      "  --think on|off      the template's enable_thinking switch (default: the template's own)\n"
      "  --json-schema FILE  every reply is JSON valid under this JSON Schema (grammar-constrained\n"
      "                      sampling; a reply cut by -n may be incomplete)\n"
      "  -n N                most tokens per reply, 1..2147483647 (default 256)\n"
      "  --temp T            temperature 0..100; 0 = greedy (default 0.7)\n"
      "  --seed S            sampling seed 0..4294967295 (default 1)\n"
      "  -c, --ctx N         context size in tokens; 0 = the model's, at most 4096 (default)\n"
      "  -t, --threads T     CPU threads 0..1024; 0 = physical cores (default)\n"
      "  --device DEV        cpu | cuda | cuda0 | auto (default auto)\n"
      "  --verbose           per turn on stderr: prompt tokens, tokens reused from the KV cache,\n"
      "                      tokens decoded, tokens generated\n");
}

struct Options {
  std::string model_path, system, template_file, schema_file, device = "auto";
  int enable_thinking = -1, n_gen = 256, threads = 0;
  uint32_t ctx = 0, seed = 1;
  double temp = 0.7;
  bool verbose = false;
};

int parse(int argc, char **argv, Options &o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() { return cli::value(argc, argv, i); };
    if (a == "-m" || a == "--model") o.model_path = val();
    else if (a == "--system") o.system = val();
    else if (a == "--template") o.template_file = val();
    else if (a == "--json-schema") o.schema_file = val();
    else if (a == "--think") {
      const std::string v = val();
      if (v != "on" && v != "off") return cli::report(2, "option --think: '" + v + "' is not on or off");
      o.enable_thinking = v == "on" ? 1 : 0;
    } else if (a == "-n" || a == "--n-predict") o.n_gen = static_cast<int>(cli::to_int(val(), "-n", 1, INT32_MAX));
    else if (a == "--temp") o.temp = cli::to_float(val(), "--temp", 0.0, 100.0);
    else if (a == "--seed") o.seed = static_cast<uint32_t>(cli::to_int(val(), "--seed", 0, UINT32_MAX));
    else if (a == "--ctx" || a == "-c" || a == "--ctx-size") o.ctx = static_cast<uint32_t>(cli::to_int(val(), "--ctx", 0, kMaxContextCells));
    else if (a == "--threads" || a == "-t") o.threads = static_cast<int>(cli::to_int(val(), "--threads", 0, kMaxThreads));
    else if (a == "--device") o.device = cli::device_name(val());
    else if (a == "--verbose") o.verbose = true;
    else if (a == "-h" || a == "--help") { usage(); return 0; }
    else return cli::report(2, "unknown option '" + a + "' (see moeinfer-cli chat --help)");
  }
  return -1;
}

// Writes model text to the terminal with control bytes (other than newline and tab)
// replaced by U+FFFD: random or byte-level tokens can carry escape sequences.
void emit(const std::string &text) {
  for (unsigned char c : text) {
    const bool control = (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f;
    if (control) std::fputs("\xEF\xBF\xBD", stdout);
    else std::fputc(c, stdout);
  }
  std::fflush(stdout);
}

class ChatSession {
public:
  ChatSession(const Options &o, std::unique_ptr<Model> model)
      : o_(o), model_(std::move(model)), tmpl_(cli::chat_template_for(*model_, o.template_file)), chain_(o.seed) {
    ContextParams cp;
    cp.n_ctx = o.ctx;
    cp.n_threads = o.threads;
    cp.device = o.device;
    ctx_ = Context::create(*model_, cp);
    if (!o.schema_file.empty()) {  // first in the chain: the grammar masks before anything selects
      const std::string schema = cli::read_text_file(o.schema_file, "JSON Schema");
      chain_.add(std::make_unique<GrammarStage>(parse_gbnf(json_schema_to_gbnf(schema)), *model_->vocab()));
      constrained_ = true;
    }
    if (o.temp > 0) {
      chain_.add(std::make_unique<TemperatureStage>(static_cast<float>(o.temp)));
      chain_.add(std::make_unique<DistStage>());
    } else {
      chain_.add(std::make_unique<GreedyStage>());
    }
    if (tmpl_.fallback) cli::report(0, "the model has no chat template: using ChatML (docs/chat.md)");
    reset();
  }

  void reset() {
    history_.clear();
    if (!o_.system.empty()) history_.push_back({"system", o_.system});
    ctx_->kv_clear();
    cached_.clear();
    chain_.reset();
  }

  // One user turn: returns false when the context cannot hold the conversation.
  bool turn(const std::string &user) {
    history_.push_back({"user", user});
    const std::string prompt = cli::render_chat(*model_, tmpl_, history_, o_.enable_thinking);
    const Vocab &vocab = *model_->vocab();
    const bool add_bos = vocab.add_bos() && vocab.bos() >= 0 && prompt.rfind(vocab.token_text(vocab.bos()), 0) != 0;
    std::vector<int32_t> ids = vocab.encode(prompt, add_bos, true);
    if (ids.size() + 1 >= ctx_->params().n_ctx) {
      history_.pop_back();
      cli::report(0, "the conversation (" + std::to_string(ids.size()) + " tokens) no longer fits the context of " +
                         std::to_string(ctx_->params().n_ctx) + ": /reset or raise --ctx");
      return false;
    }
    const size_t reused = keep_common_prefix(ids);
    decode_from(ids, reused);
    const std::string reply = generate(ids.size());
    history_.push_back({"assistant", reply});
    if (o_.verbose)
      std::fprintf(stderr, "[turn %zu] prompt %zu tokens: %zu reused, %zu decoded; %zu generated\n", ++turns_,
                   ids.size(), reused, ids.size() - reused, generated_);
    return true;
  }

private:
  Options o_;
  std::unique_ptr<Model> model_;
  cli::ChatTemplate tmpl_;
  std::unique_ptr<Context> ctx_;
  SamplerChain chain_;
  std::vector<chat::Message> history_;
  std::vector<int32_t> cached_;  // the tokens whose KV cells are in the cache, positions 0..
  size_t turns_ = 0;
  size_t generated_ = 0;
  bool constrained_ = false;  // a JSON-schema grammar leads the chain: restart it per reply  // tokens sampled in the last reply (an end-of-generation token excluded)

  // Drops cached positions past the longest prefix shared with ids; returns its length.
  // At least one token is left to decode, so the last position has fresh logits.
  size_t keep_common_prefix(const std::vector<int32_t> &ids) {
    size_t n = 0;
    while (n < cached_.size() && n + 1 < ids.size() && cached_[n] == ids[n]) ++n;
    ctx_->kv_seq_rm(0, static_cast<int32_t>(n), -1);
    cached_.resize(n);
    return n;
  }

  void decode_from(const std::vector<int32_t> &ids, size_t from) {
    const size_t n_batch = ctx_->params().n_batch;
    std::vector<BatchToken> batch;
    for (size_t at = from; at < ids.size(); at += n_batch) {
      batch.clear();
      const size_t end = std::min(ids.size(), at + n_batch);
      for (size_t k = at; k < end; ++k) batch.push_back({ids[k], static_cast<int32_t>(k), 0, k + 1 == ids.size()});
      ctx_->decode(batch.data(), batch.size());
      cached_.insert(cached_.end(), ids.begin() + static_cast<std::ptrdiff_t>(at), ids.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }

  std::string generate(size_t n_past) {
    const Vocab &vocab = *model_->vocab();
    StreamDetokenizer detok(vocab, false);
    std::string reply;
    generated_ = 0;
    if (constrained_) chain_.reset();
    const uint32_t n_ctx = ctx_->params().n_ctx;
    for (int step = 0; step < o_.n_gen; ++step) {
      const int32_t next = chain_.sample(ctx_->logits(-1), model_->n_vocab());
      if (vocab.is_eog(next)) break;
      ++generated_;
      const std::string piece = detok.push(next);
      reply += piece;
      emit(piece);
      if (step + 1 == o_.n_gen || n_past + 1 >= n_ctx) break;
      BatchToken t{next, static_cast<int32_t>(n_past++), 0, true};
      ctx_->decode(&t, 1);
      cached_.push_back(next);
    }
    const std::string tail = detok.flush();
    reply += tail;
    emit(tail + "\n");
    return reply;
  }
};

}  // namespace

int cmd_chat(int argc, char **argv) {
  Options o;
  if (const int rc = parse(argc, argv, o); rc >= 0) return rc;
  try {
    if (o.model_path.empty()) {
      o.model_path = demo_model_path();
      std::fprintf(stderr, "No -m MODEL given: chatting with the built-in demo model (RANDOM weights: the replies are gibberish).\n");
    }
    ModelLoadParams mp;
    auto model = Model::load(o.model_path, mp);
    if (!model->vocab()) return cli::report(2, "the model has no tokenizer: chat needs one");
    ChatSession chat(o, std::move(model));
    const bool terminal = isatty(STDIN_FILENO) != 0;  // a prompt marker only for people typing
    std::string line;
    for (;;) {
      if (terminal) {
        std::fputs("> ", stdout);
        std::fflush(stdout);
      }
      if (!std::getline(std::cin, line)) break;
      if (line == "/exit" || line == "/quit") break;
      if (line == "/reset") {
        chat.reset();
        std::printf("[conversation reset]\n");
        std::fflush(stdout);
        continue;
      }
      if (line.empty()) continue;
      if (!chat.turn(line)) return 1;
    }
    return 0;
  } catch (const Error &e) {
    return cli::report(1, std::string(e.what()) + " [" + status_name(e.code()) + "]");
  }
}
