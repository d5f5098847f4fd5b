// A small emitter of StableHLO programs as MLIR text (generic op syntax).
// One Builder makes one `main` function; values are SSA names with their types.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace tpu::ir {

using Shape = std::vector<int64_t>;

struct Type {
  DType dtype = DType::F32;
  Shape shape;
  std::string str() const;  // tensor<2x3xf32>
  int64_t numel() const;
  int rank() const { return static_cast<int>(shape.size()); }
};

struct Value {
  std::string name;  // %v3, %r1#0, %arg2
  Type type;
  DType dtype() const { return type.dtype; }
  const Shape& shape() const { return type.shape; }
  int rank() const { return type.rank(); }
};

enum class Cmp { EQ, NE, LT, LE, GT, GE };

// How many bf16 passes an f32 contraction may take on hardware whose matrix units are
// narrower (TPU MXU, GPU tensor cores): Default one, High three, Highest full f32.
// XLA's own default is Default, so a dot that names none is not the f32 product
// PyTorch computes by default.
enum class DotPrecision : uint8_t { Default, High, Highest };

class Builder;
// Body of a region: takes the block arguments, returns the values to yield.
using RegionFn = std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>;

class Builder {
 public:
  Builder() = default;

  // Function parameters, in the order the caller passes buffers.
  Value param(const Type& t);
  int num_params() const { return static_cast<int>(params_.size()); }
  // A number fixed when the program is built (a count from the shapes) that the program
  // takes as a runtime operand, not a literal: XLA rewrites x / literal into
  // x * (1 / literal), which is not the correctly rounded quotient that CPU's division
  // gives (a mean of 1000 copies of 60000.f gives 60000.0039). The backend running the
  // program supplies the operand (set_number_operands); without it, or inside a region
  // (which cannot see parameters), this is a literal.
  Value number(double v, DType t);
  using NumberOperandFn = std::function<Value(Builder&, double v, DType t)>;
  void set_number_operands(NumberOperandFn fn) { number_operand_ = std::move(fn); }

  // Elementwise. Operands of binary ops must already share shape and dtype.
  Value unary(const std::string& op, const Value& x);
  Value binary(const std::string& op, const Value& a, const Value& b);
  Value compare(const Value& a, const Value& b, Cmp dir);
  Value select(const Value& pred, const Value& a, const Value& b);
  Value clamp(const Value& lo, const Value& x, const Value& hi);
  Value convert(const Value& x, DType to);
  Value bitcast(const Value& x, DType to);

  // A constant filling `shape`.
  Value constant(double v, DType t, const Shape& shape = {});
  Value iota(const Type& t, int64_t dim);

  // Shapes. These, select, gather and a scatter that stores its updates only move
  // elements: they keep every bit, NaN payloads of the narrow floats included.
  Value reshape(const Value& x, const Shape& shape);
  Value broadcast_in_dim(const Value& x, const Shape& shape, const std::vector<int64_t>& dims);
  Value transpose(const Value& x, const std::vector<int64_t>& perm);
  Value slice(const Value& x, const Shape& start, const Shape& limit, const Shape& strides);
  Value concatenate(const std::vector<Value>& xs, int64_t dim);
  Value pad(const Value& x, const Value& padv, const Shape& lo, const Shape& hi, const Shape& interior);
  Value reverse(const Value& x, const std::vector<int64_t>& dims);
  Value dynamic_update_slice(const Value& x, const Value& update, const std::vector<Value>& starts);
  Value dynamic_slice(const Value& x, const std::vector<Value>& starts, const Shape& sizes);

  // Reductions and regions.
  std::vector<Value> reduce(const std::vector<Value>& xs, const std::vector<Value>& inits,
                            const std::vector<int64_t>& dims, const RegionFn& body);
  Value reduce(const Value& x, const Value& init, const std::vector<int64_t>& dims,
               const std::string& op);
  Value reduce_window(const Value& x, const Value& init, const Shape& window, const Shape& strides,
                      const std::vector<std::pair<int64_t, int64_t>>& padding,
                      const std::string& op);
  // Several operands reduced together over each window (a value and its index, say);
  // `dilations` spaces the window's taps (empty: 1); padding takes the init values.
  std::vector<Value> reduce_window(const std::vector<Value>& xs, const std::vector<Value>& inits,
                                   const Shape& window, const Shape& strides, const Shape& dilations,
                                   const std::vector<std::pair<int64_t, int64_t>>& padding,
                                   const RegionFn& body);
  // A loop over `init` (the carried state): `cond` returns a scalar i1 from the
  // state, `body` the next state. Returns the final state.
  std::vector<Value> while_loop(const std::vector<Value>& init, const RegionFn& cond,
                                const RegionFn& body);
  // The values unchanged, but XLA may not move computation across the barrier or merge
  // what depends on its results with what does not (how recomputation is kept apart).
  std::vector<Value> optimization_barrier(const std::vector<Value>& xs);
  // x unchanged, bit for bit, but computed from `dep` too: XLA then neither merges it
  // with x's other uses nor computes what reads it before `dep` exists (XLA:CPU drops
  // barriers before it merges equal computations, so recomputation needs this).
  // `dep` must have an element.
  Value after(const Value& x, const Value& dep);
  std::vector<Value> sort(const std::vector<Value>& xs, int64_t dim, bool stable,
                          const RegionFn& comparator);
  // x unchanged, bit for bit, as a value XLA computes once: the result of a reduction,
  // which XLA never copies into several fusions, where it copies a chain of cheap ops
  // into every reader (XLA:CPU drops optimization barriers before fusion). Complex x is
  // returned as it is.
  Value materialized(const Value& x);

  // f32 operands take the program's matmul precision (set_matmul_precision), unless
  // `fixed` names one: products that spell out sums, pooling or linear algebra are
  // not matmuls to the user and stay exact.
  Value dot_general(const Value& a, const Value& b, const std::vector<int64_t>& batch_a,
                    const std::vector<int64_t>& batch_b, const std::vector<int64_t>& contract_a,
                    const std::vector<int64_t>& contract_b, DType out,
                    std::optional<DotPrecision> fixed = std::nullopt);
  // The `precision_config` attribute (with its leading ", ") of a dot or convolution
  // of a and b; empty where the operands are not f32.
  std::string precision_config(const Value& a, const Value& b,
                               std::optional<DotPrecision> fixed = std::nullopt);
  void set_matmul_precision(DotPrecision p) { matmul_precision_ = p; }
  DotPrecision matmul_precision() const { return matmul_precision_; }
  // Whether the program so far depends on the matmul precision.
  bool reads_matmul_precision() const { return reads_matmul_precision_; }
  // Set by a rule whose program is one step of a recurrence (an RNN cell): a fused graph
  // holds a bounded number of them (backend/deferred.cpp).
  void mark_recurrent_step() { recurrent_step_ = true; }
  bool recurrent_step() const { return recurrent_step_; }
  Value gather(const Value& operand, const Value& indices, const std::vector<int64_t>& offset_dims,
               const std::vector<int64_t>& collapsed_dims, const std::vector<int64_t>& start_index_map,
               int64_t index_vector_dim, const Shape& slice_sizes, const Shape& out_shape);
  Value scatter(const Value& operand, const Value& indices, const Value& updates,
                const std::vector<int64_t>& update_window_dims,
                const std::vector<int64_t>& inserted_window_dims,
                const std::vector<int64_t>& scatter_dims_to_operand_dims, int64_t index_vector_dim,
                const RegionFn& combine);
  // Returns {new_state, bits} with bits of unsigned type `bits_type`.
  std::pair<Value, Value> rng_bit_generator(const Value& state, const Type& bits_type);

  // An op spelled out by the caller: `"name"(operands) {attrs} : (...) -> result`.
  Value raw(const std::string& op, const std::vector<Value>& operands, const std::string& attrs,
            const Type& result);

  // Functions this program calls besides its own (imported modules, see ir/external.h):
  // `text` defines `symbol` and whatever it calls, added once per symbol.
  void add_functions(const std::string& symbol, const std::string& text);
  const std::map<std::string, std::string>& functions() const { return functions_; }
  // A call of one of those functions.
  std::vector<Value> call(const std::string& callee, const std::vector<Value>& args,
                          const std::vector<Type>& results);

  // The whole module, returning `results`.
  std::string finish(const std::vector<Value>& results);
  // The same program as one function of a larger module (see ir/fusion.h).
  std::string function(const std::string& name, const std::vector<Value>& results,
                       bool is_public) const;
  const std::vector<Type>& params() const { return params_; }

 private:
  std::string fresh();
  // Whether a scatter region stores the update as it is (no arithmetic).
  static bool replaces(const RegionFn& combine, DType t);
  std::string sig(const std::vector<Value>& operands) const;
  void emit_region(const std::vector<Type>& arg_types, const RegionFn& fn);  // " ({...})"
  void emit_block(const std::vector<Type>& arg_types, const RegionFn& fn);   // "{...}"

  std::vector<Type> params_;
  NumberOperandFn number_operand_;
  std::map<std::string, std::string> functions_;  // by symbol
  std::ostringstream body_;
  int next_ = 0;
  int depth_ = 1;
  DotPrecision matmul_precision_ = DotPrecision::Highest;  // PyTorch's default
  bool reads_matmul_precision_ = false;
  bool recurrent_step_ = false;
};

// Helpers shared by rules.
std::string ints(const std::vector<int64_t>& v);        // 1, 2, 3
std::string i64_array(const std::vector<int64_t>& v);   // array<i64: 1, 2, 3>
Shape contiguous_strides(const Shape& shape);

}  // namespace tpu::ir
