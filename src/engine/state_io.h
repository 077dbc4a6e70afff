// Saving one sequence's state (its KV cells and, on recurrent layers, its recurrent state)
// and restoring it into any context of the same model.
//
//   std::vector<uint8_t> blob = save_seq_state(ctx, /*seq*/ 0);
//   restore_seq_state(other_ctx, /*seq*/ 0, blob.data(), blob.size());  // then decode on
//
// Format (version 1, host byte order, little-endian machines):
//   "MOESTATE" | u32 version | u64 model fingerprint | u32 KV row type | u32 n_layer |
//   u32 n_tokens | i32 pos[n_tokens] |
//   per layer: u64 K row bytes, u64 V row bytes, then K rows, V rows (n_tokens each) |
//   section "RECR" u32 version 1: per layer u64 floats + the committed recurrent state |
//   u64 FNV-1a of everything before.
// The fingerprint hashes the hyperparameters and every tensor's name, type and shape, so a
// state only loads into a model of the same architecture and shapes. Restoring validates the
// whole blob (magic, version, checksum, fingerprint, sizes, room in the cache) before it
// changes anything; any failure throws Error(InvalidArgument / ContextFull / Unsupported)
// with the reason and leaves the context as it was. Logits are not part of the state: decode
// the next token after a restore.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace moe {

class Context;
class Model;

uint64_t model_fingerprint(const Model &model);

std::vector<uint8_t> save_seq_state(const Context &ctx, int32_t seq);
void restore_seq_state(Context &ctx, int32_t seq, const uint8_t *data, size_t size);

}  // namespace moe
