// C ABI: saving and restoring one sequence's state (engine/state_io.h).
#include <cstdio>
#include <memory>
#include <vector>

#include "c_api_internal.h"
#include "engine/state_io.h"

using namespace moe_c;

namespace {

struct FileCloser {
  void operator()(std::FILE *f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

extern "C" {

MOE_API moe_status moe_state_seq_save(moe_context *ctx, int32_t seq, void *buf, size_t buf_size, size_t *out_size) {
  return guard([&] {
    MOE_CHECK_ARG(out_size, "moe_state_seq_save: out_size is NULL");
    ContextUse use;
    const moe_status s = use.enter(ctx, "moe_state_seq_save");
    if (s != MOE_STATUS_OK) return s;
    const std::vector<uint8_t> blob = moe::save_seq_state(*ctx->ctx, seq);
    *out_size = blob.size();
    if (!buf || buf_size < blob.size())
      return fail(MOE_STATUS_BUFFER_TOO_SMALL, "moe_state_seq_save: buffer of %zu bytes too small: %zu needed",
                  buf_size, blob.size());
    std::memcpy(buf, blob.data(), blob.size());
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_state_seq_load(moe_context *ctx, int32_t seq, const void *data, size_t size) {
  return guard([&] {
    MOE_CHECK_ARG(data || size == 0, "moe_state_seq_load: data is NULL");
    ContextUse use;
    const moe_status s = use.enter(ctx, "moe_state_seq_load");
    if (s != MOE_STATUS_OK) return s;
    moe::restore_seq_state(*ctx->ctx, seq, static_cast<const uint8_t *>(data), size);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_state_seq_save_file(moe_context *ctx, int32_t seq, const char *path) {
  return guard([&] {
    MOE_CHECK_ARG(path, "moe_state_seq_save_file: path is NULL");
    ContextUse use;
    const moe_status s = use.enter(ctx, "moe_state_seq_save_file");
    if (s != MOE_STATUS_OK) return s;
    const std::vector<uint8_t> blob = moe::save_seq_state(*ctx->ctx, seq);
    File f(std::fopen(path, "wb"));
    if (!f) return fail(MOE_STATUS_IO_ERROR, "moe_state_seq_save_file: cannot create '%s'", path);
    if (std::fwrite(blob.data(), 1, blob.size(), f.get()) != blob.size() || std::fflush(f.get()) != 0)
      return fail(MOE_STATUS_IO_ERROR, "moe_state_seq_save_file: writing '%s' failed", path);
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_state_seq_load_file(moe_context *ctx, int32_t seq, const char *path) {
  return guard([&] {
    MOE_CHECK_ARG(path, "moe_state_seq_load_file: path is NULL");
    ContextUse use;
    const moe_status s = use.enter(ctx, "moe_state_seq_load_file");
    if (s != MOE_STATUS_OK) return s;
    File f(std::fopen(path, "rb"));
    if (!f) return fail(MOE_STATUS_IO_ERROR, "moe_state_seq_load_file: cannot open '%s'", path);
    std::vector<uint8_t> blob;
    uint8_t chunk[1 << 16];
    size_t got;
    while ((got = std::fread(chunk, 1, sizeof chunk, f.get())) > 0) blob.insert(blob.end(), chunk, chunk + got);
    if (std::ferror(f.get())) return fail(MOE_STATUS_IO_ERROR, "moe_state_seq_load_file: reading '%s' failed", path);
    moe::restore_seq_state(*ctx->ctx, seq, blob.data(), blob.size());
    return MOE_STATUS_OK;
  });
}

}  // extern "C"
