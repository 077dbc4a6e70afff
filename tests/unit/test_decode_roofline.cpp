// The two halves of the decode roofline `moeinfer-cli bench` reports: the weight bytes one
// token reads, and each device's measured read rate.
#include <catch2/catch.hpp>

#include "backends/backend.h"
#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "support/device_graph.h"
#include "support/tiny_model.h"

using namespace moe;

TEST_CASE("model: decode_read_bytes counts n_expert_used of n_expert expert bytes and one embedding row", "[model]") {
  auto model = Model::load(moe_test::tiny_model("q4_k_m"), ModelLoadParams{});
  const Hparams &hp = model->hparams();
  REQUIRE(hp.n_expert > hp.n_expert_used);
  // Expected from totals: all bytes, minus the experts' unread share, minus all embedding
  // rows but one (the tiny model has its own output.weight, so the embedding is not the head).
  double experts = 0, embd = 0, embd_rows = 0;
  bool has_output = false;
  for (const auto &t : model->gguf().tensors()) {
    if (t.n_dims == 3 && t.ne[2] == int64_t(hp.n_expert)) experts += double(t.nbytes);
    if (t.name == "token_embd.weight") { embd = double(t.nbytes); embd_rows = double(t.ne[1]); }
    if (t.name == "output.weight") has_output = true;
  }
  REQUIRE(has_output);
  REQUIRE(experts > 0);
  const double want = double(model->weight_bytes()) - experts * (1.0 - double(hp.n_expert_used) / hp.n_expert) - embd * (1.0 - 1.0 / embd_rows);
  CHECK(std::abs(double(model->decode_read_bytes()) - want) <= 2.0);
  CHECK(model->decode_read_bytes() < model->weight_bytes());
}

TEST_CASE("backends: measured read bandwidth is positive and cached", "[backend]") {
  BackendRegistry reg;
  const double cpu = reg.cpu()->read_bandwidth();
  CHECK(cpu > 1e8);  // even a slow board streams more than 100 MB/s
  CHECK(reg.cpu()->read_bandwidth() == cpu);  // measured once
  if (Backend *gpu = moe_test::gpu_or_skip(reg)) {
    const double g = gpu->read_bandwidth();
    INFO("GPU read bandwidth " << g / 1e9 << " GB/s, CPU " << cpu / 1e9 << " GB/s");
    CHECK(g > 1e10);
    CHECK(gpu->read_bandwidth() == g);
  }
}
