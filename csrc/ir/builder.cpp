#include "ir/builder.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <stdexcept>

namespace tpu::ir {

std::string Type::str() const {
  std::string s = "tensor<";
  for (auto d : shape) s += std::to_string(d) + "x";
  s += mlir_name(dtype);
  return s + ">";
}

int64_t Type::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string ints(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::string i64_array(const std::vector<int64_t>& v) {
  return v.empty() ? "array<i64>" : "array<i64: " + ints(v) + ">";
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

std::string Builder::fresh() { return "%v" + std::to_string(next_++); }

// bf16, f16 and the fp8 types are moved as same-width unsigned ints: XLA:CPU computes
// them widened (f32, or f16 for fp8) even where an op only moves elements, and the
// narrowing back makes every NaN the canonical one, where a move keeps the bytes (16-bit
// data packed with .view(torch.bfloat16)). The bitcasts cost nothing where the type is
// native (TPU's bf16), and XLA folds a bitcast pair between two moves.
static bool moved_as_bits(DType t) { return is_float(t) && itemsize(t) < 4; }
static DType bits_of(DType t) { return itemsize(t) == 1 ? DType::U8 : DType::U16; }

std::string Builder::sig(const std::vector<Value>& operands) const {
  std::string s = "(";
  for (size_t i = 0; i < operands.size(); ++i) s += (i ? ", " : "") + operands[i].type.str();
  return s + ")";
}

static std::string names(const std::vector<Value>& vs) {
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + vs[i].name;
  return s;
}

Value Builder::param(const Type& t) {
  params_.push_back(t);
  return Value{"%arg" + std::to_string(params_.size() - 1), t};
}

Value Builder::number(double v, DType t) {
  if (!number_operand_ || depth_ > 1) return constant(v, t);
  return number_operand_(*this, v, t);
}

Value Builder::raw(const std::string& op, const std::vector<Value>& operands,
                   const std::string& attrs, const Type& result) {
  Value v{fresh(), result};
  body_ << std::string(depth_ * 2, ' ') << v.name << " = \"" << op << "\"(" << names(operands)
        << ")";
  if (!attrs.empty()) body_ << " {" << attrs << "}";
  body_ << " : " << sig(operands) << " -> " << result.str() << "\n";
  return v;
}

Value Builder::unary(const std::string& op, const Value& x) { return raw(op, {x}, "", x.type); }

Value Builder::binary(const std::string& op, const Value& a, const Value& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    throw std::invalid_argument("internal: " + op + " on " + a.type.str() + " and " + b.type.str());
  return raw(op, {a, b}, "", a.type);
}

Value Builder::compare(const Value& a, const Value& b, Cmp dir) {
  static const char* kDir[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  DType t = a.dtype();
  // Complex operands compare as FLOAT (EQ/NE only), as the StableHLO verifier requires.
  const char* kind = is_float(t) || is_complex(t) ? "FLOAT" : (is_unsigned_int(t) || t == DType::Bool) ? "UNSIGNED"
                                                                                     : "SIGNED";
  std::string attrs = std::string("comparison_direction = #stablehlo<comparison_direction ") +
                      kDir[static_cast<int>(dir)] + ">, compare_type = #stablehlo<comparison_type " +
                      kind + ">";
  return raw("stablehlo.compare", {a, b}, attrs, Type{DType::Bool, a.shape()});
}

Value Builder::select(const Value& p, const Value& a, const Value& b) {
  if (moved_as_bits(a.dtype())) {
    DType u = bits_of(a.dtype());
    return bitcast(select(p, bitcast(a, u), bitcast(b, u)), a.dtype());
  }
  return raw("stablehlo.select", {p, a, b}, "", a.type);
}

Value Builder::clamp(const Value& lo, const Value& x, const Value& hi) {
  return raw("stablehlo.clamp", {lo, x, hi}, "", x.type);
}

Value Builder::convert(const Value& x, DType to) {
  if (x.dtype() == to) return x;
  if (to == DType::Bool) {  // nonzero test, as PyTorch casts to bool
    Value zero = constant(0, x.dtype(), x.shape());
    return compare(x, zero, Cmp::NE);
  }
  // PyTorch defines a floating value's uint8 as the low byte of its int64 (-1.0 -> 255,
  // 300.0 -> 44) on every platform; a direct conversion would saturate instead.
  if (to == DType::U8 && (is_float(x.dtype()) || is_complex(x.dtype()))) return convert(convert(x, DType::I64), to);
  // A bool as 1.0/0.0 by select: XLA rewrites `y * convert(mask)` to `select(mask, y, 0)`,
  // which drops the NaN that inf * 0 and NaN * 0 give (PyTorch's x * mask, amax's gradient).
  if (x.dtype() == DType::Bool &&
      (to == DType::F32 || to == DType::F16 || to == DType::BF16 || to == DType::F64))
    return select(x, constant(1, to, x.shape()), constant(0, to, x.shape()));
  return raw("stablehlo.convert", {x}, "", Type{to, x.shape()});
}

Value Builder::bitcast(const Value& x, DType to) {
  if (x.dtype() == to) return x;
  // Wider to narrower adds a minor dim of the ratio; narrower to wider drops it.
  Shape out = x.shape();
  int64_t a = itemsize(x.dtype()), c = itemsize(to);
  if (a > c) out.push_back(a / c);
  if (a < c) out.pop_back();
  return raw("stablehlo.bitcast_convert", {x}, "", Type{to, out});
}

static std::string literal(double v, DType t) {
  char buf[64];
  if (t == DType::F32) {
    float f = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    std::snprintf(buf, sizeof(buf), "0x%08X", bits);
    return buf;
  }
  if (t == DType::F64) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    std::snprintf(buf, sizeof(buf), "0x%016llX", static_cast<unsigned long long>(bits));
    return buf;
  }
  if (t == DType::Bool) return v != 0 ? "true" : "false";
  // 2^63 is not an int64: the largest int64 is what such a bound means.
  long long iv = v >= 9223372036854775807.0 ? std::numeric_limits<long long>::max()
                                            : static_cast<long long>(v);
  std::snprintf(buf, sizeof(buf), "%lld", iv);
  return buf;
}

Value Builder::constant(double v, DType t, const Shape& shape) {
  Value scalar;
  if (t == DType::F16 || t == DType::BF16 || is_fp8(t)) {  // spelled in f32, narrowed by XLA at compile time
    // (StableHLO text has no fp8 literal.) e4m3fn saturates to +-448 as c10's cast, and in
    // the formats without inf +-inf (a max/min init) is the largest finite value, not NaN.
    bool no_inf = t == DType::F8E4M3FNUZ || t == DType::F8E5M2FNUZ;
    if (t == DType::F8E4M3FN || (no_inf && std::isinf(v))) {
      double lim = t == DType::F8E4M3FN ? 448.0 : t == DType::F8E4M3FNUZ ? 240.0 : 57344.0;
      if (v > lim) v = lim;
      if (v < -lim) v = -lim;  // (NaN stays NaN)
    }
    scalar = convert(constant(v, DType::F32), t);
  } else if (is_complex(t)) {  // (re, im) pairs of the component type
    DType part = t == DType::C64 ? DType::F32 : DType::F64;
    Type st{t, {}};
    scalar = Value{fresh(), st};
    body_ << std::string(depth_ * 2, ' ') << scalar.name << " = \"stablehlo.constant\"() {value = dense<("
          << literal(v, part) << ", " << literal(0.0, part) << ")> : " << st.str() << "} : () -> "
          << st.str() << "\n";
  } else {
    Type st{t, {}};
    scalar = Value{fresh(), st};
    body_ << std::string(depth_ * 2, ' ') << scalar.name
          << " = \"stablehlo.constant\"() {value = dense<" << literal(v, t) << "> : " << st.str()
          << "} : () -> " << st.str() << "\n";
  }
  if (shape.empty()) return scalar;
  return broadcast_in_dim(scalar, shape, {});
}

Value Builder::iota(const Type& t, int64_t dim) {
  return raw("stablehlo.iota", {}, "iota_dimension = " + std::to_string(dim) + " : i64", t);
}

Value Builder::reshape(const Value& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return raw("stablehlo.reshape", {x}, "", Type{x.dtype(), shape});
}

Value Builder::broadcast_in_dim(const Value& x, const Shape& shape, const std::vector<int64_t>& dims) {
  if (x.shape() == shape) {
    bool identity = true;
    for (size_t i = 0; i < dims.size(); ++i) identity &= dims[i] == static_cast<int64_t>(i);
    if (identity) return x;
  }
  if (moved_as_bits(x.dtype()))
    return bitcast(broadcast_in_dim(bitcast(x, bits_of(x.dtype())), shape, dims), x.dtype());
  return raw("stablehlo.broadcast_in_dim", {x}, "broadcast_dimensions = " + i64_array(dims),
             Type{x.dtype(), shape});
}

Value Builder::transpose(const Value& x, const std::vector<int64_t>& perm) {
  bool identity = true;
  Shape out(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    out[i] = x.shape()[perm[i]];
    identity &= perm[i] == static_cast<int64_t>(i);
  }
  if (identity) return x;
  return raw("stablehlo.transpose", {x}, "permutation = " + i64_array(perm), Type{x.dtype(), out});
}

Value Builder::slice(const Value& x, const Shape& start, const Shape& limit, const Shape& strides) {
  Shape out(start.size());
  bool identity = true;
  for (size_t i = 0; i < start.size(); ++i) {
    out[i] = limit[i] <= start[i] ? 0 : (limit[i] - start[i] + strides[i] - 1) / strides[i];
    identity &= start[i] == 0 && limit[i] == x.shape()[i] && strides[i] == 1;
  }
  if (identity) return x;
  if (moved_as_bits(x.dtype()))
    return bitcast(slice(bitcast(x, bits_of(x.dtype())), start, limit, strides), x.dtype());
  return raw("stablehlo.slice", {x},
             "start_indices = " + i64_array(start) + ", limit_indices = " + i64_array(limit) +
                 ", strides = " + i64_array(strides),
             Type{x.dtype(), out});
}

Value Builder::concatenate(const std::vector<Value>& xs, int64_t dim) {
  if (xs.size() == 1) return xs[0];
  if (moved_as_bits(xs[0].dtype())) {
    std::vector<Value> bits;
    for (auto& x : xs) bits.push_back(bitcast(x, bits_of(x.dtype())));
    return bitcast(concatenate(bits, dim), xs[0].dtype());
  }
  Shape out = xs[0].shape();
  out[dim] = 0;
  for (auto& x : xs) out[dim] += x.shape()[dim];
  return raw("stablehlo.concatenate", xs, "dimension = " + std::to_string(dim) + " : i64",
             Type{xs[0].dtype(), out});
}

Value Builder::pad(const Value& x, const Value& padv, const Shape& lo, const Shape& hi,
                   const Shape& interior) {
  if (moved_as_bits(x.dtype())) {
    DType u = bits_of(x.dtype());
    return bitcast(pad(bitcast(x, u), bitcast(padv, u), lo, hi, interior), x.dtype());
  }
  Shape out(x.shape().size());
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t n = x.shape()[i];
    out[i] = lo[i] + hi[i] + n + (n > 0 ? (n - 1) * interior[i] : 0);
  }
  return raw("stablehlo.pad", {x, padv},
             "edge_padding_low = " + i64_array(lo) + ", edge_padding_high = " + i64_array(hi) +
                 ", interior_padding = " + i64_array(interior),
             Type{x.dtype(), out});
}

Value Builder::reverse(const Value& x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x;
  if (moved_as_bits(x.dtype())) return bitcast(reverse(bitcast(x, bits_of(x.dtype())), dims), x.dtype());
  return raw("stablehlo.reverse", {x}, "dimensions = " + i64_array(dims), x.type);
}

Value Builder::dynamic_update_slice(const Value& x, const Value& update,
                                    const std::vector<Value>& starts) {
  if (moved_as_bits(x.dtype())) {
    DType u = bits_of(x.dtype());
    return bitcast(dynamic_update_slice(bitcast(x, u), bitcast(update, u), starts), x.dtype());
  }
  std::vector<Value> ops{x, update};
  ops.insert(ops.end(), starts.begin(), starts.end());
  return raw("stablehlo.dynamic_update_slice", ops, "", x.type);
}

Value Builder::dynamic_slice(const Value& x, const std::vector<Value>& starts, const Shape& sizes) {
  if (moved_as_bits(x.dtype()))
    return bitcast(dynamic_slice(bitcast(x, bits_of(x.dtype())), starts, sizes), x.dtype());
  std::vector<Value> ops{x};
  ops.insert(ops.end(), starts.begin(), starts.end());
  return raw("stablehlo.dynamic_slice", ops, "slice_sizes = " + i64_array(sizes),
             Type{x.dtype(), sizes});
}

void Builder::emit_region(const std::vector<Type>& arg_types, const RegionFn& fn) {
  body_ << " (";
  emit_block(arg_types, fn);
  body_ << ")";
}

void Builder::emit_block(const std::vector<Type>& arg_types, const RegionFn& fn) {
  std::string pad(depth_ * 2, ' ');
  body_ << "{\n" << pad << "^bb0(";
  std::vector<Value> args;
  for (size_t i = 0; i < arg_types.size(); ++i) {
    Value a{fresh(), arg_types[i]};
    body_ << (i ? ", " : "") << a.name << ": " << a.type.str();
    args.push_back(a);
  }
  body_ << "):\n";
  ++depth_;
  std::vector<Value> res = fn(*this, args);
  body_ << std::string(depth_ * 2, ' ') << "\"stablehlo.return\"(" << names(res) << ") : "
        << sig(res) << " -> ()\n";
  --depth_;
  body_ << pad << "}";
}

static std::vector<Value> multi(const std::string& base, const std::vector<Type>& types) {
  std::vector<Value> out;
  for (size_t i = 0; i < types.size(); ++i) {
    std::string n = types.size() == 1 ? base : base + "#" + std::to_string(i);
    out.push_back(Value{n, types[i]});
  }
  return out;
}

static std::string result_list(const std::vector<Type>& ts) {
  if (ts.size() == 1) return ts[0].str();
  std::string s = "(";
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + ts[i].str();
  return s + ")";
}

std::vector<Value> Builder::reduce(const std::vector<Value>& xs, const std::vector<Value>& inits,
                                   const std::vector<int64_t>& dims, const RegionFn& body) {
  Shape out;
  const Shape& in = xs[0].shape();
  for (int64_t i = 0; i < static_cast<int64_t>(in.size()); ++i) {
    bool reduced = false;
    for (auto d : dims) reduced |= d == i;
    if (!reduced) out.push_back(in[i]);
  }
  std::vector<Type> region_types, result_types;
  for (auto& x : xs) {
    region_types.push_back(Type{x.dtype(), {}});
    result_types.push_back(Type{x.dtype(), out});
  }
  for (auto& x : xs) region_types.push_back(Type{x.dtype(), {}});
  std::string name = fresh();
  std::vector<Value> operands = xs;
  operands.insert(operands.end(), inits.begin(), inits.end());
  body_ << std::string(depth_ * 2, ' ') << name
        << (xs.size() > 1 ? ":" + std::to_string(xs.size()) : "") << " = \"stablehlo.reduce\"("
        << names(operands) << ")";
  emit_region(region_types, body);
  body_ << " {dimensions = " << i64_array(dims) << "} : " << sig(operands) << " -> "
        << result_list(result_types) << "\n";
  return multi(name, result_types);
}

Value Builder::reduce(const Value& x, const Value& init, const std::vector<int64_t>& dims,
                      const std::string& op) {
  return reduce({x}, {init}, dims, [&](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{b.binary(op, a[0], a[1])};
  })[0];
}

Value Builder::reduce_window(const Value& x, const Value& init, const Shape& window,
                             const Shape& strides,
                             const std::vector<std::pair<int64_t, int64_t>>& padding,
                             const std::string& op) {
  return reduce_window({x}, {init}, window, strides, {}, padding,
                       [&](Builder& b, const std::vector<Value>& a) {
                         return std::vector<Value>{b.binary(op, a[0], a[1])};
                       })[0];
}

std::vector<Value> Builder::reduce_window(const std::vector<Value>& xs, const std::vector<Value>& inits,
                                          const Shape& window, const Shape& strides,
                                          const Shape& dilations,
                                          const std::vector<std::pair<int64_t, int64_t>>& padding,
                                          const RegionFn& body) {
  const Shape& in = xs[0].shape();
  Shape out(in.size());
  std::string pads;
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t n = in[i] + padding[i].first + padding[i].second;
    int64_t span = (window[i] - 1) * (dilations.empty() ? 1 : dilations[i]) + 1;
    out[i] = n < span ? 0 : (n - span) / strides[i] + 1;
    pads += (i ? ", " : "") + std::string("[") + std::to_string(padding[i].first) + ", " +
            std::to_string(padding[i].second) + "]";
  }
  std::vector<Type> region_types, result_types;
  for (auto& x : xs) {
    region_types.push_back(Type{x.dtype(), {}});
    result_types.push_back(Type{x.dtype(), out});
  }
  for (auto& x : xs) region_types.push_back(Type{x.dtype(), {}});
  std::vector<Value> operands = xs;
  operands.insert(operands.end(), inits.begin(), inits.end());
  std::string name = fresh();
  body_ << std::string(depth_ * 2, ' ') << name
        << (xs.size() > 1 ? ":" + std::to_string(xs.size()) : "") << " = \"stablehlo.reduce_window\"("
        << names(operands) << ")";
  emit_region(region_types, body);
  body_ << " {window_dimensions = " << i64_array(window) << ", window_strides = " << i64_array(strides);
  if (!dilations.empty()) body_ << ", window_dilations = " << i64_array(dilations);
  body_ << ", padding = dense<[" << pads << "]> : tensor<" << out.size() << "x2xi64>} : "
        << sig(operands) << " -> " << result_list(result_types) << "\n";
  return multi(name, result_types);
}

std::vector<Value> Builder::while_loop(const std::vector<Value>& init, const RegionFn& cond,
                                       const RegionFn& body) {
  std::vector<Type> types;
  for (auto& v : init) types.push_back(v.type);
  std::string name = fresh();
  body_ << std::string(depth_ * 2, ' ') << name
        << (init.size() > 1 ? ":" + std::to_string(init.size()) : "") << " = \"stablehlo.while\"("
        << names(init) << ") (";
  emit_block(types, cond);
  body_ << ", ";
  emit_block(types, body);
  body_ << ") : " << sig(init) << " -> " << result_list(types) << "\n";
  return multi(name, types);
}

Value Builder::after(const Value& x, const Value& dep) {
  // dep's first element, compared with itself: false unless NaN, which the compiler
  // cannot know, and min(that, 0) is always 0. Adding -0.0 leaves every float as it is
  // (signed zeros and NaNs included); adding 0 or or-ing false leaves integers and bools.
  Shape zero(dep.rank(), 0), one(dep.rank(), 1);
  Value d0 = dep.rank() ? reshape(slice(dep, zero, one, one), {}) : dep;
  if (!is_float(d0.dtype())) d0 = convert(d0, DType::F32);
  Value z = binary("stablehlo.minimum", convert(compare(d0, d0, Cmp::NE), DType::I32), constant(0, DType::I32));
  if (x.dtype() == DType::Bool)
    return binary("stablehlo.or", x, broadcast_in_dim(convert(z, DType::Bool), x.shape(), {}));
  Value zx = convert(z, x.dtype());
  if (is_float(x.dtype()) || is_complex(x.dtype())) zx = unary("stablehlo.negate", zx);
  return binary("stablehlo.add", x, broadcast_in_dim(zx, x.shape(), {}));
}

Value Builder::materialized(const Value& x) {
  if (is_complex(x.dtype()) || x.type.numel() == 0) return x;
  // Two copies of x's bits (as unsigned integers: NaN payloads and signed zeros survive,
  // and XLA:CPU's fast float max plays no part), the second or-ed with a zero the
  // compiler cannot know (as in after()), reduced by max: x again, by a reduction the
  // simplifier cannot see through.
  const bool flag = x.dtype() == DType::Bool;
  const int64_t size = itemsize(x.dtype());
  const DType bits = flag ? DType::Bool
                     : size == 1 ? DType::U8
                     : size == 2 ? DType::U16
                     : size == 4 ? DType::U32
                                 : DType::U64;
  Shape zero(x.rank(), 0), one(x.rank(), 1);
  Value d0 = x.rank() ? reshape(slice(x, zero, one, one), {}) : x;
  if (!is_float(d0.dtype())) d0 = convert(d0, DType::F32);
  Value z = binary("stablehlo.minimum", convert(compare(d0, d0, Cmp::NE), DType::I32), constant(0, DType::I32));
  Shape two = x.shape();
  two.insert(two.begin(), 2);
  std::vector<int64_t> dims;
  for (int i = 0; i < x.rank(); ++i) dims.push_back(i + 1);
  Value copies = broadcast_in_dim(bitcast(x, bits), two, dims);
  Value second = binary("stablehlo.and", convert(iota(Type{DType::I32, two}, 0), bits),
                        broadcast_in_dim(convert(z, bits), two, {}));
  Value m = reduce(binary("stablehlo.or", copies, second), constant(0, bits), {0},
                   flag ? "stablehlo.or" : "stablehlo.maximum");
  return bitcast(m, x.dtype());
}

std::vector<Value> Builder::optimization_barrier(const std::vector<Value>& xs) {
  std::vector<Type> types;
  for (auto& x : xs) types.push_back(x.type);
  std::string name = fresh();
  body_ << std::string(depth_ * 2, ' ') << name
        << (xs.size() > 1 ? ":" + std::to_string(xs.size()) : "")
        << " = \"stablehlo.optimization_barrier\"(" << names(xs) << ") : " << sig(xs) << " -> "
        << result_list(types) << "\n";
  return multi(name, types);
}

std::vector<Value> Builder::sort(const std::vector<Value>& xs, int64_t dim, bool stable,
                                 const RegionFn& comparator) {
  std::vector<Type> region_types, result_types;
  for (auto& x : xs) {
    region_types.push_back(Type{x.dtype(), {}});
    region_types.push_back(Type{x.dtype(), {}});
    result_types.push_back(x.type);
  }
  std::string name = fresh();
  body_ << std::string(depth_ * 2, ' ') << name
        << (xs.size() > 1 ? ":" + std::to_string(xs.size()) : "") << " = \"stablehlo.sort\"("
        << names(xs) << ")";
  emit_region(region_types, comparator);
  body_ << " {dimension = " << dim << " : i64, is_stable = " << (stable ? "true" : "false")
        << "} : " << sig(xs) << " -> " << result_list(result_types) << "\n";
  return multi(name, result_types);
}

Value Builder::dot_general(const Value& a, const Value& b, const std::vector<int64_t>& batch_a,
                           const std::vector<int64_t>& batch_b, const std::vector<int64_t>& contract_a,
                           const std::vector<int64_t>& contract_b, DType out_t,
                           std::optional<DotPrecision> fixed) {
  auto contains = [](const std::vector<int64_t>& v, int64_t x) {
    for (auto y : v) if (y == x) return true;
    return false;
  };
  Shape out;
  for (auto d : batch_a) out.push_back(a.shape()[d]);
  for (int64_t i = 0; i < a.rank(); ++i)
    if (!contains(batch_a, i) && !contains(contract_a, i)) out.push_back(a.shape()[i]);
  for (int64_t i = 0; i < b.rank(); ++i)
    if (!contains(batch_b, i) && !contains(contract_b, i)) out.push_back(b.shape()[i]);
  std::string attrs = "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [" +
                      ints(batch_a) + "], rhs_batching_dimensions = [" + ints(batch_b) +
                      "], lhs_contracting_dimensions = [" + ints(contract_a) +
                      "], rhs_contracting_dimensions = [" + ints(contract_b) + "]>" +
                      precision_config(a, b, fixed);
  return raw("stablehlo.dot_general", {a, b}, attrs, Type{out_t, out});
}

std::string Builder::precision_config(const Value& a, const Value& b, std::optional<DotPrecision> fixed) {
  // Narrower types are multiplied as they are; f64 has no narrower passes on any plugin.
  auto wide = [](DType t) { return t == DType::F32 || t == DType::C64; };
  if (!wide(a.dtype()) && !wide(b.dtype())) return "";
  if (!fixed) reads_matmul_precision_ = true;
  DotPrecision p = fixed.value_or(matmul_precision_);
  const char* name = p == DotPrecision::Highest ? "HIGHEST" : p == DotPrecision::High ? "HIGH" : "DEFAULT";
  std::string one = std::string("#stablehlo<precision ") + name + ">";
  return ", precision_config = [" + one + ", " + one + "]";
}

Value Builder::gather(const Value& operand, const Value& indices,
                      const std::vector<int64_t>& offset_dims,
                      const std::vector<int64_t>& collapsed_dims,
                      const std::vector<int64_t>& start_index_map, int64_t index_vector_dim,
                      const Shape& slice_sizes, const Shape& out_shape) {
  if (moved_as_bits(operand.dtype()))
    return bitcast(gather(bitcast(operand, bits_of(operand.dtype())), indices, offset_dims, collapsed_dims,
                          start_index_map, index_vector_dim, slice_sizes, out_shape),
                   operand.dtype());
  std::string attrs = "dimension_numbers = #stablehlo.gather<offset_dims = [" + ints(offset_dims) +
                      "], collapsed_slice_dims = [" + ints(collapsed_dims) +
                      "], start_index_map = [" + ints(start_index_map) +
                      "], index_vector_dim = " + std::to_string(index_vector_dim) +
                      ">, slice_sizes = " + i64_array(slice_sizes) + ", indices_are_sorted = false";
  return raw("stablehlo.gather", {operand, indices}, attrs, Type{operand.dtype(), out_shape});
}

Value Builder::scatter(const Value& operand, const Value& indices, const Value& updates,
                       const std::vector<int64_t>& update_window_dims,
                       const std::vector<int64_t>& inserted_window_dims,
                       const std::vector<int64_t>& scatter_dims_to_operand_dims,
                       int64_t index_vector_dim, const RegionFn& combine) {
  if (moved_as_bits(operand.dtype()) && replaces(combine, operand.dtype())) {
    DType u = bits_of(operand.dtype());
    return bitcast(scatter(bitcast(operand, u), indices, bitcast(updates, u), update_window_dims,
                           inserted_window_dims, scatter_dims_to_operand_dims, index_vector_dim, combine),
                   operand.dtype());
  }
  std::string name = fresh();
  body_ << std::string(depth_ * 2, ' ') << name << " = \"stablehlo.scatter\"(" << operand.name
        << ", " << indices.name << ", " << updates.name << ")";
  emit_region({Type{operand.dtype(), {}}, Type{operand.dtype(), {}}}, combine);
  body_ << " {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = ["
        << ints(update_window_dims) << "], inserted_window_dims = [" << ints(inserted_window_dims)
        << "], scatter_dims_to_operand_dims = [" << ints(scatter_dims_to_operand_dims)
        << "], index_vector_dim = " << index_vector_dim
        << ">, indices_are_sorted = false, unique_indices = false} : "
        << sig({operand, indices, updates}) << " -> " << operand.type.str() << "\n";
  return Value{name, operand.type};
}

bool Builder::replaces(const RegionFn& combine, DType t) {
  // Run on a scratch builder: a region that emits nothing and yields its second
  // argument stores the update (and would do the same on any type).
  Builder scratch;
  Value old{"%old", Type{t, {}}}, update{"%update", Type{t, {}}};
  std::vector<Value> r = combine(scratch, {old, update});
  return r.size() == 1 && r[0].name == update.name && scratch.body_.str().empty();
}

std::pair<Value, Value> Builder::rng_bit_generator(const Value& state, const Type& bits_type) {
  std::string name = fresh();
  body_ << std::string(depth_ * 2, ' ') << name << ":2 = \"stablehlo.rng_bit_generator\"("
        << state.name << ") {rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>} : ("
        << state.type.str() << ") -> (" << state.type.str() << ", " << bits_type.str() << ")\n";
  return {Value{name + "#0", state.type}, Value{name + "#1", bits_type}};
}

std::string Builder::function(const std::string& name, const std::vector<Value>& results,
                              bool is_public) const {
  std::ostringstream m;
  m << "  func.func " << (is_public ? "public" : "private") << " @" << name << "(";
  for (size_t i = 0; i < params_.size(); ++i) {
    m << (i ? ", " : "") << "%arg" << i << ": " << params_[i].str();
  }
  m << ") -> (";
  for (size_t i = 0; i < results.size(); ++i) m << (i ? ", " : "") << results[i].type.str();
  m << ") {\n" << body_.str() << "    \"func.return\"(" << names(results) << ") : "
    << sig(results) << " -> ()\n  }\n";
  return m.str();
}

void Builder::add_functions(const std::string& symbol, const std::string& text) {
  functions_.emplace(symbol, text);
}

std::vector<Value> Builder::call(const std::string& callee, const std::vector<Value>& args,
                                 const std::vector<Type>& results) {
  std::string name = fresh();
  body_ << std::string(depth_ * 2, ' ') << name
        << (results.size() > 1 ? ":" + std::to_string(results.size()) : "") << " = \"func.call\"("
        << names(args) << ") {callee = @" << callee << "} : " << sig(args) << " -> (";
  for (size_t i = 0; i < results.size(); ++i) body_ << (i ? ", " : "") << results[i].str();
  body_ << ")\n";
  return multi(name, results);
}

std::string Builder::finish(const std::vector<Value>& results) {
  std::string m = "module @torch_tpu {\n";
  for (auto& [symbol, text] : functions_) m += text;
  return m + function("main", results, true) + "}\n";
}

}  // namespace tpu::ir
