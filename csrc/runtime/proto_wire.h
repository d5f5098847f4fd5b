// Protobuf wire format for the few field kinds the compile options need (varints and
// length-delimited fields), shared by the single- and multi-device options encoders.
#pragma once
#include <cstdint>
#include <string>

namespace tpu::runtime::proto_wire {

inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

inline void put_int_field(std::string& out, int field, int64_t v) {
  put_varint(out, static_cast<uint64_t>(field) << 3);  // wire type 0: varint
  put_varint(out, static_cast<uint64_t>(v));
}

inline void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);  // wire type 2: length-delimited
  put_varint(out, bytes.size());
  out += bytes;
}

}  // namespace tpu::runtime::proto_wire
