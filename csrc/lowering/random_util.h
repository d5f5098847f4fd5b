// How random bits become floats: shared by random.cpp and random_samplers.cpp, so the
// rejection samplers' loops draw their uniforms and normals as the other random ops do.
#pragma once
#include "lowering/registry.h"

namespace tpu::lowering::rnd {

// Precision of the uniform floats made for dtype t: its significand bits, so that
// every sample is exact in t and [0, 1) stays half-open after the final cast.
int digits(DType t);
// Samplers that transform u (normal, exponential, ...) draw it with f32's 24 bits (f64's
// 53) whatever the output dtype, so bf16/f16 samples keep the distribution's tails.
DType fine_type(DType t);
// Uniform floats in [0, 1) for dtype t from unsigned words `bits` (u64 for f64, else
// u32): the top digits(t) bits scaled by 2^-digits, as f64 for f64, else f32.
Value unit_floats(Builder& b, const Value& bits, DType t);
// Standard normals from two independent uniform arrays in [0, 1) (Box-Muller).
Value box_muller(Builder& b, const Value& u1, const Value& u2);
// The bits rng_bit_generator(state, [2] + s) draws with THREE_FRY (u64 words when
// `wide`, else u32), as its two halves shaped s, computed elementwise from the counters:
// the same values, without the [2] + s array that XLA keeps whole in memory.
std::pair<Value, Value> threefry_pair(Builder& b, const Value& state, const Shape& s, bool wide);

}  // namespace tpu::lowering::rnd
