#include "core/huge_page_buffer.h"
#include "core/alloc_test_hook.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/status.h"

namespace moe {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

HugePageBuffer::HugePageBuffer(size_t bytes) {
  if (bytes == 0) return;
  // Over-allocate one huge page so the data can start on a 2 MiB boundary, then round the
  // length up so the last page is whole (a partial huge page falls back to 4 KiB pages).
  const size_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  allocation_point(bytes, "host memory (huge pages)");
  map_size_ = len + kHugePage;
  void *p = mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    map_size_ = 0;
    fail(Status::OutOfMemory, "cannot allocate %zu bytes of host memory: %s", bytes, std::strerror(errno));
  }
  map_ = static_cast<uint8_t *>(p);
  const uintptr_t a = (reinterpret_cast<uintptr_t>(map_) + kHugePage - 1) & ~(uintptr_t)(kHugePage - 1);
  data_ = reinterpret_cast<uint8_t *>(a);
  size_ = bytes;
#ifdef MADV_HUGEPAGE
  huge_ = madvise(data_, len, MADV_HUGEPAGE) == 0;
#endif
}

HugePageBuffer::~HugePageBuffer() { release(); }

HugePageBuffer::HugePageBuffer(HugePageBuffer &&o) noexcept { *this = std::move(o); }

HugePageBuffer &HugePageBuffer::operator=(HugePageBuffer &&o) noexcept {
  if (this != &o) {
    release();
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    huge_ = std::exchange(o.huge_, false);
  }
  return *this;
}

void HugePageBuffer::release() {
  if (map_) munmap(map_, map_size_);
  map_ = data_ = nullptr;
  map_size_ = size_ = 0;
  huge_ = false;
}

}  // namespace moe
