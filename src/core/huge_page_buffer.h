// Anonymous host memory backed by transparent huge pages where the OS offers them.
// Decode streams every weight byte once per token; with 4 KiB pages that is ~85,000 pages
// (TLB misses and page walks) per token for a 344 MB model step, and the hardware
// prefetchers stop at every 4 KiB page boundary. 2 MiB pages remove both costs.
//
//   HugePageBuffer b(bytes);          // throws Status::OutOfMemory on failure
//   uint8_t *p = b.data();            // 2 MiB aligned; b.huge() says whether THP was granted
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe {

class HugePageBuffer {
public:
  HugePageBuffer() = default;
  explicit HugePageBuffer(size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer &&o) noexcept;
  HugePageBuffer &operator=(HugePageBuffer &&o) noexcept;
  HugePageBuffer(const HugePageBuffer &) = delete;
  HugePageBuffer &operator=(const HugePageBuffer &) = delete;

  uint8_t *data() const { return data_; }
  size_t size() const { return size_; }
  // True when the kernel accepted the huge-page advice for the whole range (Linux THP in
  // "always" or "madvise" mode); pages may still be split later under memory pressure.
  bool huge() const { return huge_; }

private:
  void release();
  uint8_t *map_ = nullptr;  // whole mapping (data_ rounded down is inside it)
  size_t map_size_ = 0;
  uint8_t *data_ = nullptr;
  size_t size_ = 0;
  bool huge_ = false;
};

}  // namespace moe
