// Consumer check through the header-only C++ API: version, devices, then (given a model)
// a short sampled generation with the async API.
#include <chrono>
#include <cstdio>

#include <moeinfer/moeinfer.hpp>

int main(int argc, char **argv) try {
  std::printf("moeinfer %s, ABI %u\n", moeinfer::version_string(), moeinfer::abi_version());
  for (const moe_device_info &d : moeinfer::devices()) std::printf("device %s: %s\n", d.id, d.name);
  if (argc < 2) return 0;
  auto model = moeinfer::Model::load(argv[1]);
  auto ctx = moeinfer::Context::create(model);
  auto prompt = model.tokenize("Hello");
  auto batch = moeinfer::Batch::create(prompt.size() + 1);
  batch.add_sequence(prompt, 0, 0, true);
  auto sampler = moeinfer::Sampler::create(42);
  sampler.add_top_k(20);
  sampler.add_temperature(0.8f);
  sampler.add_dist();
  auto pos = static_cast<int32_t>(prompt.size());
  std::string text;
  for (int i = 0; i < 8; ++i) {
    ctx.submit(batch);
    while (!ctx.wait(std::chrono::milliseconds(5))) {
    }
    int32_t tok = sampler.sample(ctx);
    text += model.token_to_piece(tok);
    batch.clear();
    batch.add(tok, pos++, 0, true);
  }
  std::printf("generated %zu bytes\n", text.size());
  return 0;
} catch (const moeinfer::Error &e) {
  std::fprintf(stderr, "moeinfer error %d: %s\n", static_cast<int>(e.status()), e.what());
  return 1;
}
