// Measured memory read rate of this machine (bytes/s) for benchmark reports; 0 if unknown.
#pragma once

namespace moe {

double cpu_read_bandwidth();

}  // namespace moe
