// qwen3next / qwen35moe (hybrid gated DeltaNet + attention) through the engine: sequence
// operations on models with a recurrent state (copy and continue both, remove a suffix or a
// whole sequence, positions that do not follow, two sequences in one batch, a failed decode),
// each compared with fresh single-sequence runs, and load-time validation of the ssm.* keys.
// Uses the conformance models (../shared/conformance); skipped with a warning without them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/engine.h"

using namespace moe;

namespace {

std::string model_path(const char *name) {
  const std::string p = std::string(MOEINFER_CONFORMANCE_DIR) + "/models/" + name;
  return std::filesystem::exists(p) ? p : std::string();
}

std::unique_ptr<Context> make_ctx(const Model &m, uint32_t n_seq = 1) {
  ContextParams cp;
  cp.n_ctx = 128;
  cp.n_threads = 2;
  cp.n_seq_max = n_seq;
  cp.kv_type = KvType::F32;
  cp.device = "cpu";
  return Context::create(m, cp);
}

using Logits = std::vector<float>;

// Decodes toks of seq from position p0 as one batch; returns the last token's logits.
Logits feed(Context &c, const std::vector<int32_t> &toks, int32_t seq, int32_t p0) {
  std::vector<BatchToken> b;
  for (size_t i = 0; i < toks.size(); ++i) b.push_back({toks[i], p0 + static_cast<int32_t>(i), seq, i + 1 == toks.size()});
  c.decode(b.data(), b.size());
  const float *l = c.logits(-1);
  return Logits(l, l + c.n_vocab());
}

// Prompt as one batch, then each continuation token alone: the logits after each.
std::vector<Logits> fresh(const Model &m, const std::vector<int32_t> &prompt, const std::vector<int32_t> &cont) {
  auto c = make_ctx(m);
  std::vector<Logits> out{feed(*c, prompt, 0, 0)};
  for (size_t i = 0; i < cont.size(); ++i) out.push_back(feed(*c, {cont[i]}, 0, static_cast<int32_t>(prompt.size() + i)));
  return out;
}

double max_diff(const Logits &a, const Logits &b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

const std::vector<int32_t> kPrompt = {151644, 872, 198, 7985, 264, 6386, 38242, 911};
const std::vector<int32_t> kContA = {279, 9396, 13}, kContB = {1024, 55, 7};
constexpr double kSame = 1e-3;  // same arithmetic up to the attention's cell order

template <typename F> void for_each_hybrid(F &&f) {
  for (const char *name : {"qwen3next-f16.gguf", "qwen35moe-f16.gguf"}) {
    const std::string p = model_path(name);
    if (p.empty()) {
      WARN("conformance model " << name << " not found; skipped");
      continue;
    }
    INFO(name);
    ModelLoadParams mp;
    mp.devices = {"cpu"};
    f(*Model::load(p, mp));
  }
}

}  // namespace

TEST_CASE("hybrid models: a copied sequence continues like a fresh run, and so does its source", "[qwen3next]") {
  for_each_hybrid([](const Model &m) {
    const auto ref_a = fresh(m, kPrompt, kContA), ref_b = fresh(m, kPrompt, kContB);
    auto c = make_ctx(m, 2);
    CHECK(max_diff(feed(*c, kPrompt, 0, 0), ref_a[0]) < kSame);
    c->kv_seq_cp(0, 1, -1, -1);
    const int32_t n = static_cast<int32_t>(kPrompt.size());
    for (size_t i = 0; i < kContA.size(); ++i) {  // alternate: each step must see only its own state
      CHECK(max_diff(feed(*c, {kContB[i]}, 1, n + static_cast<int32_t>(i)), ref_b[i + 1]) < kSame);
      CHECK(max_diff(feed(*c, {kContA[i]}, 0, n + static_cast<int32_t>(i)), ref_a[i + 1]) < kSame);
    }
    // A partial copy, or a copy over a sequence that holds tokens, would mix states: refused.
    auto partial = make_ctx(m, 2);
    feed(*partial, kPrompt, 0, 0);
    try {
      partial->kv_seq_cp(0, 1, 0, 3);
      FAIL("partial copy accepted");
    } catch (const Error &e) {
      CHECK(e.code() == Status::Unsupported);
    }
    CHECK_THROWS_AS(c->kv_seq_cp(0, 1, -1, -1), Error);
  });
}

TEST_CASE("hybrid models: two sequences in one batch match each decoded alone", "[qwen3next]") {
  for_each_hybrid([](const Model &m) {
    const std::vector<int32_t> p1 = {9707, 11, 1879, 0, 576}, p2 = {785, 3974, 13876, 38835, 34208, 916, 279};
    const Logits a = fresh(m, p1, {})[0], b = fresh(m, p2, {})[0];
    auto c = make_ctx(m, 2);
    std::vector<BatchToken> batch;
    for (size_t i = 0; i < std::max(p1.size(), p2.size()); ++i) {  // interleaved
      if (i < p2.size()) batch.push_back({p2[i], static_cast<int32_t>(i), 1, i + 1 == p2.size()});
      if (i < p1.size()) batch.push_back({p1[i], static_cast<int32_t>(i), 0, i + 1 == p1.size()});
    }
    c->decode(batch.data(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!batch[i].logits) continue;
      const float *l = c->logits(static_cast<int32_t>(i));
      // 12-token products sum in another order than 5- or 7-token ones (~5e-5 of logits of
      // ~150); a state shared or mixed between the sequences moves them by whole units.
      CHECK(max_diff(Logits(l, l + c->n_vocab()), batch[i].seq_id == 0 ? a : b) < 0.05);
    }
  });
}

TEST_CASE("hybrid models: removing a suffix is refused and changes nothing; removing the whole sequence resets it", "[qwen3next]") {
  for_each_hybrid([](const Model &m) {
    const auto full = fresh(m, kPrompt, kContA);
    const std::vector<int32_t> shorter(kPrompt.begin(), kPrompt.begin() + 4);
    const auto short_ref = fresh(m, shorter, {});
    auto c = make_ctx(m);
    feed(*c, kPrompt, 0, 0);
    try {
      c->kv_seq_rm(0, 4, -1);
      FAIL("suffix removal accepted");
    } catch (const Error &e) {
      CHECK(e.code() == Status::Unsupported);
      CHECK(std::string(e.what()).find("recurrent") != std::string::npos);
    }
    CHECK(c->kv_seq_pos_max(0) == static_cast<int32_t>(kPrompt.size()) - 1);
    CHECK(c->kv_seq_rm(0, 100, -1));  // nothing there: a no-op
    const int32_t n = static_cast<int32_t>(kPrompt.size());
    CHECK(max_diff(feed(*c, {kContA[0]}, 0, n), full[1]) < kSame);
    // A position that does not follow the sequence's last one cannot enter a recurrent state.
    try {
      feed(*c, {kContA[1]}, 0, 3);
      FAIL("rewritten position accepted");
    } catch (const Error &e) {
      CHECK(e.code() == Status::InvalidArgument);
    }
    CHECK(max_diff(feed(*c, {kContA[1]}, 0, n + 1), full[2]) < kSame);  // the failed call changed nothing
    CHECK(c->kv_seq_rm(0, -1, -1));
    CHECK(c->kv_used_cells() == 0);
    CHECK(max_diff(feed(*c, shorter, 0, 0), short_ref[0]) < kSame);
    c->kv_clear();
    CHECK(max_diff(feed(*c, shorter, 0, 0), short_ref[0]) < kSame);
  });
}

TEST_CASE("hybrid models: an aborted decode leaves the recurrent state as it was", "[qwen3next]") {
  for_each_hybrid([](const Model &m) {
    const auto full = fresh(m, kPrompt, kContA);
    auto c = make_ctx(m);
    feed(*c, kPrompt, 0, 0);
    int polls = 0;
    // Stop after a few nodes: DeltaNet layers before the stop have already advanced their state.
    c->set_abort_callback([](void *p) { return ++*static_cast<int *>(p) > 40; }, &polls);
    try {
      feed(*c, {kContB[0]}, 0, static_cast<int32_t>(kPrompt.size()));
      FAIL("abort ignored");
    } catch (const Error &e) {
      CHECK(e.code() == Status::Aborted);
    }
    c->set_abort_callback(nullptr, nullptr);
    CHECK(max_diff(feed(*c, {kContA[0]}, 0, static_cast<int32_t>(kPrompt.size())), full[1]) < kSame);
  });
}

TEST_CASE("hybrid models: inconsistent ssm hparams are refused at load naming the key or tensor", "[qwen3next]") {
  const std::string p = model_path("qwen3next-f16.gguf");
  if (p.empty()) {
    WARN("qwen3next-f16.gguf not found; skipped");
    return;
  }
  auto load_msg = [&](const std::string &ov) {
    ModelLoadParams mp;
    mp.devices = {"cpu"};
    mp.kv_overrides = {ov};
    try {
      Model::load(p, mp);
    } catch (const Error &e) {
      CHECK(e.code() == Status::InvalidModel);
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  CHECK(load_msg("qwen3next.ssm.time_step_rank=u32:3").find("ssm.group_count") != std::string::npos);
  CHECK(load_msg("qwen3next.ssm.inner_size=u32:60").find("ssm.inner_size") != std::string::npos);
  CHECK(load_msg("qwen3next.full_attention_interval=u32:0").find("full_attention_interval") != std::string::npos);
  CHECK(load_msg("qwen3next.ssm.conv_kernel=u32:0").find("conv_kernel") != std::string::npos);
  // Consistent keys, but the tensors were made for other sizes: the tensor is named.
  CHECK(load_msg("qwen3next.full_attention_interval=u32:2").find("blk.1.attn_q.weight") != std::string::npos);
}
