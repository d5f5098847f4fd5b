// Hand-encodes the few CompileOptionsProto fields we set, in protobuf wire format.
// Field numbers from xla/pjrt/proto/compile_options.proto.
#include "runtime/compile_options.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "runtime/proto_wire.h"

namespace tpu::runtime {
namespace {

constexpr int64_t kDefaultCpuSmallProgramElements = 4096;  // see benchmarks/RESULTS.md, session 33
constexpr int64_t kDefaultCpuThreadedMacs = int64_t{1} << 25;  // 32M: a 320^3 matmul

using proto_wire::put_bytes_field;
using proto_wire::put_int_field;

void put_string_field(std::string& out, int field, const std::string& s) { put_bytes_field(out, field, s); }

// One entry of CompileOptionsProto.env_option_overrides (map<string, OptionOverrideProto>):
// a DebugOptions flag set for this compile only, as JAX passes compiler options.
std::string int_override(const std::string& flag, int64_t value) {
  std::string v;                  // OptionOverrideProto
  put_int_field(v, 3, value);     // int_field
  std::string entry;              // map entry
  put_string_field(entry, 1, flag);
  put_bytes_field(entry, 2, v);
  return entry;
}

std::string bool_override(const std::string& flag, bool value) {
  std::string v;                  // OptionOverrideProto
  put_int_field(v, 2, value ? 1 : 0);  // bool_field
  std::string entry;
  put_string_field(entry, 1, flag);
  put_bytes_field(entry, 2, v);
  return entry;
}

}  // namespace

int fast_backend_level() {
  static const int level = [] {
    const char* s = std::getenv("TPU_OP_OPT_LEVEL");
    return s && *s ? std::atoi(s) : -1;
  }();
  return level;
}

int64_t cpu_small_program_elements() {
  static const int64_t n = [] {
    const char* s = std::getenv("TPU_CPU_SMALL_PROGRAM_ELEMENTS");
    return s && *s ? std::max<int64_t>(0, std::atoll(s)) : kDefaultCpuSmallProgramElements;
  }();
  return n;
}

int64_t cpu_threaded_macs() {
  static const int64_t macs = [] {
    const char* s = std::getenv("TPU_CPU_THREADED_MACS");
    return s && *s ? std::max<int64_t>(0, std::atoll(s)) : kDefaultCpuThreadedMacs;
  }();
  return macs;
}

std::string portable_compile_options(CompileEffort effort, const std::vector<CompileOverride>& overrides,
                                     bool portable) {
  std::string build;                 // ExecutableBuildOptionsProto
  put_int_field(build, 1, -1);       // device_ordinal: unset
  put_int_field(build, 4, 1);        // num_replicas
  put_int_field(build, 5, 1);        // num_partitions
  std::string opts;                  // CompileOptionsProto
  put_bytes_field(opts, 3, build);   // executable_build_options
  if (portable) put_int_field(opts, 4, 1);  // compile_portable_executable
  if (effort == CompileEffort::Fast && fast_backend_level() >= 0)
    put_bytes_field(opts, 7, int_override("xla_backend_optimization_level", fast_backend_level()));
  for (const CompileOverride& o : overrides) put_bytes_field(opts, 7, bool_override(o.name, o.value));
  return opts;
}

}  // namespace tpu::runtime
