// Test hook: make the Nth allocation of the engine's own buffers fail, so tests can prove
// that a failed allocation leaves a context unchanged and a retry works.
//
//   moe::test_fail_allocation_after(0);   // the next allocation point throws OutOfMemory
//   ctx->decode(...);                     // -> Error(OutOfMemory); nothing changed
//   moe::test_fail_allocation_after(-1);  // off again (the default)
//
// Allocation points (`allocation_point`) are the host buffers of the CPU backend (arenas,
// KV cache, mapped host memory), every huge-page buffer (the CPU weight copy, a model file
// read without mmap), the model file's mapping and the logits buffer of Context::decode. The countdown is
// process-wide (all threads); it costs one relaxed atomic load per point while off.
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe {

// n >= 0: the allocation point after the next n ones throws (once; then the hook is off).
// n < 0: off. bad_alloc: throw std::bad_alloc instead of Error(OutOfMemory), as a failing
// operator new would.
void test_fail_allocation_after(int64_t n, bool bad_alloc = false);
// How many allocation points were passed since the last test_fail_allocation_after call.
int64_t test_allocation_points();

// Called by every allocation the hook covers, before it allocates.
void allocation_point(size_t bytes, const char *what);

}  // namespace moe
