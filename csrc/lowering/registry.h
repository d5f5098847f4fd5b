// The lowering registry: one small rule per ATen op, turning the op's inputs into
// StableHLO values. Rules see values and plain arguments only, never buffers or
// PyTorch tensors; the backend feeds them through `Ctx`.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/builder.h"

namespace tpu::lowering {

using ir::Builder;
using ir::Shape;
using ir::Type;
using ir::Value;

// A rule that cannot lower this particular call (an argument it does not support)
// throws Unsupported; the backend then runs the op through the counted fallback.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A call CPU rejects for its dtypes: raised as NotImplementedError, `"<what>" not
// implemented for '<first tensor's dtype>'`, as CPU does. Other argument errors a rule
// finds (values of non-tensor arguments) throw std::invalid_argument: a RuntimeError.
struct DtypeNotImplemented : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A check (Ctx::check) the arguments' shapes alone fail: raised when the call is planned,
// as its message asks (IndexError, or RuntimeError for a "RuntimeError: " prefix).
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What a rule can ask of the op being lowered. Argument indices follow the ATen
// schema of the functional op (`add.Tensor`: 0 self, 1 other, 2 alpha).
class Ctx {
 public:
  virtual ~Ctx() = default;
  Builder& b;
  explicit Ctx(Builder& builder) : b(builder) {}

  virtual const std::string& op() const = 0;
  virtual int num_args() const = 0;
  virtual bool is_none(int i) const = 0;
  virtual bool is_tensor(int i) const = 0;  // Tensor (or a wrapped Python number)

  virtual Value in(int i) = 0;                                       // Tensor
  virtual std::vector<Value> list(int i) = 0;                        // Tensor[]
  virtual std::vector<std::optional<Value>> opt_list(int i) = 0;     // Tensor?[]
  virtual Value scalar(int i, DType t) = 0;                          // Scalar, a runtime operand
  virtual std::vector<Value> scalars(int i, DType t) = 0;            // Scalar[]
  virtual bool scalar_is_float(int i) const = 0;
  // Whether Scalar argument i is an `alpha` equal to 1 (not complex) at this call. Programs
  // are keyed by it, so a rule may drop the multiply and its operand (one less per launch).
  virtual bool alpha_is_one(int i) const { return false; }
  virtual int64_t i(int idx) const = 0;
  virtual double f(int idx) const = 0;
  virtual bool flag(int idx) const = 0;
  virtual std::vector<int64_t> ints(int idx) const = 0;
  virtual std::string str(int idx) const = 0;
  virtual DType dtype_arg(int idx) const = 0;                        // ScalarType
  // Type of a tensor argument without reading it.
  virtual Type type_of(int i) const = 0;
  // Whether tensor argument i is contiguous (its layout, not its values): for the few ops
  // whose CPU results depend on it. (Compiled programs are keyed by layout too.)
  virtual bool contiguous(int i) const { throw Unsupported("argument layout unknown"); }
  // Strides (in elements) of tensor argument i, its layout; empty where unknown. A stride
  // of 0 says the values repeat along that dim (an expand), which a rule may exploit.
  virtual std::vector<int64_t> strides(int i) const { return {}; }

  // The outputs PyTorch expects (from its meta kernels): rules produce these. An output
  // PyTorch leaves undefined (a backward op's output_mask) has dtype Invalid: return
  // any placeholder value for it.
  virtual int num_outs() const = 0;
  virtual Type out(int j) const = 0;

  // Random bits of `t` (unsigned element type) from the op's generator.
  virtual Value random_bits(const Type& t) = 0;

  // A condition on values (a bool scalar) that must hold, like a CUDA device-side
  // assert: when it fails, the op leaves the tensors it writes unchanged and `message`
  // is raised at the next synchronization (at once in Debug mode): an IndexError, or a
  // RuntimeError when `message` starts with "RuntimeError: ".
  virtual void check(const Value& ok, const std::string& message) = 0;
  // check() of index values: CPU's kernels look at those even where the result is empty
  // (a dim of size 0 elsewhere), and so must the backend.
  virtual void check_indices(const Value& ok, const std::string& message) { check(ok, message); }

  // The op's generator state (u64[2]) that random_bits draws from, for rules that
  // compute those same bits elementwise (rnd::threefry_pair).
  virtual Value random_state() = 0;

  // The class its RuntimeArgs::value_class gave this call (0 without one).
  virtual int value_class() const { return 0; }

  // Helpers over the above.
  int64_t i_or(int idx, int64_t dflt) const { return is_none(idx) ? dflt : i(idx); }
  double f_or(int idx, double dflt) const { return is_none(idx) ? dflt : f(idx); }
  bool flag_or(int idx, bool dflt) const { return is_none(idx) ? dflt : flag(idx); }
};

using Rule = std::vector<Value> (*)(Ctx&);

// The value of a number argument at one call (none: omitted, or a tensor there).
struct Number {
  bool none = true;
  bool integral = false;
  int64_t i = 0;
  double f = 0;
};
// The number arguments (`int`, `float`) a rule reads as runtime operands (ctx.scalar), as
// it reads `Scalar` ones, so that a call with new values reuses the compiled program: a
// sampler's bound or probability that changes every step (randint(0, len(buffer))) would
// otherwise compile one program per value. `value_class` maps the values (in the order
// of `indices`) and the first argument's dtype to a small class that the program may
// depend on (ctx.value_class()): the width of the random words a range needs. CPU's
// checks of these values run at every call (backend/kernel_checks.cpp's value checks).
struct RuntimeArgs {
  std::vector<int> indices;
  int (*value_class)(const std::vector<Number>& values, DType self) = nullptr;
};
void register_runtime_args(Rule rule, const RuntimeArgs& args);
const RuntimeArgs* find_runtime_args(Rule rule);

void register_rule(const char* op, Rule rule);
const Rule* find_rule(const std::string& op);
std::vector<std::string> rule_names();
// The names of `op`'s rules: `op` itself and its overloads ("op.<overload>").
std::vector<std::string> overloads_of(const std::string& op);

struct Registrar {
  Registrar(std::initializer_list<const char*> ops, Rule r) {
    for (auto op : ops) register_rule(op, r);
  }
};

struct RuntimeArgsRegistrar {
  RuntimeArgsRegistrar(Rule r, const RuntimeArgs& args) { register_runtime_args(r, args); }
};

#define TPU_CAT2(a, b) a##b
#define TPU_CAT(a, b) TPU_CAT2(a, b)
// TPU_LOWER(fn, "add.Tensor", "add.Scalar") { ...body using ctx... }
#define TPU_LOWER(fn, ...)                                                        \
  static std::vector<Value> fn(Ctx& ctx);                                         \
  static ::tpu::lowering::Registrar TPU_CAT(reg_, fn)({__VA_ARGS__}, fn);         \
  static std::vector<Value> fn(Ctx& ctx)
// After a rule: TPU_RUNTIME_ARGS(uniform_rule, {1, 2}) or TPU_RUNTIME_ARGS(fn, {1, 2}, classify).
#define TPU_RUNTIME_ARGS(fn, ...) \
  static ::tpu::lowering::RuntimeArgsRegistrar TPU_CAT(runtime_args_, fn)(fn, ::tpu::lowering::RuntimeArgs{__VA_ARGS__})

}  // namespace tpu::lowering
