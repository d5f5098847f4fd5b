#include "runtime/host_cpu.h"

#include <cstdint>
#include <cstdio>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__linux__)
#include <sys/auxv.h>
#endif

namespace tpu::runtime {

namespace {

#if defined(__x86_64__) || defined(__i386__)
std::string read_signature() {
  // Leaves that carry feature bits: 1 (SSE..AVX, FMA), 7.0 (AVX2, AVX-512, AMX),
  // 7.1 (AVX-VNNI, AVX512-BF16), 0x80000001 (LZCNT, SSE4a); and XCR0, the register
  // states the OS saves (an AVX-512 CPU under an OS that does not enable it cannot run it).
  auto leaf = [](unsigned l, unsigned sub, unsigned out[4]) {
    out[0] = out[1] = out[2] = out[3] = 0;
    unsigned max = __get_cpuid_max(l & 0x80000000u, nullptr);
    if (max >= l) __cpuid_count(l, sub, out[0], out[1], out[2], out[3]);
  };
  unsigned l1[4], l7[4], l7s1[4], ext[4];
  leaf(1, 0, l1);
  leaf(7, 0, l7);
  leaf(7, 1, l7s1);
  leaf(0x80000001u, 0, ext);
  uint64_t xcr0 = 0;
  if (l1[2] & (1u << 27)) {  // OSXSAVE: xgetbv is available
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "x86 1:%08x.%08x 7:%08x.%08x.%08x 7.1:%08x.%08x e1:%08x.%08x xcr0:%llx", l1[2],
                l1[3], l7[1], l7[2], l7[3], l7s1[0], l7s1[3], ext[2], ext[3],
                static_cast<unsigned long long>(xcr0));
  return buf;
}
#elif defined(__linux__)
std::string read_signature() {
  char buf[96];
  std::snprintf(buf, sizeof buf, "hwcap:%lx.%lx", getauxval(AT_HWCAP), getauxval(AT_HWCAP2));
  return buf;
}
#else
std::string read_signature() { return "unknown"; }
#endif

}  // namespace

const std::string& host_cpu_signature() {
  static const std::string s = read_signature();
  return s;
}

}  // namespace tpu::runtime
