#include "core/mapped_read.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace moe {
namespace {

std::mutex g_mu;                 // guards g_users and g_previous
int g_users = 0;                 // copies running (handler installed while > 0)
struct sigaction g_previous;     // the handler before ours

// The copy running on this thread: where to jump and which addresses are its source.
thread_local sigjmp_buf *t_jump = nullptr;
thread_local uintptr_t t_lo = 0, t_hi = 0;

void on_sigbus(int sig, siginfo_t *info, void *uctx) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
  if (t_jump && a >= t_lo && a < t_hi) siglongjmp(*t_jump, 1);
  // Not ours: behave as if we were not installed.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, uctx);
    return;
  }
  if (g_previous.sa_handler == SIG_IGN) return;
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  // Default action: restore it; returning re-executes the faulting access, which then
  // terminates the process exactly as without us.
  signal(SIGBUS, SIG_DFL);
}

struct HandlerScope {
  HandlerScope() {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_users++ == 0) {
      struct sigaction sa;
      std::memset(&sa, 0, sizeof sa);
      sa.sa_sigaction = on_sigbus;
      sa.sa_flags = SA_SIGINFO | SA_NODEFER;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGBUS, &sa, &g_previous);
    }
  }
  ~HandlerScope() {
    std::lock_guard<std::mutex> lock(g_mu);
    if (--g_users == 0) sigaction(SIGBUS, &g_previous, nullptr);
  }
};

// Kept apart from HandlerScope so nothing with a destructor lies between sigsetjmp and the
// access that may jump back to it.
__attribute__((noinline)) bool guarded_copy(void *dst, const void *src, size_t n) noexcept {
  sigjmp_buf jb;
  t_lo = reinterpret_cast<uintptr_t>(src);
  t_hi = t_lo + n;
  if (sigsetjmp(jb, 1) != 0) {  // 1: the signal mask is restored on the jump (SIGBUS unblocked)
    t_jump = nullptr;
    return false;
  }
  t_jump = &jb;
  // The handler reads t_jump / t_lo / t_hi: without these fences the compiler may drop the
  // stores (memcpy does not read them) or move them across the copy.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_jump = nullptr;
  return true;
}

}  // namespace

bool copy_from_mapping(void *dst, const void *src, size_t n) noexcept {
  if (n == 0) return true;
  t_jump = nullptr;  // first touch of this thread's TLS happens here, not in the handler
  HandlerScope scope;
  return guarded_copy(dst, src, n);
}

}  // namespace moe
