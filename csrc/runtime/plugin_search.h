#pragma once
#include <string>
#include <utility>
#include <vector>

namespace tpu::runtime {
// Plugin files to try, in order, each with a word on where it came from. The Python
// package fills this from installed packages; TPU_PJRT_PLUGIN always wins.
void set_plugin_candidates(std::vector<std::pair<std::string, std::string>> candidates);
}  // namespace tpu::runtime
