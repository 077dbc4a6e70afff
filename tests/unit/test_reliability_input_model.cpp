// Reliability of model loading on untrusted files (issue 19): hyperparameters that would
// decode to NaN, corrupted weight types, paths that are not regular files, a model file
// truncated after load, and GGUF metadata / vocabularies built to exhaust memory. Every case
// must end in a clear status at load (or at context creation for the truncated file), never a
// hang, a crash or a NaN decode.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "moeinfer/moeinfer.h"
#include "support/tiny_model.h"
#include "tokenizer/vocab.h"
#include "reliability/reliability_support.h"
#include "support/temp_files.h"

using namespace moe;

namespace {

std::string tmp_path(const std::string &name) { return moe_test::temp_path("rel-input-" + name); }

std::vector<uint8_t> read_all(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string &path, const std::vector<uint8_t> &b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(b.data()), std::streamsize(b.size()));
}

// The tiny model with metadata keys replaced (or added), written to a new file.
std::string tiny_with(const std::string &name, const std::map<std::string, GgufValue> &set) {
  auto src = GgufFile::open(moe_test::tiny_model());
  GgufWriter w(uint32_t(src->alignment()));
  for (const auto &kv : src->metadata())
    if (!set.count(kv.first)) w.set(kv.first, kv.second);
  for (const auto &kv : set) w.set(kv.first, kv.second);
  for (const auto &t : src->tensors())
    w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes);
  const std::string path = tmp_path(name + ".gguf");
  w.write_file(path);
  return path;
}

struct Loaded {
  moe_status status;
  std::string error;
  moe_model *model;
};

Loaded load(const std::string &path, const std::vector<std::string> &overrides = {}, int vocab_only = 0) {
  std::vector<const char *> ov;
  for (const auto &o : overrides) ov.push_back(o.c_str());
  moe_model_params p = moe_model_default_params();
  p.kv_overrides = ov.empty() ? nullptr : ov.data();
  p.n_kv_overrides = ov.size();
  p.vocab_only = vocab_only;
  Loaded r{MOE_STATUS_OK, "", nullptr};
  r.status = moe_model_load(path.c_str(), &p, &r.model);
  r.error = moe_last_error();
  return r;
}

// Decodes one token on a fresh CPU context: OK and finite logits, or the failing status.
moe_status decode_one(moe_model *m, bool *finite) {
  moe_context_params cp = moe_context_default_params();
  cp.n_ctx = 16;
  cp.n_threads = 1;
  moe_context *ctx = nullptr;
  moe_status s = moe_context_create(m, &cp, &ctx);
  if (s != MOE_STATUS_OK) return s;
  moe_batch *b = nullptr;
  REQUIRE(moe_batch_create(1, &b) == MOE_STATUS_OK);
  REQUIRE(moe_batch_add(b, 1, 0, 0, 1) == MOE_STATUS_OK);
  s = moe_decode(ctx, b);
  if (s == MOE_STATUS_OK) {
    const float *l = nullptr;
    int32_t n = 0;
    REQUIRE(moe_get_logits(ctx, -1, &l, &n) == MOE_STATUS_OK);
    *finite = true;
    for (int32_t i = 0; i < n; ++i) *finite = *finite && std::isfinite(l[i]);
  }
  moe_batch_free(b);
  moe_context_free(ctx);
  return s;
}

// Byte offset of tensor `name`'s type id in a GGUF file image (after its name, rank, dims).
size_t type_id_offset(const std::vector<uint8_t> &b, const std::string &name) {
  std::vector<uint8_t> pat(8);
  const uint64_t len = name.size();
  std::memcpy(pat.data(), &len, 8);
  pat.insert(pat.end(), name.begin(), name.end());
  auto it = std::search(b.begin(), b.end(), pat.begin(), pat.end());
  REQUIRE(it != b.end());
  size_t off = size_t(it - b.begin()) + pat.size();
  uint32_t n_dims;
  std::memcpy(&n_dims, b.data() + off, 4);
  return off + 4 + 8 * size_t(n_dims);
}

}  // namespace

TEST_CASE("reliability: hyperparameters that decode to NaN are rejected at load naming key and value", "[reliability][model]") {
  {  // the control: the tiny model loads and decodes finite logits
    Loaded ok = load(moe_test::tiny_model());
    REQUIRE(ok.status == MOE_STATUS_OK);
    bool finite = false;
    CHECK(decode_one(ok.model, &finite) == MOE_STATUS_OK);
    CHECK(finite);
    moe_model_free(ok.model);
  }
  struct Case { const char *key; const char *override_value; float file_value; };
  const Case cases[] = {
      {"qwen3moe.rope.freq_base", "float:0", 0.0f},
      {"qwen3moe.rope.freq_base", "float:-10000", -1e4f},
      {"qwen3moe.rope.freq_base", nullptr, NAN},
      {"qwen3moe.attention.layer_norm_rms_epsilon", "float:-1", -1.0f},
      {"qwen3moe.attention.layer_norm_rms_epsilon", "float:0", 0.0f},
      {"qwen3moe.attention.layer_norm_rms_epsilon", nullptr, INFINITY},
      {"qwen3moe.expert_weights_scale", "float:-2", -2.0f},
      {"qwen3moe.expert_weights_scale", nullptr, NAN},
      {"qwen3moe.rope.scaling.factor", "float:-4", -4.0f},
      {"qwen3moe.rope.scaling.factor", "float:1e-30", 1e-30f},
      {"qwen3moe.rope.scaling.factor", nullptr, INFINITY},
      {"qwen3moe.rope.scaling.yarn_log_multiplier", "float:-1", -1.0f},
      {"qwen3moe.rope.scaling.yarn_log_multiplier", nullptr, NAN},
  };
  int k = 0;
  for (const Case &c : cases) {
    INFO(c.key << " = " << c.file_value);
    // from the file
    const std::string path = tiny_with("hp" + std::to_string(k++), {{c.key, GgufValue::make_f32(c.file_value)}});
    Loaded f = load(path);
    CHECK(f.status == MOE_STATUS_INVALID_MODEL);
    CHECK(f.error.find(c.key) != std::string::npos);
    CHECK(f.model == nullptr);
    moe_model_free(f.model);
    std::remove(path.c_str());
    // from a metadata override
    if (c.override_value) {
      Loaded o = load(moe_test::tiny_model(), {std::string(c.key) + "=" + c.override_value});
      CHECK(o.status == MOE_STATUS_INVALID_MODEL);
      CHECK(o.error.find(c.key) != std::string::npos);
      CHECK(o.error.find(std::string(c.override_value).substr(6)) != std::string::npos);  // the value, as given
      moe_model_free(o.model);
    }
  }
  // Integer keys RoPE divides by or slices with.
  for (const char *ov : {"qwen3moe.rope.dimension_count=int:0", "qwen3moe.rope.dimension_count=int:7",
                         "qwen3moe.rope.dimension_count=int:64"}) {
    INFO(ov);
    Loaded o = load(moe_test::tiny_model(), {ov});
    CHECK(o.status == MOE_STATUS_INVALID_MODEL);
    CHECK(o.error.find("rope.dimension_count") != std::string::npos);
    moe_model_free(o.model);
  }
  // In-range values still load (0 = "no scaling factor", as in the reference).
  Loaded z = load(moe_test::tiny_model(), {"qwen3moe.rope.scaling.factor=float:0", "qwen3moe.expert_weights_scale=float:0"});
  CHECK(z.status == MOE_STATUS_OK);
  moe_model_free(z.model);
}

TEST_CASE("reliability: weight type ids outside the type table are rejected at load naming the tensor", "[reliability][model]") {
  const std::vector<uint8_t> good = read_all(moe_test::tiny_model());
  const std::string name = "blk.0.attn_q.weight";
  const size_t at = type_id_offset(good, name);
  struct Case { uint32_t id; moe_status want; };
  // 77 and 5 (a gap in the table) are no type at all; 24 (i8) is known but not implemented.
  for (const Case &c : {Case{77, MOE_STATUS_INVALID_GGUF}, Case{5, MOE_STATUS_INVALID_GGUF}, Case{0xFFFFFFFFu, MOE_STATUS_INVALID_GGUF},
                        Case{24, MOE_STATUS_UNSUPPORTED}}) {
    INFO("type id " << c.id);
    std::vector<uint8_t> bad = good;
    std::memcpy(bad.data() + at, &c.id, 4);
    const std::string path = tmp_path("type.gguf");
    write_all(path, bad);
    Loaded l = load(path);
    CHECK(l.status == c.want);
    CHECK(l.error.find(name) != std::string::npos);
    CHECK(l.model == nullptr);
    std::remove(path.c_str());
  }
}

TEST_CASE("reliability: a path that is not a regular file is refused at once", "[reliability][model]") {
  const std::string fifo = tmp_path("fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const std::string dir = tmp_path("dir");
  REQUIRE(mkdir(dir.c_str(), 0700) == 0);
  for (const std::string &p : {fifo, dir, std::string("/dev/null"), std::string("/dev/zero")}) {
    INFO(p);
    Loaded l{MOE_STATUS_OK, "", nullptr};
    // Opening a FIFO without a writer blocked moe_model_load forever before.
    std::promise<void> done;
    std::future<void> fut = done.get_future();
    std::thread t([&l, &done, p] {
      l = load(p);
      done.set_value();
    });
    const bool returned = fut.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    if (!returned) {  // release the blocked open (a writer appears, then goes) so the thread ends
      int fd = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) close(fd);
    }
    t.join();
    CHECK(returned);
    CHECK(l.status == MOE_STATUS_IO_ERROR);
    CHECK(l.error.find("not a regular file") != std::string::npos);
    CHECK(l.model == nullptr);
    moe_model_free(l.model);
  }
  unlink(fifo.c_str());
  rmdir(dir.c_str());
}

TEST_CASE("reliability: a model file truncated after load fails context creation instead of SIGBUS", "[reliability][model]") {
  const std::string path = tmp_path("trunc.gguf");
  write_all(path, read_all(moe_test::tiny_model()));
  Loaded l = load(path);  // mapped (the default)
  REQUIRE(l.status == MOE_STATUS_OK);
  auto f = GgufFile::open(path);
  const size_t data_start = f->data_offset();
  f.reset();
  REQUIRE(truncate(path.c_str(), off_t(data_start + 4096)) == 0);  // keeps the header, drops the weights
  moe_context_params cp = moe_context_default_params();
  cp.n_ctx = 16;
  cp.n_threads = 1;
  moe_context *ctx = nullptr;
  // The CPU weight copy reads the mapping: SIGBUS before, an IO_ERROR naming the file now.
  CHECK(moe_context_create(l.model, &cp, &ctx) == MOE_STATUS_IO_ERROR);
  CHECK(std::string(moe_last_error()).find(path) != std::string::npos);
  CHECK(ctx == nullptr);
  moe_model_free(l.model);
  std::remove(path.c_str());
}

TEST_CASE("reliability: after the CPU weight copy nothing reads the file mapping", "[reliability][model]") {
  const std::string path = tmp_path("trunc2.gguf");
  write_all(path, read_all(moe_test::tiny_model()));
  Loaded l = load(path);
  REQUIRE(l.status == MOE_STATUS_OK);
  moe_context_params cp = moe_context_default_params();
  cp.n_ctx = 16;
  cp.n_threads = 1;
  moe_context *ctx = nullptr;
  REQUIRE(moe_context_create(l.model, &cp, &ctx) == MOE_STATUS_OK);  // makes the copy
  REQUIRE(truncate(path.c_str(), 0) == 0);
  // Decodes, and a second context, read only the copy: no SIGBUS, same logits as before.
  moe_batch *b = nullptr;
  REQUIRE(moe_batch_create(1, &b) == MOE_STATUS_OK);
  REQUIRE(moe_batch_add(b, 5, 0, 0, 1) == MOE_STATUS_OK);
  CHECK(moe_decode(ctx, b) == MOE_STATUS_OK);
  moe_context *ctx2 = nullptr;
  CHECK(moe_context_create(l.model, &cp, &ctx2) == MOE_STATUS_OK);
  if (ctx2) CHECK(moe_decode(ctx2, b) == MOE_STATUS_OK);
  moe_batch_free(b);
  moe_context_free(ctx2);
  moe_context_free(ctx);
  moe_model_free(l.model);
  std::remove(path.c_str());
}

namespace {

// GGUF of one metadata key holding `n` empty arrays (12 bytes each on disk).
std::vector<uint8_t> nested_arrays_file(uint64_t n) {
  std::vector<uint8_t> b;
  auto put = [&](const void *p, size_t k) { b.insert(b.end(), static_cast<const uint8_t *>(p), static_cast<const uint8_t *>(p) + k); };
  const uint32_t magic = 0x46554747u, version = 3, arr = 9, u32 = 4;
  const uint64_t n_tensors = 0, n_kv = 1, zero = 0;
  put(&magic, 4), put(&version, 4), put(&n_tensors, 8), put(&n_kv, 8);
  gguf_append_string(b, "x.nested");
  put(&arr, 4), put(&arr, 4), put(&n, 8);
  for (uint64_t i = 0; i < n; ++i) put(&u32, 4), put(&zero, 8);
  return b;
}

// GGUF of one metadata key holding a numeric array of about `bytes` bytes (a legitimate file
// of the same size, for timing).
std::vector<uint8_t> numeric_array_file(size_t bytes) {
  GgufWriter w;
  std::vector<int32_t> v(bytes / 4, 7);
  w.set("x.numbers", GgufValue::make_i32_array(v));
  return w.write_memory();
}

double seconds_to_parse(const std::vector<uint8_t> &b) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      GgufFile::from_memory(b.data(), b.size());
    } catch (const Error &) {
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

using moe_rel::kSanitized;

// Parses `b` in a child process whose address space may grow by at most `limit` bytes: 0 =
// parsed, 1 = GgufError, 2 = other Error, 3 = out of memory (the limit was hit).
int parse_in_child_with_limit(const std::vector<uint8_t> &b, size_t limit) {
  pid_t pid = fork();
  if (pid == 0) {
    long pages = 0;
    if (FILE *st = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(st, "%ld", &pages) != 1) pages = 0;
      std::fclose(st);
    }
    struct rlimit rl;
    rl.rlim_cur = rl.rlim_max = rlim_t(size_t(pages) * size_t(sysconf(_SC_PAGESIZE)) + limit);
    setrlimit(RLIMIT_AS, &rl);
    int code = 0;
    try {
      GgufFile::from_memory(b.data(), b.size());
    } catch (const GgufError &) {
      code = 1;
    } catch (const Error &e) {
      code = e.code() == Status::OutOfMemory ? 3 : 2;
    } catch (const std::bad_alloc &) {
      code = 3;
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

}  // namespace

TEST_CASE("reliability: GGUF metadata built to exhaust memory is rejected at once", "[reliability][gguf]") {
  // 2M nested empty arrays: 24 MB on disk, 152 bytes each as values. The reader took 328 MB
  // and 2-8 s before rejecting the file; now the array's count alone rejects it.
  const std::vector<uint8_t> hostile = nested_arrays_file(2000000);
  try {
    GgufFile::from_memory(hostile.data(), hostile.size());
    FAIL("parsed");
  } catch (const GgufError &e) {
    CHECK(e.errc() == GgufErrc::MemoryLimit);
    CHECK(std::string(e.what()).find("x.nested") != std::string::npos);
  }
  // Fast: no slower than parsing a legitimate file of the same size (a flat array, copied once).
  const double t_hostile = seconds_to_parse(hostile), t_plain = seconds_to_parse(numeric_array_file(hostile.size()));
  INFO("hostile " << t_hostile << " s, plain " << t_plain << " s");
  CHECK(t_hostile < 2 * t_plain + 0.01);
  // Memory: what parsing may allocate is bounded by kMemPerFileByte x the file (+ slack). In
  // a child limited to that (plus the file's own copy), the hostile file is still rejected as
  // too large, not by running out of memory. (Address-space limits break sanitizers' shadow
  // memory, so only in plain builds.)
  if (!kSanitized) {
    const size_t limit = hostile.size() * (kMemPerFileByte + 1) + kMemSlack + (size_t(64) << 20);
    CHECK(parse_in_child_with_limit(hostile, limit) == 1);
    // fewer nested arrays, but still more than the budget allows only once materialised
    const std::vector<uint8_t> smaller = nested_arrays_file(300000);
    CHECK(parse_in_child_with_limit(smaller, smaller.size() * (kMemPerFileByte + 1) + kMemSlack + (size_t(64) << 20)) != 3);
  }
  // Nesting deeper than the limit is refused too.
  std::vector<uint8_t> deep;
  {
    auto put = [&](const void *p, size_t k) { deep.insert(deep.end(), static_cast<const uint8_t *>(p), static_cast<const uint8_t *>(p) + k); };
    const uint32_t magic = 0x46554747u, version = 3, arr = 9, u8 = 0;
    const uint64_t n_tensors = 0, n_kv = 1, one = 1, zero = 0;
    put(&magic, 4), put(&version, 4), put(&n_tensors, 8), put(&n_kv, 8);
    gguf_append_string(deep, "x.deep");
    put(&arr, 4);
    for (int d = 0; d < kMaxArrayDepth + 2; ++d) put(&arr, 4), put(&one, 8);
    put(&u8, 4), put(&zero, 8);
  }
  try {
    GgufFile::from_memory(deep.data(), deep.size());
    FAIL("parsed");
  } catch (const GgufError &e) {
    CHECK(std::string(e.what()).find("nested") != std::string::npos);
  }
}

TEST_CASE("reliability: hostile vocabularies are rejected at load and fast", "[reliability][tokenizer]") {
  // Millions of empty tokens: 8 bytes each on disk, ~110 bytes each once built (texts, pieces,
  // index). 1.8 s and 400 MB before the vocabulary was accepted; now refused before building.
  GgufWriter w;
  w.set("general.architecture", GgufValue::make_str("x"));
  w.set("tokenizer.ggml.model", GgufValue::make_str("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::make_str("gpt2"));
  w.set("tokenizer.ggml.tokens", GgufValue::make_str_array(std::vector<std::string>(3000000)));
  w.set("tokenizer.ggml.merges", GgufValue::make_str_array({}));
  const std::vector<uint8_t> b = w.write_memory();
  auto f = GgufFile::from_memory(b.data(), b.size());
  try {
    Vocab::from_gguf(*f);
    FAIL("accepted");
  } catch (const Error &e) {
    CHECK(e.code() == Status::InvalidVocab);
    CHECK(std::string(e.what()).find("3000000 tokens") != std::string::npos);
  }
  // SentencePiece merges by score: a NaN score has no place in that order.
  GgufWriter s;
  s.set("tokenizer.ggml.model", GgufValue::make_str("llama"));
  s.set("tokenizer.ggml.tokens", GgufValue::make_str_array({"<unk>", "a", "b", "ab"}));
  s.set("tokenizer.ggml.scores", GgufValue::make_f32_array({0.0f, -1.0f, -1.0f, NAN}));
  const std::vector<uint8_t> sb = s.write_memory();
  auto sf = GgufFile::from_memory(sb.data(), sb.size());
  try {
    Vocab::from_gguf(*sf);
    FAIL("accepted");
  } catch (const Error &e) {
    CHECK(e.code() == Status::InvalidVocab);
    CHECK(std::string(e.what()).find("'ab'") != std::string::npos);
  }
}
