// Split GGUF models (the reference engine's split.no / split.count / split.tensors.count keys
// and "-%05d-of-%05d.gguf" names): a split model decodes bit for bit like the same model in
// one file, every tensor's data comes from its own part, and parts that do not form one model
// are refused with a status and a message naming the file.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/synth/synth_model.h"
#include "moeinfer/moeinfer.h"
#include "support/temp_files.h"

using namespace moe;
using moe_test::remove_at_exit;
using moe_test::temp_name;
using moe_test::temp_path;

namespace {

SynthSpec tiny_spec(uint32_t n_layer = 0) {
  SynthSpec s;
  s.preset = "tiny";
  s.type_mix = "q8_0";
  s.seed = 11;
  s.n_layer = n_layer;
  return s;
}

// The writer's rule, restated: a new part when the next tensor's padded data would take the
// current part past max (a part always takes at least one tensor).
size_t expected_parts(const std::vector<SynthTensorInfo> &plan, uint64_t max) {
  size_t parts = 1;
  uint64_t cur = 0;
  for (const auto &t : plan) {
    const uint64_t b = (t.nbytes + 31) / 32 * 32;
    if (cur > 0 && cur + b > max) { ++parts; cur = 0; }
    cur += b;
  }
  return parts;
}

// The smallest part size that makes exactly n parts.
uint64_t max_size_for(const std::vector<SynthTensorInfo> &plan, size_t n) {
  uint64_t lo = 1, hi = 0;
  for (const auto &t : plan) hi += (t.nbytes + 31) / 32 * 32;
  while (lo < hi) {  // expected_parts falls as max grows
    const uint64_t mid = lo + (hi - lo) / 2;
    if (expected_parts(plan, mid) <= n) hi = mid; else lo = mid + 1;
  }
  REQUIRE(expected_parts(plan, lo) == n);
  return lo;
}

std::vector<std::string> write_model(const SynthSpec &spec, const std::string &name, uint64_t split_max = 0) {
  SynthSpec s = spec;
  s.split_max_bytes = split_max;
  const std::vector<std::string> files = write_synthetic_model(s, temp_name(name));
  for (const auto &f : files) remove_at_exit(f);
  return files;
}

// Greedy decode: the logits of a 6-token prompt and of 4 generated tokens, concatenated.
std::vector<float> greedy_logits(const std::string &path, bool use_mmap, std::vector<int32_t> *tokens) {
  ModelLoadParams mp;
  mp.use_mmap = use_mmap;
  auto model = Model::load(path, mp);
  ContextParams cp;
  cp.n_ctx = 64;
  cp.n_threads = 1;
  cp.device = "cpu";
  auto ctx = Context::create(*model, cp);
  const int32_t nv = model->n_vocab();
  std::vector<BatchToken> prompt;
  const int32_t ids[] = {500, 1, 300, 42, 77, 5};
  for (int32_t i = 0; i < 6; ++i) prompt.push_back({ids[i], i, 0, i == 5});
  ctx->decode(prompt.data(), prompt.size());
  std::vector<float> all;
  for (int step = 0; step < 4; ++step) {
    const float *l = ctx->logits(-1);
    all.insert(all.end(), l, l + nv);
    int32_t best = 0;
    for (int32_t v = 1; v < nv; ++v)
      if (l[v] > l[best]) best = v;
    tokens->push_back(best);
    BatchToken t{best, 6 + step, 0, true};
    ctx->decode(&t, 1);
  }
  return all;
}

// Opening `path` (a GgufFile, or a Model when load_model) fails with `status` and a message
// containing every one of `parts`.
void expect_open_error(const std::string &path, Status status, const std::vector<std::string> &parts, bool load_model = false) {
  try {
    if (load_model) Model::load(path, ModelLoadParams{});
    else GgufFile::open(path);
    FAIL("opened " << path);
  } catch (const Error &e) {
    INFO(e.what());
    CHECK(e.code() == status);
    for (const auto &p : parts) CHECK(std::string(e.what()).find(p) != std::string::npos);
  }
}

// A hand-made part: split keys as given and one 4-float tensor per name.
void write_part(const std::string &path, int no, int count, int tensors_total, const std::vector<std::string> &names) {
  GgufWriter w;
  w.set("split.no", GgufValue::make_u16(static_cast<uint16_t>(no)));
  w.set("split.count", GgufValue::make_u16(static_cast<uint16_t>(count)));
  w.set("split.tensors.count", GgufValue::make_i32(tensors_total));
  const float data[4] = {1, 2, 3, 4};
  for (const auto &n : names) w.add_tensor(n, DType::F32, {4}, data, sizeof data);
  w.write_file(path);
  remove_at_exit(path);
}

void copy_file(const std::string &from, const std::string &to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
}

}  // namespace

TEST_CASE("gguf split: a model split in 2 and 3 parts decodes bit for bit like the single file", "[gguf][split]") {
  const SynthSpec spec = tiny_spec();
  const auto plan = synthetic_model_plan(spec);
  const std::string whole = write_model(spec, "split-whole.gguf").at(0);
  std::vector<int32_t> want_tokens;
  const std::vector<float> want = greedy_logits(whole, true, &want_tokens);
  auto whole_file = GgufFile::open(whole);
  for (size_t n : {size_t(2), size_t(3)}) {
    INFO(n << " parts");
    const uint64_t max = max_size_for(plan, n);
    const auto files = write_model(spec, "split" + std::to_string(n) + ".gguf", max);
    REQUIRE(files.size() == n);
    CHECK(files[0] == temp_name("split" + std::to_string(n)) + "-00001-of-0000" + std::to_string(n) + ".gguf");

    auto f = GgufFile::open(files[0]);
    REQUIRE(f->n_parts() == n);
    REQUIRE(f->tensors().size() == whole_file->tensors().size());
    for (size_t i = 0; i < n; ++i) {
      const GgufFile &p = f->part(i);
      CHECK(p.path() == files[i]);
      CHECK(p.get_u32("split.no") == i);
      CHECK(p.find("split.no")->type == GgufType::U16);
      CHECK(p.find("split.count")->type == GgufType::U16);
      CHECK(p.find("split.tensors.count")->type == GgufType::I32);
      CHECK(p.get_i64("split.tensors.count") == static_cast<int64_t>(plan.size()));
      // The first part carries the model's metadata, the others the split keys only.
      CHECK(p.metadata().size() == (i == 0 ? whole_file->metadata().size() + 3 : 3));
    }
    uint64_t part_data[3] = {0, 0, 0};
    for (const GgufTensorInfo &t : f->tensors()) {
      INFO(t.name);
      const GgufFile &p = f->part(t.part);
      const uint8_t *lo = p.data_section(), *hi = lo + (p.file_size() - p.data_offset());
      CHECK((t.data >= lo && t.data + t.nbytes <= hi));  // read from its own part's mapping
      CHECK(p.tensor(t.name) != nullptr);
      const GgufTensorInfo *w = whole_file->tensor(t.name);
      REQUIRE(w != nullptr);
      CHECK(std::memcmp(w->data, t.data, t.nbytes) == 0);
      part_data[t.part] += (t.nbytes + 31) / 32 * 32;
    }
    for (size_t i = 0; i < n; ++i) CHECK(part_data[i] <= max);

    for (bool mmap : {true, false}) {
      INFO("use_mmap " << mmap);
      std::vector<int32_t> tokens;
      const std::vector<float> got = greedy_logits(files[0], mmap, &tokens);
      CHECK(tokens == want_tokens);
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("gguf split: parts that do not form one model are refused, naming the file", "[gguf][split]") {
  const SynthSpec spec = tiny_spec();
  const auto plan = synthetic_model_plan(spec);
  const auto files = write_model(spec, "split-err.gguf", max_size_for(plan, 3));
  REQUIRE(files.size() == 3);

  SECTION("a later part loaded directly names the first part") {
    expect_open_error(files[1], Status::InvalidModel, {files[1], "part 2 of 3", files[0]}, true);
    moe_model *m = nullptr;  // the same through the C ABI
    CHECK(moe_model_load(files[1].c_str(), nullptr, &m) == MOE_STATUS_INVALID_MODEL);
    CHECK(m == nullptr);
    CHECK(std::string(moe_last_error()).find(files[0]) != std::string::npos);
    GgufOpenOptions one;
    one.single_part = true;
    CHECK(GgufFile::open(files[1], one)->n_parts() == 1);  // the part alone still opens
  }
  SECTION("a missing part") {
    const std::string kept = files[2] + ".kept";
    REQUIRE(std::rename(files[2].c_str(), kept.c_str()) == 0);
    expect_open_error(files[0], Status::IoError, {files[2], "part 3 of 3"}, true);
    moe_model *m = nullptr;
    CHECK(moe_model_load(files[0].c_str(), nullptr, &m) == MOE_STATUS_IO_ERROR);
    CHECK(std::string(moe_last_error()).find(files[2]) != std::string::npos);
    REQUIRE(std::rename(kept.c_str(), files[2].c_str()) == 0);
    CHECK(Model::load(files[0], ModelLoadParams{})->n_vocab() > 0);  // whole again: loads
  }
  SECTION("a malformed part is checked like a single file") {
    const std::string bad = temp_path("split-bad-00001-of-00003.gguf"), bad2 = temp_path("split-bad-00002-of-00003.gguf");
    copy_file(files[0], bad);
    std::ofstream(bad2, std::ios::binary) << "GGUF";  // ends after the magic
    expect_open_error(bad, Status::InvalidGguf, {bad2, "file ends while reading version"}, true);
  }
  SECTION("the first part renamed: its parts cannot be found") {
    const std::string renamed = temp_path("split-renamed.gguf");
    copy_file(files[0], renamed);
    expect_open_error(renamed, Status::InvalidModel, {renamed, "-00001-of-00003.gguf"}, true);
  }
  SECTION("a part of another model with the same number of parts") {
    const auto other = write_model(tiny_spec(1), "split-other.gguf", max_size_for(synthetic_model_plan(tiny_spec(1)), 3));
    REQUIRE(other.size() == 3);
    const std::string mixed = temp_path("split-mixed-00001-of-00003.gguf");
    copy_file(files[0], mixed);
    copy_file(files[1], temp_path("split-mixed-00002-of-00003.gguf"));
    copy_file(other[2], temp_path("split-mixed-00003-of-00003.gguf"));
    expect_open_error(mixed, Status::InvalidModel, {temp_name("split-mixed-00003-of-00003.gguf"), "another model", "split.tensors.count"}, true);
  }
}

TEST_CASE("gguf split: split keys that disagree are refused, naming the part", "[gguf][split]") {
  const std::string p1 = temp_name("split-keys-00001-of-00002.gguf"), p2 = temp_name("split-keys-00002-of-00002.gguf");
  write_part(p1, 0, 2, 3, {"a", "b"});
  SECTION("consistent parts open with every tensor") {
    write_part(p2, 1, 2, 3, {"c"});
    auto f = GgufFile::open(p1);
    REQUIRE(f->tensors().size() == 3);
    CHECK(f->tensor("c")->part == 1);
    CHECK(f->tensor("a")->part == 0);
    float c[4];
    std::memcpy(c, f->tensor("c")->data, sizeof c);
    CHECK((c[0] == 1 && c[3] == 4));
  }
  SECTION("a tensor in two parts") {
    write_part(p2, 1, 2, 3, {"b"});
    expect_open_error(p1, Status::InvalidModel, {"'b'", p1, p2});
  }
  SECTION("a part whose split.count differs") {
    write_part(p2, 1, 3, 3, {"c"});
    expect_open_error(p1, Status::InvalidModel, {p2, "split.count = 3", "says 2"});
  }
  SECTION("a part whose split.no is not its place") {
    write_part(p2, 0, 2, 3, {"c"});
    expect_open_error(p1, Status::InvalidModel, {p2, "split.no = 0"});
  }
  SECTION("fewer tensors than split.tensors.count") {
    write_part(p1, 0, 2, 4, {"a", "b"});
    write_part(p2, 1, 2, 4, {"c"});
    expect_open_error(p1, Status::InvalidModel, {p1, "4 tensors", "hold 3"});
  }
  SECTION("a single file without split keys is a part of nothing") {
    GgufWriter w;
    const float d[4] = {0, 0, 0, 0};
    w.add_tensor("c", DType::F32, {4}, d, sizeof d);
    w.write_file(p2);
    expect_open_error(p1, Status::InvalidModel, {p2, "not a part of a split model"});
  }
  std::remove(p2.c_str());
}
