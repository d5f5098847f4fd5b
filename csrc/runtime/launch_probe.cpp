#include "runtime/launch_probe.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace tpu::runtime {

namespace {
// Written out here: the runtime sits below the IR builder.
const char* kAddOne = R"(module @launch_probe {
  func.func public @main(%x: tensor<16xf32>) -> tensor<16xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<16xf32>
    %y = stablehlo.add %x, %one : tensor<16xf32>
    return %y : tensor<16xf32>
  }
}
)";
}  // namespace

double chained_launch_seconds(Client& client, int device, int n, int repeats) {
  ExecutablePtr exe = client.compile(kAddOne, "launch probe");
  std::vector<float> zeros(16, 0.0f);
  std::vector<double> per_launch;
  for (int r = 0; r <= repeats; ++r) {  // the first chain warms up
    BufferPtr x = client.from_host(zeros.data(), DType::F32, {16}, device);
    client.synchronize(device);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) x = client.execute(*exe, {x.get()}, device, false).at(0);
    float last[16];
    client.to_host(*x, last, sizeof(last));
    auto t1 = std::chrono::steady_clock::now();
    if (last[0] != static_cast<float>(n)) throw Error("launch probe computed a wrong chain", 0);
    if (r > 0) per_launch.push_back(std::chrono::duration<double>(t1 - t0).count() / n);
  }
  std::sort(per_launch.begin(), per_launch.end());
  return per_launch[per_launch.size() / 2];
}

}  // namespace tpu::runtime
