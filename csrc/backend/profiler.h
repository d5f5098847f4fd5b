// Device activity for torch.profiler (profiler_kineto.cpp): programs launched while a
// Kineto session with PrivateUse1 activities is recording become device events of the
// op that launched them.
#pragma once
#include <atomic>
#include <string>
#include <vector>

#include "runtime/client.h"

namespace tpu::backend {

extern std::atomic<bool> g_device_tracing;  // a session is recording

// Notes a program just launched on `device` producing `outputs` (times it until they
// are ready). Cheap when no session records.
void note_launch(const std::string& name, int device, const std::vector<runtime::BufferPtr>& outputs);

}  // namespace tpu::backend
