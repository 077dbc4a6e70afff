#include "engine/weight_upload.h"

#include "backends/backend.h"
#include "core/log.h"
#include "core/status.h"
#include "gguf/gguf_reader.h"

namespace moe {

DeviceWeights::~DeviceWeights() = default;

std::unique_ptr<DeviceWeights> DeviceWeights::upload(const std::vector<const GgufTensorInfo *> &tensors, Backend &dev,
                                                     const std::function<bool(float)> &progress, bool zero_copy,
                                                     const std::function<void(const uint8_t *, size_t)> &released) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  size_t total = 0;
  for (const GgufTensorInfo *t : tensors) {
    if (!t || w->offsets_.count(t)) continue;
    w->offsets_[t] = total;
    total += (t->nbytes + 255) & ~size_t(255);  // kernels use 16-byte loads on quant blocks
  }
  w->bytes_ = total;
  w->zero_copy_ = zero_copy;
  w->buf_ = zero_copy ? dev.alloc_mapped_host(total ? total : 256) : dev.alloc(total ? total : 256, "weights");
  if (!w->buf_) fail(Status::Unsupported, "%s cannot read weights in place from host memory (zero_copy)", dev.info().name.c_str());
  // Chunks of at most 64 MiB so progress moves smoothly on large tensors; the copies are
  // queued on the device's stream and overlap with the next chunk's staging.
  constexpr size_t kChunk = 64u << 20;
  size_t done = 0;
  for (const GgufTensorInfo *t : tensors) {
    if (!t) continue;
    const size_t off = w->offsets_[t];
    for (size_t p = 0; p < t->nbytes; p += kChunk) {
      const size_t n = t->nbytes - p < kChunk ? t->nbytes - p : kChunk;
      w->buf_->upload(off + p, t->data + p, n);  // returns once t->data may be reused (staged)
      if (released) released(t->data + p, n);
      done += n;
      if (progress && !progress(total ? static_cast<float>(done) / static_cast<float>(total) : 1.0f))
        fail(Status::Aborted, "weight upload to %s cancelled by the progress callback", dev.info().name.c_str());
    }
  }
  MOE_LOG_INFO("uploaded %zu tensors (%.1f MiB) to %s%s", w->offsets_.size(), static_cast<double>(total) / 1048576.0,
               dev.info().name.c_str(), zero_copy ? " (zero-copy host memory)" : "");
  return w;
}

void *DeviceWeights::find(const GgufTensorInfo *t) const {
  auto it = offsets_.find(t);
  return it == offsets_.end() ? nullptr : static_cast<uint8_t *>(buf_->data()) + it->second;
}

}  // namespace moe
