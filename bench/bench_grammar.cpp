// Cost of grammar-constrained sampling per generated token on the 151k Qwen3 vocabulary
// (conformance folder, as bench/tokenizer.cpp), next to a CPU decode step of the `medium`
// synthetic preset, which the grammar step must stay under 5% of (docs/perf/grammar.md).
//
//   moeinfer-cli mkmodel --preset medium --type q4_k_m -o medium.gguf
//   MOEINFER_BENCH_MEDIUM=medium.gguf build/bin/bench-bench_grammar
//
// GrammarStep/<position>: one token's grammar work in a JSON-schema grammar: mask the full
// candidate list (trie walk) and accept a token that keeps the position, i.e. the steady
// state of a long generation. Positions: inside a string (almost every token allowed: the
// longest walk), inside a number, and between members (few tokens allowed).
// DecodeStep/medium: one-token decode at position ~64 on the CPU (skipped without the file).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "sampler/grammar.h"
#include "sampler/grammar_sampler.h"
#include "sampler/json_schema.h"
#include "tokenizer/vocab.h"

namespace {

std::string conformance_model() {
  const char *d = std::getenv("MOEINFER_CONFORMANCE_DIR");
  return std::string(d ? d : MOEINFER_CONFORMANCE_DIR) + "/models/qwen3moe-f16.gguf";
}

struct Qwen3Vocab {
  std::unique_ptr<moe::GgufFile> file;
  std::unique_ptr<moe::Vocab> vocab;
  std::string error;
};

const Qwen3Vocab &qwen3() {
  static Qwen3Vocab l = [] {
    Qwen3Vocab r;
    try {
      r.file = moe::GgufFile::open(conformance_model());
      r.vocab = moe::Vocab::from_gguf(*r.file);
      if (!r.vocab) r.error = "no tokenizer";
    } catch (const std::exception &e) {
      r.error = std::string("Qwen3 vocabulary not available: ") + e.what();
    }
    return r;
  }();
  return l;
}

const char *kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},"count":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},
  "done":{"type":"boolean"}},"required":["name","count","tags","done"]})";

// The prefix that reaches each position, and a one-byte token that keeps it there.
struct Position {
  const char *prefix;
  char keep;
};
const Position kPositions[] = {
    {R"({"name": "abc)", 'x'},                 // inside a string
    {R"({"name": "a", "count": 12)", '3'},    // inside a number (stays there up to 16 digits)
    {R"({"name": "a", "count": 1, "tags": [)", ' '},  // whitespace before an array item
};

int32_t byte_token(const moe::Vocab &v, char c) {
  for (int32_t id = 0; id < v.n_tokens(); ++id)
    if (!v.is_eog(id) && v.token_to_piece(id, false) == std::string(1, c)) return id;
  return -1;
}

void GrammarStep(benchmark::State &state) {
  const Qwen3Vocab &q = qwen3();
  if (!q.vocab) {
    state.SkipWithError(q.error.c_str());
    return;
  }
  const Position &pos = kPositions[state.range(0)];
  moe::GrammarStage stage(moe::parse_gbnf(moe::json_schema_to_gbnf(kSchema)), *q.vocab);
  for (const char *c = pos.prefix; *c; ++c) stage.accept(byte_token(*q.vocab, *c));
  const int32_t keep = byte_token(*q.vocab, pos.keep);
  std::vector<float> logits(size_t(q.vocab->n_tokens()));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (float &x : logits) x = nd(rng);
  moe::Candidates c;
  moe::Rng r(1);
  size_t allowed = 0;
  // Only a string stays where it is for ever; the number (16 digits at most) and the
  // whitespace (20 characters) would move on, so they are measured without the accept.
  const bool accept = state.range(0) == 0;
  for (auto _ : state) {
    c.init(logits.data(), int32_t(logits.size()));
    stage.apply(c, r);
    if (accept) stage.accept(keep);
    benchmark::DoNotOptimize(c.data.data());
  }
  for (const auto &t : c.data) allowed += t.logit > -INFINITY;
  state.counters["allowed_tokens"] = double(allowed);
  state.counters["vocab"] = double(q.vocab->n_tokens());
}
BENCHMARK(GrammarStep)->Arg(0)->Arg(1)->Arg(2)->ArgName("position")->Unit(benchmark::kMicrosecond);

// The mask of a state seen for the first time: the full trie walk (the automaton's
// transitions are warm after the first iteration, as they are after the first tokens).
// GrammarStep above reuses the mask of a state it has seen (the steady state of a string).
void TrieWalk(benchmark::State &state) {
  const Qwen3Vocab &q = qwen3();
  if (!q.vocab) {
    state.SkipWithError(q.error.c_str());
    return;
  }
  std::vector<std::string> pieces(size_t(q.vocab->n_tokens()));
  for (int32_t id = 0; id < q.vocab->n_tokens(); ++id)
    if (!q.vocab->is_eog(id)) pieces[size_t(id)] = q.vocab->token_to_piece(id, false);
  const moe::TokenTrie trie(pieces);
  moe::GrammarMatcher m(moe::parse_gbnf(moe::json_schema_to_gbnf(kSchema)));
  if (!m.accept_bytes(kPositions[state.range(0)].prefix)) {
    state.SkipWithError("prefix rejected");
    return;
  }
  std::vector<uint8_t> allowed(pieces.size());
  for (auto _ : state) {
    std::fill(allowed.begin(), allowed.end(), 0);
    trie.walk(m, m.state(), allowed.data());
    benchmark::DoNotOptimize(allowed.data());
  }
  size_t n = 0;
  for (uint8_t a : allowed) n += a;
  state.counters["allowed_tokens"] = double(n);
  state.counters["trie_nodes"] = double(trie.n_nodes());
}
BENCHMARK(TrieWalk)->Arg(0)->Arg(1)->Arg(2)->ArgName("position")->Unit(benchmark::kMicrosecond);

// Candidate list setup alone (part of every sampler step, grammar or not): subtract it to
// get the grammar's own share.
void CandidatesInit(benchmark::State &state) {
  std::vector<float> logits(151936, 0.5f);
  moe::Candidates c;
  for (auto _ : state) {
    c.init(logits.data(), int32_t(logits.size()));
    benchmark::DoNotOptimize(c.data.data());
  }
}
BENCHMARK(CandidatesInit)->Unit(benchmark::kMicrosecond);

void DecodeStepMedium(benchmark::State &state) {
  const char *path = std::getenv("MOEINFER_BENCH_MEDIUM");
  if (!path) {
    state.SkipWithError("set MOEINFER_BENCH_MEDIUM to a `medium` preset GGUF (moeinfer-cli mkmodel --preset medium)");
    return;
  }
  moe::ModelLoadParams mp;
  auto model = moe::Model::load(path, mp);
  moe::ContextParams cp;
  cp.n_ctx = 256;
  cp.device = "cpu";
  auto ctx = moe::Context::create(*model, cp);
  std::vector<moe::BatchToken> prompt;
  for (int32_t i = 0; i < 64; ++i) prompt.push_back(moe::BatchToken{(i * 37) % 1000, i, 0, i == 63});
  ctx->decode(prompt.data(), prompt.size());
  int32_t p = 64;
  for (auto _ : state) {
    moe::BatchToken t{p % 1000, p, 0, true};
    ctx->decode(&t, 1);
    benchmark::DoNotOptimize(ctx->logits(0));
    if (++p >= 250) {
      state.PauseTiming();
      p = 64;
      // Positions past 64 are removed so every step attends over the same ~64-200 cells.
      ctx->kv_seq_rm(0, 64, -1);
      state.ResumeTiming();
    }
  }
}
BENCHMARK(DecodeStepMedium)->Unit(benchmark::kMillisecond)->MinTime(5.0);

}  // namespace
