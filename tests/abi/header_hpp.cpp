// Compile check of moeinfer.hpp (CTest abi.header_hpp*): -std=c++17 -Wall -Wextra -pedantic
// -Werror, once with exceptions and once with -fno-exceptions -DMOEINFER_NO_EXCEPTIONS.
#include "moeinfer/moeinfer.hpp"

int moe_hpp_check();
int moe_hpp_check() {
  using namespace std::chrono_literals;
#ifdef MOEINFER_NO_EXCEPTIONS
  auto m = moeinfer::Model::load("x.gguf");
  if (!m) return static_cast<int>(m.status());
  moeinfer::Model model = std::move(m).value();
  auto c = moeinfer::Context::create(model);
  if (!c) return 1;
  moeinfer::Context ctx = std::move(c).value();
  auto toks = model.tokenize("hello");
  if (!toks) return 2;
  auto b = moeinfer::Batch::create(toks.value().size());
  if (!b) return 3;
  moeinfer::Batch batch = std::move(b).value();
  if (!batch.add_sequence(toks.value(), 0, 0, true)) return 4;
  if (!ctx.submit(batch)) return 5;
  auto w = ctx.wait(2ms);
  if (!w) return 6;
  auto s = moeinfer::Sampler::create(1);
  if (!s) return 7;
  moeinfer::Sampler sampler = std::move(s).value();
  (void)sampler.add_top_k(10);
  (void)sampler.add_dist();
  auto t = sampler.sample(ctx);
  auto piece = model.token_to_piece(t.value());
  auto lg = ctx.logits(-1);
  auto mp = moeinfer::Model::default_params();
  mp.fit = 1;
  auto plan = moeinfer::Model::fit("x.gguf", mp);
  if (!plan || plan.value().n_devices == 0) return 9;
  return piece.ok() && lg.ok() ? 0 : 8;
#else
  auto model = moeinfer::Model::load("x.gguf");
  auto ctx = moeinfer::Context::create(model);
  auto toks = model.tokenize("hello");
  auto batch = moeinfer::Batch::create(toks.size());
  batch.add_sequence(toks, 0, 0, true);
  ctx.submit(batch);
  while (!ctx.wait(2ms)) {
  }
  auto sampler = moeinfer::Sampler::create(1);
  sampler.add_top_k(10);
  sampler.add_dist();
  int32_t t = sampler.sample(ctx);
  std::string piece = model.token_to_piece(t);
  moeinfer::LogitsView lg = ctx.logits(-1);
  auto devs = moeinfer::devices();
  auto mp = moeinfer::Model::default_params();
  mp.cpu_moe = 1;
  moe_fit_plan plan = moeinfer::Model::fit("x.gguf", mp);
  try {
    ctx.kv_seq_rm(0, 0, -1);
  } catch (const moeinfer::Error &e) {
    return static_cast<int>(e.status());
  }
  return static_cast<int>(piece.size() + devs.size() + plan.n_devices) + (lg.data ? 1 : 0);
#endif
}
