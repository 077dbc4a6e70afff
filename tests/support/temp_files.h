// Temporary files of the tests: under $TMPDIR (else /tmp), named per process so parallel
// test processes never share one, and removed when the process exits normally.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace moe_test {

// $TMPDIR when set and not empty, else /tmp.
inline std::string temp_dir() {
  const char *t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

// Removes `path` when the process exits (static destruction).
inline void remove_at_exit(const std::string &path) {
  struct Registry {
    std::mutex mu;
    std::vector<std::string> paths;
    ~Registry() {
      for (const std::string &p : paths) std::remove(p.c_str());
    }
  };
  static Registry registry;
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.paths.push_back(path);
}

// "$TMPDIR/moeinfer-test-<pid>-<name>".
inline std::string temp_name(const std::string &name) {
  return temp_dir() + "/moeinfer-test-" + std::to_string(::getpid()) + "-" + name;
}

// temp_name(name), registered for removal at exit.
inline std::string temp_path(const std::string &name) {
  const std::string path = temp_name(name);
  remove_at_exit(path);
  return path;
}

}  // namespace moe_test
