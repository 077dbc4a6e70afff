// Architecture table: each architecture is one file under src/model/arch/ defining an
// ArchSpec (tensor checks, KV layout, graph builder) plus one line in arch_table.cpp.
// See docs/architectures.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "graph/ir.h"
#include "kv/kv_cache.h"
#include "model/model_impl.h"

namespace moe {

struct GraphBuildParams {
  int64_t n_tokens = 1;    // tokens in the ubatch
  int64_t n_outputs = 1;   // rows of logits to produce (input "out_ids" selects them)
  uint32_t n_cells = 0;    // KV cells (attention scratch bound)
  KvType kv_type = KvType::F16;
};

struct ArchSpec {
  const char *name;  // general.architecture
  // Check every tensor the graph will use (names, shapes); throw InvalidModel naming it.
  void (*validate)(const Model::Impl &m);
  // K/V values per token for each layer's cache.
  std::vector<KvLayerDims> (*kv_layout)(const Hparams &hp);
  // Inputs: "tokens" I32 [n_tokens], "pos" I32 [n_tokens], "out_ids" I32 [n_outputs].
  // Output: "logits" F32 [n_vocab, n_outputs]. Node::segment = layer index (+1; 0 = embedding).
  void (*build)(const Model::Impl &m, const GraphBuildParams &p, Graph &g);
};

const ArchSpec *find_arch(const std::string &name);
std::string supported_archs();  // "qwen3moe, ..." for error messages

extern const ArchSpec kArchQwen3Moe;
extern const ArchSpec kArchDeepseek2;
extern const ArchSpec kArchGptOss;
extern const ArchSpec kArchQwen3Next;
extern const ArchSpec kArchQwen35Moe;

}  // namespace moe
