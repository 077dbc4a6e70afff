// Reads of a file mapping that survive the file shrinking underneath: touching a mapped page
// past the file's new end raises SIGBUS, which would kill the host. The library's own bulk
// reads of mapped weights go through copy_from_mapping, which turns that SIGBUS into a
// `false` return (the caller reports an IoError).
//
//   if (!copy_from_mapping(dst, t.data, t.nbytes)) fail(Status::IoError, "... '%s' shrank", ...);
//
// How: while a copy runs, a SIGBUS handler is installed (process-wide, reference-counted over
// concurrent copies; the previous handler is restored after the last one). A SIGBUS on a copying
// thread whose fault address lies in that thread's source range jumps back (siglongjmp) out of
// the copy; any other SIGBUS goes to the previous handler (or the default action), so the
// host's own handling is unchanged. A host that installs its own SIGBUS handler while a copy
// is running has it replaced when the copy ends.
#pragma once
#include <cstddef>

namespace moe {

// memcpy(dst, src, n); false if reading src raised SIGBUS (dst then holds a partial copy).
bool copy_from_mapping(void *dst, const void *src, size_t n) noexcept;

}  // namespace moe
