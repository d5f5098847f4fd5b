// Device guard, hooks and per-device random generators for PrivateUse1 (`tpu`).
#pragma once
#include <ATen/core/Generator.h>

namespace tpu::backend {

int device_count();  // 0 when no plugin can be loaded
int current_device();
void set_current_device(int d);
void check_device(int d);  // clear error for tpu:N beyond the device count

// (seed, counter) for the next random op on `gen`'s device; advances the counter.
std::pair<uint64_t, uint64_t> next_rng_state(const std::optional<at::Generator>& gen, int device);
const at::Generator& default_generator(int device);

void register_device_hooks();

}  // namespace tpu::backend
