#include "memory/memory_report.h"

#include "core/status.h"

namespace moe {

std::string MemoryReport::to_text() const {
  std::string s;
  auto mib = [](size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  for (const auto &d : devices)
    s += strfmt("%-6s weights %9.2f MiB | kv cache %9.2f MiB | activations %9.2f MiB | other %8.2f MiB | total %9.2f MiB\n",
                d.device.c_str(), mib(d.weights), mib(d.kv_cache), mib(d.activations), mib(d.other), mib(d.total()));
  return s;
}

}  // namespace moe
