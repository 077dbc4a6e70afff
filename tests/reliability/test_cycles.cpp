// 200 load / decode / free cycles leave the process as they found it (issue 19): the same
// number of open file descriptors and threads, and resident memory within a small bound
// after the first cycles warmed up the allocator.
#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "reliability/reliability_support.h"

namespace {

// Entries of a /proc directory; `own_fd`: less the descriptor of the listing itself.
int count_entries(const char *dir, bool own_fd) {
  DIR *d = opendir(dir);
  REQUIRE(d != nullptr);
  int n = 0;
  while (dirent *e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return own_fd ? n - 1 : n;
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// One full cycle through the C ABI: load, context (2 threads, so the pool starts and
// stops), a decode, an asynchronous decode (its worker thread), logits, free.
void cycle(const std::string &path) {
  moe_rel::CModel cm(path, 64, 16, 16);
  cm.fill(16, 0, false);
  REQUIRE(moe_decode(cm.c, cm.b) == MOE_STATUS_OK);
  cm.fill(1, 16, true);
  REQUIRE(moe_decode_submit(cm.c, cm.b) == MOE_STATUS_OK);
  REQUIRE(moe_decode_wait(cm.c, -1) == MOE_STATUS_OK);
  const float *lg = nullptr;
  REQUIRE(moe_get_logits(cm.c, -1, &lg, nullptr) == MOE_STATUS_OK);
}

}  // namespace

TEST_CASE("reliability: 200 load-decode-free cycles keep descriptors, threads and memory flat",
          "[reliability][cycles]") {
  const std::string path = moe_test::tiny_model("f32");
  for (int i = 0; i < 10; ++i) cycle(path);  // warm-up: allocator arenas, lazy statics
  const int fds0 = count_entries("/proc/self/fd", true), tasks0 = count_entries("/proc/self/task", false);
  const long rss0 = rss_kib();
  long rss_max = rss0;
  for (int i = 0; i < 200; ++i) {
    cycle(path);
    if (i % 20 == 19) {
      INFO("cycle " << i);
      CHECK(count_entries("/proc/self/fd", true) == fds0);
      CHECK(count_entries("/proc/self/task", false) == tasks0);
      rss_max = std::max(rss_max, rss_kib());
    }
  }
  const long rss1 = rss_kib();
  std::printf("200 cycles: fds %d, threads %d, RSS %ld -> %ld KiB (max %ld)\n", fds0, tasks0, rss0, rss1, rss_max);
  // The tiny model is ~2 MB; a leak of one model or context per cycle would add > 400 MB.
  // Sanitizers keep freed memory in quarantine, so only the unsanitized build bounds it tightly.
  CHECK(rss1 - rss0 < (moe_rel::kSanitized ? 256 * 1024 : 16 * 1024));
}
