#include "backends/device_list.h"

namespace moe {

std::vector<DeviceInfo> list_devices() {
  // A fresh registry each call: free memory must be current, and enumeration is cheap
  // compared with anything a host would do per device query.
  BackendRegistry reg;
  std::vector<DeviceInfo> out;
  out.reserve(reg.size());
  for (size_t i = 0; i < reg.size(); ++i) out.push_back(reg.at(i)->info());
  return out;
}

}  // namespace moe
