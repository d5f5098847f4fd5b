#include "runtime/plugin_search.h"

#include <unistd.h>

#include <cstdlib>

#include "runtime/client.h"

namespace tpu::runtime {
namespace {
std::vector<std::pair<std::string, std::string>>& candidates() {
  static std::vector<std::pair<std::string, std::string>> c;
  return c;
}
}  // namespace

void set_plugin_candidates(std::vector<std::pair<std::string, std::string>> c) {
  candidates() = std::move(c);
}

std::string Client::resolve_plugin_path(std::string* how) {
  if (const char* p = std::getenv("TPU_PJRT_PLUGIN"); p && *p) {
    if (how) *how = "TPU_PJRT_PLUGIN";
    return p;
  }
  for (auto& [path, origin] : candidates()) {
    if (access(path.c_str(), R_OK) == 0) {
      if (how) *how = origin;
      return path;
    }
  }
  return "";
}

}  // namespace tpu::runtime
