// Tokenizer throughput: encode MB/s (one thread) on English prose, source code and CJK text
// with the Qwen3 vocabulary from the shared conformance folder, plus vocabulary load time and
// decode speed. Set MOEINFER_CONFORMANCE_DIR to point elsewhere; without the file every
// benchmark reports SkipWithError.
//
//   build/bin/bench-tokenizer --benchmark_filter=Encode
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "gguf/gguf_reader.h"
#include "tokenizer/vocab.h"

namespace {

std::string model_path() {
  if (const char *d = std::getenv("MOEINFER_CONFORMANCE_DIR")) return std::string(d) + "/models/qwen3moe-f16.gguf";
  std::string here = __FILE__;  // <repo>/bench/tokenizer.cpp -> <repo>/../shared/conformance
  std::string repo = here.substr(0, here.rfind("/bench/"));
  return repo + "/../shared/conformance/models/qwen3moe-f16.gguf";
}

struct Loaded {
  std::unique_ptr<moe::GgufFile> file;
  std::unique_ptr<moe::Vocab> vocab;
  std::string error;
};

const Loaded &qwen3() {
  static Loaded l = [] {
    Loaded r;
    try {
      r.file = moe::GgufFile::open(model_path());
      r.vocab = moe::Vocab::from_gguf(*r.file);
      if (!r.vocab) r.error = "no tokenizer in " + model_path();
    } catch (const std::exception &e) {
      r.error = std::string("Qwen3 vocabulary not available: ") + e.what();
    }
    return r;
  }();
  return l;
}

// Text generators: varied enough that no two stretches repeat, ~1 MB each.
std::string english(size_t bytes) {
  static const char *const subj[] = {"The committee", "A small team of engineers", "Our neighbours", "The old lighthouse keeper",
                                     "Every student in the class", "The river", "Historians", "She", "The new policy",
                                     "Nobody at the station"};
  static const char *const verb[] = {"argued that", "noticed how", "wondered whether", "reported that", "couldn't believe",
                                     "carefully explained why", "had long suspected that", "insisted, quite loudly, that"};
  static const char *const rest[] = {
      "the weather would change before the harvest was finished.",
      "prices in 1998 were roughly 12.5% lower than they are today.",
      "the bridge, built in the nineteenth century, needed urgent repairs.",
      "nobody had read the report's final chapter, which mattered most.",
      "the museum's collection included letters, maps and photographs.",
      "a quiet afternoon by the sea is worth more than any meeting.",
      "they'd already decided; the vote was merely a formality.",
      "the results were \"surprising, if not entirely unexpected\"."};
  std::mt19937 rng(1);
  std::string s;
  while (s.size() < bytes) {
    s += subj[rng() % 10];
    s += ' ';
    s += verb[rng() % 8];
    s += ' ';
    s += rest[rng() % 8];
    s += (rng() % 5 == 0) ? "\n\n" : " ";
  }
  return s;
}

std::string code(size_t bytes) {
  static const char *const names[] = {"buffer", "count", "result", "node", "index", "value", "tokens", "offset", "config"};
  std::mt19937 rng(2);
  std::string s;
  int fn = 0;
  while (s.size() < bytes) {
    const char *a = names[rng() % 9], *b = names[rng() % 9];
    s += "static int process_" + std::to_string(fn++) + "(const std::vector<int> &" + a + ", size_t " + b + ") {\n";
    s += "    if (" + std::string(b) + " >= " + a + ".size()) {\n        return -1;  // out of range\n    }\n";
    s += "    int acc = 0;\n    for (size_t i = 0; i < " + std::string(b) + "; ++i) {\n";
    s += "        acc += " + std::string(a) + "[i] * " + std::to_string(rng() % 1000) + ";\n    }\n";
    s += "    return acc % " + std::to_string(7 + rng() % 100) + ";\n}\n\n";
    s += "def " + std::string(a) + "_" + std::to_string(fn) + "(x, y=None):\n    \"\"\"Return the " + b +
         " of x.\"\"\"\n    return [v * 2 for v in x if v > " + std::to_string(rng() % 50) + "]\n\n";
  }
  return s;
}

std::string cjk(size_t bytes) {
  static const char *const zh[] = {"今天的天气非常好，我们一起去公园散步吧。", "人工智能正在改变我们的生活方式。",
                                   "这个问题需要更多的时间来研究和讨论。", "他在北京大学学习了四年的计算机科学。",
                                   "图书馆里有很多关于历史和文化的书籍。"};
  static const char *const ja[] = {"東京は日本の首都であり、多くの人々が住んでいます。", "私は毎朝コーヒーを飲みながら新聞を読みます。",
                                   "この本はとても面白かったので、友達にも勧めました。"};
  static const char *const ko[] = {"오늘은 날씨가 정말 좋습니다.", "우리는 내일 도서관에서 만날 예정입니다."};
  std::mt19937 rng(3);
  std::string s;
  while (s.size() < bytes) {
    unsigned r = rng() % 10;
    s += r < 6 ? zh[rng() % 5] : r < 9 ? ja[rng() % 3] : ko[rng() % 2];
    if (rng() % 4 == 0) s += "\n";
  }
  return s;
}

void encode_bench(benchmark::State &state, const std::string &text) {
  const Loaded &l = qwen3();
  if (!l.vocab) {
    state.SkipWithError(l.error.c_str());
    return;
  }
  size_t n_tokens = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = l.vocab->encode(text, false, false);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["bytes_per_token"] = double(text.size()) / double(n_tokens ? n_tokens : 1);
  state.counters["tokens/s"] = benchmark::Counter(double(n_tokens) * double(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_EncodeEnglish(benchmark::State &state) { static const std::string t = english(1 << 20); encode_bench(state, t); }
void BM_EncodeCode(benchmark::State &state) { static const std::string t = code(1 << 20); encode_bench(state, t); }
void BM_EncodeCJK(benchmark::State &state) { static const std::string t = cjk(1 << 20); encode_bench(state, t); }

void BM_LoadVocab(benchmark::State &state) {
  const Loaded &l = qwen3();
  if (!l.vocab) {
    state.SkipWithError(l.error.c_str());
    return;
  }
  for (auto _ : state) {
    auto v = moe::Vocab::from_gguf(*l.file);
    benchmark::DoNotOptimize(v.get());
  }
}

// Vocabulary build time for each conformance vocabulary (GGUF already parsed).
void BM_LoadVocabFile(benchmark::State &state, const char *file) {
  std::string path = model_path();
  path = path.substr(0, path.rfind('/') + 1) + file;
  std::unique_ptr<moe::GgufFile> f;
  try {
    f = moe::GgufFile::open(path);
  } catch (const std::exception &e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    auto v = moe::Vocab::from_gguf(*f);
    benchmark::DoNotOptimize(v.get());
  }
}

void BM_Decode(benchmark::State &state) {
  const Loaded &l = qwen3();
  if (!l.vocab) {
    state.SkipWithError(l.error.c_str());
    return;
  }
  static const std::string text = english(1 << 20);
  static const std::vector<int32_t> ids = l.vocab->encode(text, false, false);
  for (auto _ : state) {
    std::string s = l.vocab->decode(ids.data(), ids.size(), false);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}

}  // namespace

BENCHMARK(BM_EncodeEnglish)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeCode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeCJK)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadVocab)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LoadVocabFile, deepseek_v3, "deepseek2-f16.gguf")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LoadVocabFile, gpt_oss, "gpt-oss-f16.gguf")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);
