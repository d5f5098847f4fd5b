// Text of one collective's module (generic op syntax, like ir/builder.cpp's programs).
// Semantics from StableHLO's spec. all_reduce, all_gather and reduce_scatter carry a
// channel handle (no use_global_device_ids: groups of replica ids across the one
// partition); all_to_all and collective_permute none (cross_replica).
#include "ir/collectives.h"

#include <set>
#include <sstream>

#include "ir/builder.h"

namespace tpu::ir {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::string describe(const CollectiveSpec& s) {
  return std::string(collective_name(s.kind)) + " of " + mlir_name(s.dtype) + shape_str(s.shape);
}

[[noreturn]] void refuse(const CollectiveSpec& s, const std::string& why) {
  throw UnsupportedCollective("collective " + describe(s) + " over " +
                              std::to_string(s.num_replicas) + " replicas: " + why);
}

std::string tensor(DType t, const std::vector<int64_t>& shape) { return Type{t, shape}.str(); }

std::vector<std::vector<int64_t>> groups_of(const CollectiveSpec& s) {
  if (!s.groups.empty()) return s.groups;
  std::vector<int64_t> all;
  for (int64_t i = 0; i < s.num_replicas; ++i) all.push_back(i);
  return {all};
}

// dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>
std::string i64_matrix(const std::vector<std::vector<int64_t>>& rows) {
  std::string r = "dense<[";
  for (size_t i = 0; i < rows.size(); ++i) r += (i ? ", " : "") + shape_str(rows[i]);
  size_t cols = rows.empty() ? 0 : rows[0].size();
  return r + "]> : tensor<" + std::to_string(rows.size()) + "x" + std::to_string(cols) + "xi64>";
}

// For all_reduce, all_gather and reduce_scatter. all_to_all and collective_permute take
// none: with a channel their processes are partitions (cross_partition), and here the
// participants are replicas.
std::string channel_attr(int64_t channel) {
  // type 1: DEVICE_TO_DEVICE.
  return channel > 0 ? ", channel_handle = #stablehlo.channel_handle<handle = " +
                           std::to_string(channel) + ", type = 1>"
                     : "";
}

// The region's op. XLA matches a collective's region to SUM, PRODUCT, MIN or MAX (and/or
// only on predicates), so bool (as 0/1 bytes) reduces with max for or and min for and.
const char* reduce_op(ReduceKind r, bool boolean) {
  switch (r) {
    case ReduceKind::Sum: case ReduceKind::Avg: return boolean ? "stablehlo.maximum" : "stablehlo.add";
    case ReduceKind::Product: return boolean ? "stablehlo.minimum" : "stablehlo.multiply";
    case ReduceKind::Min: return "stablehlo.minimum";
    case ReduceKind::Max: return "stablehlo.maximum";
    case ReduceKind::BitAnd: return boolean ? "stablehlo.minimum" : "stablehlo.and";
    case ReduceKind::BitOr: return boolean ? "stablehlo.maximum" : "stablehlo.or";
    case ReduceKind::BitXor: return "stablehlo.xor";
  }
  return "";
}

// Reductions no collective region expresses portably (bitwise on integers, xor on bool):
// the operands are gathered and reduced locally instead, bit-exact.
bool reduced_locally(ReduceKind r, bool boolean) {
  if (r == ReduceKind::BitXor) return true;
  return !boolean && (r == ReduceKind::BitAnd || r == ReduceKind::BitOr);
}

// The identity of a local bitwise reduction: all ones for and, else zero.
std::string bitwise_identity(ReduceKind r, DType t) {
  if (r != ReduceKind::BitAnd) return "0";
  switch (t) {
    case DType::U8: return "255";
    case DType::U16: return "65535";
    case DType::U32: return "4294967295";
    case DType::U64: return "18446744073709551615";
    default: return "-1";
  }
}

// A splat constant `v` of type t[shape] as MLIR spells it.
std::string splat(DType t, const std::vector<int64_t>& shape, int64_t v) {
  std::string lit;
  if (is_complex(t)) lit = "(" + std::to_string(v) + ".0, 0.0)";
  else if (is_float(t)) lit = std::to_string(v) + ".0";
  else lit = std::to_string(v);
  return "dense<" + lit + "> : " + tensor(t, shape);
}

class Text {
 public:
  std::string fresh() { return "%v" + std::to_string(next_++); }
  std::ostringstream& line() { return static_cast<std::ostringstream&>(body_ << "    "); }
  std::ostringstream& more() { return body_; }  // continues the current line
  std::string body() const { return body_.str(); }
  // A binary elementwise op; returns its result.
  std::string binary(const char* op, const std::string& a, const std::string& b,
                     const std::string& type, const std::string& result_type) {
    std::string r = fresh();
    line() << r << " = \"" << op << "\"(" << a << ", " << b << ") : (" << type << ", " << type
           << ") -> " << result_type << "\n";
    return r;
  }
  std::string constant(const std::string& dense, const std::string& type) {
    std::string r = fresh();
    line() << r << " = \"stablehlo.constant\"() {value = " << dense << "} : () -> " << type << "\n";
    return r;
  }
  std::string convert(const std::string& x, const std::string& from, const std::string& to) {
    std::string r = fresh();
    line() << r << " = \"stablehlo.convert\"(" << x << ") : (" << from << ") -> " << to << "\n";
    return r;
  }
  // The reduction region of all_reduce / reduce_scatter, on scalars of `elem`.
  void region(const char* op, const std::string& elem) {
    std::string a = fresh(), b = fresh(), r = fresh();  // one namespace with the body's
    body_ << " ({\n    ^bb0(" << a << ": " << elem << ", " << b << ": " << elem << "):\n"
          << "      " << r << " = \"" << op << "\"(" << a << ", " << b << ") : (" << elem << ", "
          << elem << ") -> " << elem << "\n      \"stablehlo.return\"(" << r << ") : (" << elem
          << ") -> ()\n    })";
  }
  std::string reshape(const std::string& x, const std::string& from, const std::string& to) {
    std::string r = fresh();
    line() << r << " = \"stablehlo.reshape\"(" << x << ") : (" << from << ") -> " << to << "\n";
    return r;
  }
  // x reduced over dimension `dim` with `op` from `init` (a scalar constant literal).
  std::string reduce(const std::string& x, const std::string& x_type, int64_t dim, const char* op,
                     const std::string& init, const std::string& elem, const std::string& out_type) {
    std::string i = constant("dense<" + init + "> : " + elem, elem);
    std::string r = fresh();
    line() << r << " = \"stablehlo.reduce\"(" << x << ", " << i << ")";
    region(op, elem);
    body_ << " {dimensions = array<i64: " << dim << ">} : (" << x_type << ", " << elem << ") -> "
          << out_type << "\n";
    return r;
  }

 private:
  std::ostringstream body_;
  int next_ = 0;
};

void check_groups(const CollectiveSpec& s, const std::vector<std::vector<int64_t>>& groups) {
  if (s.num_replicas < 1) refuse(s, "needs at least one replica");
  std::set<int64_t> seen;
  for (auto& g : groups) {
    if (g.empty() || g.size() != groups[0].size()) refuse(s, "replica groups must be non-empty and of one size");
    for (int64_t r : g) {
      if (r < 0 || r >= s.num_replicas) refuse(s, "replica " + std::to_string(r) + " is out of range");
      if (!seen.insert(r).second) refuse(s, "replica " + std::to_string(r) + " is in two groups");
    }
  }
  if (static_cast<int64_t>(seen.size()) != s.num_replicas)
    refuse(s, "replica groups must cover every replica");
}

void check_dtype(const CollectiveSpec& s) {
  if (s.dtype == DType::Invalid || itemsize(s.dtype) == 0) refuse(s, "no such element type");
  bool reduces = s.kind == CollectiveKind::AllReduce || s.kind == CollectiveKind::ReduceScatter;
  if (!reduces) return;
  bool bitwise = s.reduce == ReduceKind::BitAnd || s.reduce == ReduceKind::BitOr ||
                 s.reduce == ReduceKind::BitXor;
  if (bitwise && !is_integral(s.dtype) && s.dtype != DType::Bool)
    refuse(s, std::string(reduce_name(s.reduce)) + " takes integers and bool only");
  if ((s.reduce == ReduceKind::Min || s.reduce == ReduceKind::Max) && is_complex(s.dtype))
    refuse(s, std::string(reduce_name(s.reduce)) + " does not order complex numbers");
  if (s.reduce == ReduceKind::Avg && s.dtype == DType::Bool) refuse(s, "AVG does not take bool");
}

int64_t check_dim(const CollectiveSpec& s, int64_t group) {
  int64_t rank = static_cast<int64_t>(s.shape.size());
  if (s.dim < 0 || s.dim >= rank) refuse(s, "dimension " + std::to_string(s.dim) + " is out of range");
  bool splits = s.kind == CollectiveKind::ReduceScatter || s.kind == CollectiveKind::AllToAll;
  if (splits && s.shape[s.dim] % group != 0)
    refuse(s, "dimension " + std::to_string(s.dim) + " (size " + std::to_string(s.shape[s.dim]) +
                  ") does not split evenly into " + std::to_string(group) +
                  " pieces (uneven pieces are not supported)");
  return s.shape[s.dim];
}

void check_pairs(const CollectiveSpec& s) {
  std::set<int64_t> sources, targets;
  for (auto& [a, b] : s.pairs) {
    if (a < 0 || a >= s.num_replicas || b < 0 || b >= s.num_replicas)
      refuse(s, "pair (" + std::to_string(a) + ", " + std::to_string(b) + ") is out of range");
    if (!sources.insert(a).second || !targets.insert(b).second)
      refuse(s, "each replica may send to one target and receive from one source");
  }
}

// Broadcast as a binary tree of permutes: at step k, members at distance [0, 2^k) from
// the root send to the member 2^k further on, which keeps what it received. log2(group)
// permutes; a permute's sources and targets are each distinct, as the spec requires.
std::string emit_broadcast(Text& t, const CollectiveSpec& s, const std::string& x0, DType wire,
                           const std::vector<std::vector<int64_t>>& groups) {
  const int64_t g = static_cast<int64_t>(groups[0].size());
  std::string ty = tensor(wire, s.shape);
  // Each replica's distance from its group's root.
  std::vector<int64_t> rel(s.num_replicas);
  for (auto& grp : groups)
    for (int64_t i = 0; i < g; ++i) rel[grp[i]] = (i - s.root + g) % g;
  std::string table = "dense<" + shape_str(rel) + "> : tensor<" + std::to_string(s.num_replicas) + "xi32>";
  std::string tab = t.constant(table, "tensor<" + std::to_string(s.num_replicas) + "xi32>");
  std::string id = t.fresh();
  t.line() << id << " = \"stablehlo.replica_id\"() : () -> tensor<ui32>\n";
  std::string idi = t.convert(id, "tensor<ui32>", "tensor<i32>");
  std::string slot = t.fresh();
  t.line() << slot << " = \"stablehlo.dynamic_slice\"(" << tab << ", " << idi
           << ") {slice_sizes = array<i64: 1>} : (tensor<" << s.num_replicas
           << "xi32>, tensor<i32>) -> tensor<1xi32>\n";
  std::string me = t.fresh();
  t.line() << me << " = \"stablehlo.reshape\"(" << slot << ") : (tensor<1xi32>) -> tensor<i32>\n";
  std::string x = x0;
  for (int64_t step = 1; step < g; step *= 2) {
    std::vector<std::vector<int64_t>> pairs;
    for (auto& grp : groups)
      for (int64_t d = 0; d < step && d + step < g; ++d)
        pairs.push_back({grp[(s.root + d) % g], grp[(s.root + d + step) % g]});
    std::string got = t.fresh();
    t.line() << got << " = \"stablehlo.collective_permute\"(" << x
             << ") {source_target_pairs = " << i64_matrix(pairs) << "} : (" << ty << ") -> " << ty
             << "\n";
    std::string lo = t.constant("dense<" + std::to_string(step) + "> : tensor<i32>", "tensor<i32>");
    std::string hi = t.constant("dense<" + std::to_string(2 * step) + "> : tensor<i32>", "tensor<i32>");
    std::string ge = t.fresh(), lt = t.fresh();
    t.line() << ge << " = \"stablehlo.compare\"(" << me << ", " << lo
             << ") {comparison_direction = #stablehlo<comparison_direction GE>} : (tensor<i32>, "
                "tensor<i32>) -> tensor<i1>\n";
    t.line() << lt << " = \"stablehlo.compare\"(" << me << ", " << hi
             << ") {comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i32>, "
                "tensor<i32>) -> tensor<i1>\n";
    std::string take = t.binary("stablehlo.and", ge, lt, "tensor<i1>", "tensor<i1>");
    std::string mask = t.fresh();
    t.line() << mask << " = \"stablehlo.broadcast_in_dim\"(" << take
             << ") {broadcast_dimensions = array<i64>} : (tensor<i1>) -> "
             << tensor(DType::Bool, s.shape) << "\n";
    std::string next = t.fresh();
    t.line() << next << " = \"stablehlo.select\"(" << mask << ", " << got << ", " << x << ") : ("
             << tensor(DType::Bool, s.shape) << ", " << ty << ", " << ty << ") -> " << ty << "\n";
    x = next;
  }
  return x;
}

}  // namespace

const char* collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllToAll: return "all_to_all";
    case CollectiveKind::Permute: return "collective_permute";
    case CollectiveKind::Broadcast: return "broadcast";
  }
  return "?";
}

const char* reduce_name(ReduceKind r) {
  switch (r) {
    case ReduceKind::Sum: return "SUM";
    case ReduceKind::Avg: return "AVG";
    case ReduceKind::Product: return "PRODUCT";
    case ReduceKind::Min: return "MIN";
    case ReduceKind::Max: return "MAX";
    case ReduceKind::BitAnd: return "BAND";
    case ReduceKind::BitOr: return "BOR";
    case ReduceKind::BitXor: return "BXOR";
  }
  return "?";
}

std::string CollectiveSpec::key() const {
  std::ostringstream k;
  k << collective_name(kind) << '|' << mlir_name(dtype) << shape_str(shape) << '|' << num_replicas
    << '|';
  for (auto& g : groups) k << shape_str(g);
  k << '|' << reduce_name(reduce) << '|' << dim << '|';
  for (auto& [a, b] : pairs) k << a << '>' << b << ',';
  k << '|' << root << '|' << channel;
  return k.str();
}

std::vector<int64_t> collective_result_shape(const CollectiveSpec& s) {
  std::vector<int64_t> out = s.shape;
  int64_t g = static_cast<int64_t>(groups_of(s)[0].size());
  if (s.kind == CollectiveKind::AllGather) out[s.dim] *= g;
  if (s.kind == CollectiveKind::ReduceScatter) out[s.dim] /= g;
  return out;
}

std::string collective_module(const CollectiveSpec& s) {
  auto groups = groups_of(s);
  check_groups(s, groups);
  check_dtype(s);
  const int64_t g = static_cast<int64_t>(groups[0].size());
  if (s.kind == CollectiveKind::AllGather || s.kind == CollectiveKind::ReduceScatter ||
      s.kind == CollectiveKind::AllToAll)
    check_dim(s, g);
  if (s.kind == CollectiveKind::Permute) check_pairs(s);
  if (s.kind == CollectiveKind::Broadcast && (s.root < 0 || s.root >= g))
    refuse(s, "root " + std::to_string(s.root) + " is not a member position of a group of " +
                  std::to_string(g));
  std::vector<int64_t> out_shape = collective_result_shape(s);

  // Bool travels as i8 (not every runtime's collectives take predicates): or, and and
  // xor are max, min and xor of 0/1 bytes.
  const bool boolean = s.dtype == DType::Bool;
  const DType wire = boolean ? DType::I8 : s.dtype;
  const std::string in_ty = tensor(s.dtype, s.shape), out_ty = tensor(s.dtype, out_shape);
  const std::string wire_in = tensor(wire, s.shape), wire_out = tensor(wire, out_shape);
  const std::string elem = tensor(wire, {});
  const std::string groups_attr = "replica_groups = " + i64_matrix(groups);

  Text t;
  std::string x = "%arg0";
  if (boolean) x = t.convert(x, in_ty, wire_in);
  std::string r = t.fresh();
  switch (s.kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::ReduceScatter: {
      bool all = s.kind == CollectiveKind::AllReduce;
      if (reduced_locally(s.reduce, boolean)) {
        const char* op = reduce_op(s.reduce, boolean);
        std::string init = bitwise_identity(s.reduce, wire);
        if (all) {
          // Every member's operand, stacked on a new leading dimension, reduced over it.
          std::vector<int64_t> one = s.shape, stacked = s.shape;
          one.insert(one.begin(), 1);
          stacked.insert(stacked.begin(), g);
          std::string x1 = t.reshape(x, wire_in, tensor(wire, one));
          t.line() << r << " = \"stablehlo.all_gather\"(" << x1 << ") {all_gather_dim = 0 : i64, "
                   << groups_attr << channel_attr(s.channel) << "} : (" << tensor(wire, one)
                   << ") -> " << tensor(wire, stacked) << "\n";
          r = t.reduce(r, tensor(wire, stacked), 0, op, init, elem, wire_out);
        } else {
          // all_to_all hands member j piece j of every member, in group order along `dim`:
          // split that dimension into (member, piece) and reduce over the members.
          std::vector<int64_t> split = s.shape;
          split[s.dim] = out_shape[s.dim];
          split.insert(split.begin() + s.dim, g);
          t.line() << r << " = \"stablehlo.all_to_all\"(" << x << ") {concat_dimension = " << s.dim
                   << " : i64, " << groups_attr << ", split_count = " << g
                   << " : i64, split_dimension = " << s.dim << " : i64} : (" << wire_in << ") -> "
                   << wire_in << "\n";
          std::string parts = t.reshape(r, wire_in, tensor(wire, split));
          r = t.reduce(parts, tensor(wire, split), s.dim, op, init, elem, wire_out);
        }
        break;
      }
      t.line() << r << " = \"stablehlo." << (all ? "all_reduce" : "reduce_scatter") << "\"(" << x
               << ")";
      t.region(reduce_op(s.reduce, boolean), elem);
      std::ostringstream& l = t.more();
      l << " {" << groups_attr << channel_attr(s.channel);
      if (!all) l << ", scatter_dimension = " << s.dim << " : i64";
      l << "} : (" << wire_in << ") -> " << wire_out << "\n";
      if (s.reduce == ReduceKind::Avg) {
        std::string n = t.constant(splat(wire, out_shape, g), wire_out);
        // Integers divide truncating toward zero, as c10d's AVG on the host does.
        r = t.binary("stablehlo.divide", r, n, wire_out, wire_out);
      }
      break;
    }
    case CollectiveKind::AllGather:
      t.line() << r << " = \"stablehlo.all_gather\"(" << x << ") {all_gather_dim = " << s.dim
               << " : i64, " << groups_attr << channel_attr(s.channel) << "} : (" << wire_in
               << ") -> " << wire_out << "\n";
      break;
    case CollectiveKind::AllToAll:
      t.line() << r << " = \"stablehlo.all_to_all\"(" << x << ") {concat_dimension = " << s.dim
               << " : i64, " << groups_attr << ", split_count = " << g
               << " : i64, split_dimension = " << s.dim << " : i64} : (" << wire_in << ") -> "
               << wire_out << "\n";
      break;
    case CollectiveKind::Permute: {
      std::vector<std::vector<int64_t>> pairs;
      for (auto& [a, b] : s.pairs) pairs.push_back({a, b});
      if (pairs.empty()) {  // nobody sends: every replica gets zeros
        r = t.constant(splat(wire, s.shape, 0), wire_in);
        break;
      }
      t.line() << r << " = \"stablehlo.collective_permute\"(" << x
               << ") {source_target_pairs = " << i64_matrix(pairs) << "} : (" << wire_in << ") -> "
               << wire_out << "\n";
      break;
    }
    case CollectiveKind::Broadcast:
      r = emit_broadcast(t, s, x, wire, groups);
      break;
  }
  if (boolean) r = t.convert(r, wire_out, out_ty);

  std::ostringstream m;
  m << "module @tpu_collective attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = "
    << s.num_replicas << " : i32} {\n  func.func public @main(%arg0: " << in_ty << ") -> ("
    << out_ty << ") {\n"
    << t.body() << "    \"func.return\"(" << r << ") : (" << out_ty << ") -> ()\n  }\n}\n";
  return m.str();
}

}  // namespace tpu::ir
