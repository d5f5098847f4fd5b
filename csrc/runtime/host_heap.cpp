#include "runtime/host_heap.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace tpu::runtime {
namespace {

// Runs when the library loads, before the PJRT client starts its worker threads: a
// thread binds to an arena at its first malloc, so a limit set after that would leave
// those threads on arenas of their own.
bool apply() {
  const char* env = std::getenv("TPU_HOST_HEAP");
  if (env && std::strcmp(env, "0") == 0) return false;
#ifdef M_ARENA_MAX
  bool ok = mallopt(M_ARENA_MAX, 1) == 1;        // other arenas' empty heaps are unmapped
  ok = mallopt(M_MMAP_MAX, 0) == 1 && ok;         // an mmap'd block is unmapped on free
  ok = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kKeepFreeBytes)) == 1 && ok;
  return ok;
#else
  return false;  // not glibc: its allocator's own policy stays
#endif
}

const bool g_applied = apply();

}  // namespace

bool host_heap_reuses_memory() { return g_applied; }

}  // namespace tpu::runtime
