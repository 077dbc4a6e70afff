// Device enumeration for the public API (moe_device_count / moe_device_get_info): the
// DeviceInfo of every backend in a BackendRegistry (CPU first, then CUDA devices when built
// and present), so new backends show up here without changes.
//
//   for (const DeviceInfo &d : list_devices()) use(d.name, d.free_memory);
#pragma once
#include <vector>

#include "backends/backend.h"

namespace moe {

// Snapshot of the devices now (free memory is read at call time).
std::vector<DeviceInfo> list_devices();

}  // namespace moe
