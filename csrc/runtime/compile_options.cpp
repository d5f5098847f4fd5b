// Hand-encodes the few CompileOptionsProto fields we set, in protobuf wire format.
// Field numbers from xla/pjrt/proto/compile_options.proto.
#include "runtime/compile_options.h"

#include <cstdint>

namespace tpu::runtime {
namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_int_field(std::string& out, int field, int64_t v) {
  put_varint(out, static_cast<uint64_t>(field) << 3);  // wire type 0: varint
  put_varint(out, static_cast<uint64_t>(v));
}

void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);  // wire type 2: length-delimited
  put_varint(out, bytes.size());
  out += bytes;
}

}  // namespace

std::string portable_compile_options(const std::vector<CompileOverride>& overrides) {
  std::string build;                 // ExecutableBuildOptionsProto
  put_int_field(build, 1, -1);       // device_ordinal: unset
  put_int_field(build, 4, 1);        // num_replicas
  put_int_field(build, 5, 1);        // num_partitions
  std::string opts;                  // CompileOptionsProto
  put_bytes_field(opts, 3, build);   // executable_build_options
  put_int_field(opts, 4, 1);         // compile_portable_executable
  for (const CompileOverride& o : overrides) {
    std::string value;                 // OptionOverrideProto
    put_int_field(value, 2, o.value ? 1 : 0);  // bool_field
    std::string entry;                 // one entry of the map
    put_bytes_field(entry, 1, o.name);
    put_bytes_field(entry, 2, value);
    put_bytes_field(opts, 7, entry);   // env_option_overrides: applied over the defaults
  }
  return opts;
}

}  // namespace tpu::runtime
