// The one kernel behind every lowered ATen op. Per call it builds the op's signature
// (op, dtypes, shapes, strides, compile-time arguments) and looks up a plan; only on a
// miss does it ask PyTorch's meta kernel for the outputs, run the lowering rule, emit
// StableHLO and compile. In-place and out= variants reuse the functional rule: the
// program writes the result into the mutated tensor's storage.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include "runtime/launch_probe.h"
#include "backend/foreach_order.h"
#include "backend/dtype_support.h"
#include "backend/kernel_checks.h"
#include "backend/device.h"
#include "backend/captured_graph.h"
#include "backend/device_checks.h"
#include "backend/dtypes.h"
#include "backend/executor.h"
#include "ir/external.h"
#include "backend/fallback.h"
#include "backend/inplace_donation.h"
#include "backend/storage.h"
#include "backend/structured_meta.h"
#include "ir/views.h"
#include "lowering/helpers.h"
#include "lowering/registry.h"

namespace tpu::backend {
bool is_glue_op(const std::string& name);  // glue_ops.cpp
bool redispatch_with_mask_coordinates(const c10::OperatorHandle& op, torch::jit::Stack* stack);
bool wants_sparse_variant(const c10::OperatorHandle& op, const torch::jit::Stack& stack);  // sparse_ops.cpp
void run_sparse_variant(const c10::OperatorHandle& op, torch::jit::Stack* stack);
bool try_host_fill(const at::Tensor& self, const c10::Scalar& value);  // constant_fill.cpp
namespace {

using c10::IValue;
using lowering::Value;

struct OpInfo {
  std::string name;  // add_.Tensor
  const char* ns = "aten";  // or torch_tpu (call_stablehlo): errors name the op in full
  std::string base, base_overload;  // add, add.Tensor (no trailing _): the refusal tables' keys
  const lowering::Rule* rule = nullptr;
  const lowering::Rule* complex_rule = nullptr;  // "complex:<op>": calls with complex values
  int num_args = 0;
  std::vector<int> mutated;      // written args, in schema order
  std::vector<bool> is_scalar;   // `Scalar` / `Scalar[]` args, and the rule's RuntimeArgs: runtime operands
  const lowering::RuntimeArgs* runtime_args = nullptr;
  int generator_arg = -1;
  bool is_out = false;
  bool check_internal_overlap = true;  // of a written arg (CPU's TensorIterator check)
  bool check_input_overlap = true;     // between a written arg and a read one
  bool check_any_input_overlap = false;  // the same view too (index_add_(0, i, self))
  bool host_fill = false;              // fill_.Scalar, zero_: may run no program
  bool fill_from_tensor = false;       // fill_.Tensor: a value on another device is read
  int cpu_indices_arg = -1;            // advanced indexing's Tensor?[]: cpu ones move over
  int cpu_tensor_arg = -1;             // a Tensor CUDA's kernel moves to the device (bernoulli's p)
  // Per return: the argument index it aliases, or one of these.
  static constexpr int kFreshReturn = -1, kListReturn = -2, kNoArgument = -3;
  std::vector<int> ret_alias;
  // A pointwise out= op with one out (mul.out): its functional op (mul.Tensor), which
  // computes in the inputs' common dtype when `out` has another.
  std::optional<c10::OperatorHandle> functional;
  // A pointwise in-place op (mul_.Tensor): its functional op (mul.Tensor), whose result
  // dtype must cast to self's, as CPU's TensorIterator checks (some meta kernels do not).
  std::optional<c10::OperatorHandle> inplace_functional;
  KernelCheck kernel_check = nullptr;  // what CPU's kernel checks and the meta function not
  KernelCheck value_check = nullptr;   // what CPU checks of Scalar values at every call
  ComplexRefusal complex_refusal = ComplexRefusal::None;  // CPU refuses complex values
  int dtype_arg = -1;  // an out= op's `ScalarType? dtype`: a given one must be out's
  int alpha_arg = -1;  // a `Scalar alpha`: the signature says whether it is 1 (alpha_is_one)
  bool foreach = false;                // a _foreach_ op
  bool foreach_in_place = false;       // _foreach_add_ & co: writes its first list
  bool promotes_inputs = false;        // CPU computes in its tensor inputs' common dtype
  bool pointwise = false;              // ... and a pointwise op's result has that dtype
  bool traced_as_convolution = false;  // `convolution`: see convolution_for_tracer
};

// Ops whose CPU kernels accept a written tensor with internal overlap (fills, which
// write one value, and reductions) or one partially overlapping an input (contractions
// and softmax compute into a temporary; reductions; fills read no tensor).
bool cpu_allows_internal_overlap(const std::string& base) {
  static const std::set<std::string> ops = {
      "fill", "zero", "masked_fill", "index_fill", "tril", "triu", "index_put", "_index_put_impl",
      "sum", "nansum", "mean", "prod", "amax", "amin", "all", "any", "logsumexp", "norm",
      "linalg_vector_norm", "std", "var"};
  return ops.count(base) > 0;
}
bool cpu_allows_input_overlap(const std::string& base) {
  static const std::set<std::string> ops = {
      "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul",
      "_softmax", "_log_softmax", "masked_fill", "index_fill", "fill", "zero"};
  return cpu_allows_internal_overlap(base) || ops.count(base) > 0;
}

// Ops whose CPU kernels refuse any element shared by the written tensor and an input,
// the same view included (index_add_(0, i, self)): the others refuse partial overlap only.
bool cpu_forbids_any_input_overlap(const std::string& base) {
  static const std::set<std::string> ops = {
      "index_add", "index_copy", "scatter", "scatter_add", "scatter_reduce", "put", "index_put",
      "_index_put_impl", "gather", "index_select", "take", "cat"};
  return ops.count(base) > 0;
}

std::string op_key_name(const c10::OperatorName& n) {
  std::string s = n.name.substr(n.name.find("::") + 2);
  return n.overload_name.empty() ? s : s + "." + n.overload_name;
}

// Ops whose CUDA kernels read their argument checks on the host (a sync) before they
// return, so the error is the call's: multinomial without replacement or of one sample
// (PyTorch's sampler checks the probabilities with .item() on that path), and
// segment_reduce's checks of its lengths when !unsafe (the only ones its rule makes).
static bool checks_at_call(const OpInfo& info, c10::ArrayRef<IValue> args) {
  if (info.base == "segment_reduce") return true;
  if (info.base != "multinomial" || args.size() < 3) return false;
  return !args[2].toBool() || args[1].toInt() == 1;
}

// An `int` or `float` argument (or an optional one): what RuntimeArgs may name.
bool is_int_or_float_type(const c10::TypePtr& t) {
  if (auto opt = t->cast<c10::OptionalType>()) return is_int_or_float_type(opt->getElementType());
  return t->kind() == c10::TypeKind::IntType || t->kind() == c10::TypeKind::FloatType;
}
bool is_runtime_arg(const OpInfo& info, int i) {
  if (!info.runtime_args) return false;
  const std::vector<int>& r = info.runtime_args->indices;
  return std::find(r.begin(), r.end(), i) != r.end();
}

bool is_number_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::NumberType) return true;
  if (auto opt = t->cast<c10::OptionalType>()) return is_number_type(opt->getElementType());
  if (auto list = t->cast<c10::ListType>()) return is_number_type(list->getElementType());
  return false;
}

bool is_written(const OpInfo& info, int arg) {
  return std::find(info.mutated.begin(), info.mutated.end(), arg) != info.mutated.end();
}

// Where the program's parameters come from.
struct Source {
  // Number: a value the rule fixed when building (Builder::number), passed as an operand.
  enum Kind { Storage, Scalar, CpuTensor, Rng, ViewOffset, Number } kind;
  int arg;
  int elem;     // list element, or -1
  DType dtype;  // Scalar, Number: its operand type
  double number = 0;
};

struct ScalarKey {
  uint64_t bytes[2];
  int dtype, device;
  bool operator==(const ScalarKey& o) const {
    return bytes[0] == o.bytes[0] && bytes[1] == o.bytes[1] && dtype == o.dtype && device == o.device;
  }
};

// The device buffer a Scalar or CpuTensor source last read, remembered by its plan: most
// call sites pass the same numbers every time (`x + 1`'s 1 and alpha). Not owned: the
// shared cache alone bounds the device memory scalars hold. A thread finding the memo
// busy goes to the shared cache instead of waiting.
struct ScalarMemo {
  std::atomic<bool> busy{false};
  ScalarKey key{};
  std::weak_ptr<runtime::Buffer> buffer;
};

struct OutSpec {
  bool write;  // into a mutated arg's storage (else a new tensor)
  int arg, elem;
  c10::ScalarType dtype;
  std::vector<int64_t> sizes;
  bool undefined = false;  // an output PyTorch leaves undefined (backward output_mask)
  std::vector<int64_t> strides;  // a new tensor's layout from the meta kernel; empty: contiguous
};

struct Plan {
  std::string key;  // its signature: g_plans' key views it
  ProgramPtr program;
  std::vector<Source> sources;
  std::vector<OutSpec> outs;
  std::vector<int> ret_counts;  // functional ops: tensors per return (Tensor[] > 1)
  bool fallback = false;        // the rule declined this signature
  std::string fallback_reason;
  std::vector<std::string> checks;  // messages of the check flags after the outputs
  bool checks_indices = false;       // some of them check index values
  // Plans of f32 matmuls and convolutions hold the precision they were built with.
  bool reads_matmul_precision = false;
  ir::DotPrecision matmul_precision = ir::DotPrecision::Highest;
  std::unique_ptr<ScalarMemo[]> memos;  // one per source
};

const at::Tensor* tensor_at(c10::ArrayRef<IValue> args, int arg, int elem, at::Tensor* tmp) {
  const IValue& v = args[arg];
  // A plain Tensor argument is read in place: copying an at::Tensor that has a Python
  // object takes the GIL twice (PyObject preservation in the refcount).
  if (elem < 0) return &v.toTensor();
  if (v.isTensorList()) {
    *tmp = v.toTensorList().get(elem);
  } else {
    auto l = v.toOptionalTensorList();
    std::optional<at::Tensor> o = l.get(elem);
    *tmp = o.has_value() ? *o : at::Tensor();
  }
  return tmp;
}

// ---- signature ----------------------------------------------------------------------

// The signature is a compact binary string: a tag byte per item, integers as raw
// 8-byte words, lists and strings prefixed by their length, so no two signatures
// encode alike. It is built in a per-thread buffer whose appends are inline (no
// allocation once warm, no call per byte) and copied only when a new plan is stored.
class KeyBuffer {
 public:
  void clear() { size_ = 0; }
  // Inline at every use: a signature is dozens of appends per call.
  __attribute__((always_inline)) void put(const void* p, size_t n) {
    if (size_ + n > cap_) grow(size_ + n);
    std::memcpy(data_.get() + size_, p, n);
    size_ += n;
  }
  __attribute__((always_inline)) void put(char c) {
    if (size_ == cap_) grow(size_ + 1);
    data_[size_++] = c;
  }
  // Shapes and strides, word by word (a few words: no call to memcpy).
  __attribute__((always_inline)) void put_words(const int64_t* p, size_t n) {
    if (size_ + 8 * n > cap_) grow(size_ + 8 * n);
    for (size_t i = 0; i < n; ++i) std::memcpy(data_.get() + size_ + 8 * i, p + i, 8);
    size_ += 8 * n;
  }
  std::string_view view() const { return {data_.get(), size_}; }

 private:
  __attribute__((noinline, cold)) void grow(size_t need) {
    size_t cap = std::max<size_t>(need, 2 * cap_ + 256);
    std::unique_ptr<char[]> bigger(new char[cap]);
    if (size_) std::memcpy(bigger.get(), data_.get(), size_);
    data_ = std::move(bigger);
    cap_ = cap;
  }
  std::unique_ptr<char[]> data_;
  size_t size_ = 0, cap_ = 0;
};

struct KeyState {
  KeyBuffer& key;
  int device = -1;
  bool has_f64 = false;
  const char* op = "";
  explicit KeyState(KeyBuffer& buf) : key(buf) { key.clear(); }
  __attribute__((always_inline)) void tag(char c) { key.put(c); }
  __attribute__((always_inline)) void word(int64_t v) { key.put(&v, sizeof v); }
  __attribute__((always_inline)) void ints(c10::IntArrayRef v) {
    word(static_cast<int64_t>(v.size()));
    key.put_words(v.data(), v.size());
  }
  void text(std::string_view s) {
    word(static_cast<int64_t>(s.size()));
    key.put(s.data(), s.size());
  }
};

// The storage's type (what storage_type(t) returns) written without building it.
void key_storage(KeyState& k, const at::Tensor& t, const StorageData& s) {
  if (s.value.buffer) {
    k.tag(static_cast<char>(s.value.buffer->dtype()));
    k.ints(s.value.buffer->dims());
  } else if (s.value.slot) {
    k.tag(static_cast<char>(s.value.slot->type().dtype));
    k.ints(s.value.slot->type().shape);
  } else {
    ir::Type st = storage_type(t);
    k.tag('z');
    k.tag(static_cast<char>(st.dtype));
    k.ints(st.shape);
  }
}

void key_tensor(KeyState& k, const at::Tensor& t, bool written = false) {
  if (!t.defined()) {
    k.tag('N');
    return;
  }
  if (t.device().type() == c10::DeviceType::CPU) {
    TORCH_CHECK(t.dim() == 0, k.op, ": expected all tensors on the same device, but got a cpu tensor of shape ",
                t.sizes(), " with tpu tensors (only 0-dim cpu tensors may be mixed in)");
    bool wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
    k.tag(wrapped ? 'w' : 'c');
    k.tag(static_cast<char>(device_dtype(t.scalar_type(), k.op)));
    bool dbl = t.scalar_type() == at::kDouble || t.scalar_type() == at::kComplexDouble;
    if (dbl && !wrapped) k.has_f64 = true;
    return;
  }
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, k.op,
              ": expected tpu tensors, got one on ", t.device());
  int d = device_index(t);
  TORCH_CHECK(k.device < 0 || k.device == d, k.op,
              ": expected all tensors on the same device, but found tpu:", k.device, " and tpu:", d);
  k.device = d;
  DType dt = device_dtype(t.scalar_type(), k.op);
  if (dt == DType::F64 || dt == DType::C128) k.has_f64 = true;
  k.tag('t');
  k.tag(static_cast<char>(dt));
  k.ints(t.sizes());
  k.key.put_words(t.strides().data(), t.strides().size());
  // An operand's offset: the plan takes it where the key says so. The plan asks again
  // once pending writes ran, which only turns a static offset into an operand, never
  // back (a program keyed -1 never holds an offset).
  k.word(offset_is_operand(t, written) ? -1 : t.storage_offset());
  // Writes queued on the storage stay queued (an out= write joins them): the storage
  // keys as the value they will make, of their type.
  StorageData& s = storage_data(t);
  if (s.copy_of) apply_pending(s);
  if (!s.pending.empty()) {
    k.tag(static_cast<char>(s.pending_type.dtype));
    k.ints(s.pending_type.shape);
  } else {
    if (!s.value) check_readable(s);  // a consumed tensor reads (and writes) nothing
    key_storage(k, t, s);
  }
  k.tag(static_cast<char>((t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0)));
}

// Mutated outputs sharing a storage are written in turn (build_plan): plans differ by
// which outputs share. Nothing is written when none do.
void key_shared_outputs(KeyState& k, const OpInfo& info, c10::ArrayRef<IValue> args) {
  std::vector<const c10::StorageImpl*> seen;
  for (int a : info.mutated) {
    const IValue& v = args[a];
    if (!v.isTensor() && !v.isTensorList()) continue;
    std::vector<at::Tensor> ts = v.isTensor() ? std::vector<at::Tensor>{v.toTensor()}
                                              : v.toTensorList().vec();
    for (const at::Tensor& t : ts) {
      if (!t.defined() || !t.is_privateuseone()) continue;
      const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
      size_t first = std::find(seen.begin(), seen.end(), impl) - seen.begin();
      if (first < seen.size()) {
        k.tag('|');
        k.word(static_cast<int64_t>(seen.size()));
        k.word(static_cast<int64_t>(first));
      }
      seen.push_back(impl);
    }
  }
}

// The class the rule's RuntimeArgs::value_class gives this call's values (0 without one).
int value_class_of(const OpInfo& info, c10::ArrayRef<IValue> args) {
  if (!info.runtime_args || !info.runtime_args->value_class) return 0;
  std::vector<lowering::Number> values;
  for (int i : info.runtime_args->indices) {
    lowering::Number n;
    const IValue& v = args.at(i);
    if (v.isInt()) n = {false, true, v.toInt(), static_cast<double>(v.toInt())};
    else if (v.isDouble()) n = {false, false, 0, v.toDouble()};
    values.push_back(n);
  }
  DType self = args.size() > 0 && args[0].isTensor() ? device_dtype(args[0].toTensor().scalar_type(), info.name.c_str())
                                                     : DType::Invalid;
  return info.runtime_args->value_class(values, self);
}

// An alpha of 1, a real number (1 * z is not z for a complex z with an infinity).
bool is_real_one(const c10::Scalar& s) {
  if (s.isFloatingPoint()) return s.toDouble() == 1.0;
  if (s.isIntegral(false)) return s.type() != c10::ScalarType::UInt64 && s.toLong() == 1;
  return false;
}

void key_scalar(KeyState& k, const c10::Scalar& s) {
  // 'u': an integer above INT64_MAX, a u64 operand (scalar_param).
  k.tag(s.isFloatingPoint() ? 'f'
        : s.isBoolean()     ? 'b'
        : s.type() == c10::ScalarType::UInt64 ? 'u'
        : s.isIntegral(false) ? 'i'
                              : 'x');
}

std::string_view build_key(const OpInfo& info, c10::ArrayRef<IValue> args, KeyState& k) {
  k.text(info.name);
  k.op = info.name.c_str();
  for (int i = 0; i < info.num_args; ++i) {
    const IValue& v = args[i];
    bool written = is_written(info, i);
    if (v.isNone()) {
      k.tag('N');
    } else if (v.isTensor()) {
      key_tensor(k, v.toTensor(), written);
    } else if (v.isTensorList()) {
      auto l = v.toTensorList();
      k.tag('L');
      k.word(static_cast<int64_t>(l.size()));
      for (const at::Tensor& t : l) key_tensor(k, t, written);
    } else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
      auto l = v.toOptionalTensorList();
      k.tag('O');
      k.word(static_cast<int64_t>(l.size()));
      for (size_t j = 0; j < l.size(); ++j) {
        std::optional<at::Tensor> o = l.get(j);
        key_tensor(k, o.has_value() ? *o : at::Tensor());
      }
    } else if (info.is_scalar[i] && (v.isScalar() || v.isUnsigned())) {  // isScalar leaves out uint64's
      k.tag('S');
      c10::Scalar s = v.toScalar();
      key_scalar(k, s);
      if (i == info.alpha_arg && is_real_one(s)) k.tag('1');
    } else if (info.is_scalar[i] && v.isList()) {
      auto l = v.toList();
      k.tag('s');
      k.word(static_cast<int64_t>(l.size()));
      for (size_t j = 0; j < l.size(); ++j) key_scalar(k, l.get(j).toScalar());
    } else if (v.isGenerator()) {
      k.tag('G');
    } else if (v.isDouble()) {
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, 8);
      k.tag('d');
      k.word(bits);
    } else if (v.isInt()) {
      k.tag('i');
      k.word(v.toInt());
    } else if (v.isBool()) {
      k.tag(v.toBool() ? 'T' : 'F');
    } else if (v.isIntList()) {
      c10::List<int64_t> l = v.toIntList();
      k.tag('l');
      k.word(static_cast<int64_t>(l.size()));
      for (int64_t x : l) k.word(x);
    } else if (v.isString()) {
      k.tag('"');
      k.text(v.toStringRef());
    } else if (v.isDevice()) {
      k.tag('D');
      k.text(v.toDevice().str());
    } else if (v.isSymInt()) {
      k.tag('i');
      k.word(v.toSymInt().expect_int());
    } else if (v.isSymIntList()) {
      k.tag('l');
      k.ints(C10_AS_INTARRAYREF_SLOW(v.toSymIntVector()));
    } else {
      k.tag('?');
      k.text(v.tagKind());
      k.text(c10::str(v));
    }
  }
  if (info.mutated.size() > 1 || (info.mutated.size() == 1 && args[info.mutated[0]].isTensorList()))
    key_shared_outputs(k, info, args);
  if (info.runtime_args && info.runtime_args->value_class) {
    k.tag('c');
    k.word(value_class_of(info, args));
  }
  return k.key.view();
}

// ---- meta: what PyTorch expects the outputs to be ------------------------------------

// Every tensor of an argument (lists and optional lists too) replaced by fn(tensor).
template <typename F>
IValue map_tensors(const IValue& v, const F& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(fn(t));
    return out;
  }
  if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
    c10::List<std::optional<at::Tensor>> out;
    auto l = v.toOptionalTensorList();
    for (size_t j = 0; j < l.size(); ++j) {
      std::optional<at::Tensor> o = l.get(j);
      out.push_back(o.has_value() ? std::optional<at::Tensor>(fn(*o)) : std::nullopt);
    }
    return out;
  }
  return v;
}

IValue to_meta(const IValue& v) {
  // Shapes do not depend on a generator, and PyTorch's Python references for random
  // ops refuse one ("generator is not supported in refs").
  if (v.isGenerator()) return IValue();
  return map_tensors(v, [](const at::Tensor& t) {
    if (!t.defined() || t.device().is_cpu()) return t;
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
  });
}

// PyTorch's meta kernels (many are its Python references) check arguments in another
// order than CPU's kernels, and some raise another exception type. When a meta kernel
// refuses a call, the call on CPU zeros of the same shapes and strides says what CPU
// does: its error is raised (CPU's type and message), or, where CPU accepts the call
// (roll of an empty tensor), it takes the counted fallback on the real data. Argument
// and shape checks read no values, so zeros stand in for the data; this runs only on
// the error path.
void raise_as_cpu_or_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                              size_t num_args, const std::exception& meta_error) {
  // A cpu tensor the meta kernel refuses beside the others (0-dim ones pass our own checks:
  // stack, cat): CUDA's kernels refuse it too, where the CPU round trip would mix devices.
  if (std::strstr(meta_error.what(), "is not on the expected device")) {
    std::optional<at::Device> tpu;
    for (size_t i = stack->size() - num_args; i < stack->size() && !tpu; ++i)
      map_tensors((*stack)[i], [&](const at::Tensor& t) {
        if (!tpu && t.defined() && t.is_privateuseone())
          tpu = at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index(t)));
        return t;
      });
    TORCH_CHECK(!tpu, "Expected all tensors to be on the same device, but found at least two devices, ", *tpu,
                " and cpu!");
  }
  torch::jit::Stack s;
  for (size_t i = stack->size() - num_args; i < stack->size(); ++i) {
    const IValue& v = (*stack)[i];
    if (v.isGenerator() && !v.toGenerator().device().is_cpu()) {
      s.emplace_back();  // CPU's kernel refuses a tpu generator; its checks do not read it
      continue;
    }
    s.push_back(map_tensors(v, [](const at::Tensor& t) {
      if (!t.defined() || t.device().is_cpu()) return t;
      return at::zeros_like(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU)));
    }));
  }
  op.callBoxed(&s);  // CPU's error, if it has one, propagates from here
  run_fallback(op, stack, std::string("its meta kernel refuses a call CPU accepts: ") + meta_error.what());
}

// _scaled_mm's meta kernel reads a meta tensor's device as CUDA and applies cuBLAS's
// layout and size rules (row-major self, column-major mat2, multiples of 16), which CPU
// and tpu do not have: its output is [M, N] of out_dtype (default self's dtype), and the
// lowering rule checks the arguments as CPU does.
// _grouped_mm's meta kernel is CUDA's too (bf16 only, 16-byte aligned strides); CPU
// takes f32/bf16/f16 and tpu has no alignment rule: the checks are CPU's (messages
// included) less the alignment ones; the output is contiguous.
IValue grouped_mm_meta(c10::ArrayRef<IValue> args) {
  const at::Tensor& a = args[0].toTensor();
  const at::Tensor& b = args[1].toTensor();
  for (const auto& [m, name] : {std::pair{&a, "mat_a"}, std::pair{&b, "mat_b"}}) {
    auto t = m->scalar_type();
    TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "Expected ", name,
                " to be Float32, BFloat16 or Float16 matrix, got ", t);
  }
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected m1 and m2 to have the same dtype, but got: ",
              a.scalar_type(), " != ", b.scalar_type());
  TORCH_CHECK((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3),
              "Multiplicands must be 2D or 3D but got mat_a.dim()=", a.dim(), " and mat_b.dim()=", b.dim());
  bool grouped = a.dim() == 2 || b.dim() == 2;
  TORCH_CHECK(grouped == !args[2].isNone(),
              "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d");
  if (a.dim() == 3 || b.dim() == 3)
    TORCH_CHECK(a.size(-1) == b.size(-2), "contraction dimension of mat_a and mat_b must match");
  int64_t g = 0;
  if (grouped) {
    const at::Tensor& offs = args[2].toTensor();
    TORCH_CHECK(offs.dim() == 1, "offs has to be 1D");
    TORCH_CHECK(offs.scalar_type() == at::kInt, "Offsets have to be int32");
    g = offs.size(0);
  }
  TORCH_CHECK(args[3].isNone(), "Bias not supported yet");
  TORCH_CHECK(args[4].isNone() || args[4].toScalarType() == a.scalar_type(),
              "Grouped gemm output dtype must match `mat_a` dtype");
  std::vector<int64_t> size;
  if (a.dim() == 2 && b.dim() == 2) {
    size = {g, a.size(0), b.size(1)};
  } else if (a.dim() == 2) {
    TORCH_CHECK(g == b.size(0), "matrix batch sizes have to match");
    size = {a.size(0), b.size(2)};
  } else if (b.dim() == 2) {
    TORCH_CHECK(g == a.size(0), "matrix batch sizes have to match");
    size = {a.size(1), b.size(1)};
  } else {
    TORCH_CHECK(a.size(0) == b.size(0), "batched dimension has to match");
    size = {a.size(0), a.size(1), b.size(2)};
  }
  return at::empty(size, a.options().device(at::kMeta));
}

std::optional<IValue> device_free_meta(const c10::OperatorHandle& op, c10::ArrayRef<IValue> args) {
  const std::string& ov = op.operator_name().overload_name;
  bool scaled_mm_out = ov == "out" && op.operator_name().name == "aten::_scaled_mm";  // (no meta kernel)
  if (!ov.empty() && !scaled_mm_out) return {};
  if (op.operator_name().name == "torch_tpu::call_stablehlo") {
    // Its results are the imported module's; a call may have no tensor left to dispatch on
    // (a JAX function of its inputs' shapes only).
    std::vector<at::Tensor> out;
    for (const ir::Type& t : ir::external_module(args[1].toInt()).results)
      out.push_back(at::empty(t.shape, at::TensorOptions().dtype(to_scalar_type(t.dtype)).device(at::kMeta)));
    return IValue(out);
  }
  if (op.operator_name().name == "aten::_grouped_mm") return grouped_mm_meta(args);
  if (op.operator_name().name != "aten::_scaled_mm") return {};
  const at::Tensor& a = args[0].toTensor();
  const at::Tensor& b = args[1].toTensor();
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "Inputs must be 2D but got self.dim()=", a.dim(),
              " and mat2.dim()=", b.dim());
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x",
              a.size(1), " and ", b.size(0), "x", b.size(1), ")");
  c10::ScalarType t = args[6].isNone() ? a.scalar_type() : args[6].toScalarType();
  if (scaled_mm_out) {  // as CPU: out_dtype defaults to out's dtype and must match it
    c10::ScalarType o = args[8].toTensor().scalar_type();
    // ValueError, as CPU's generic kernel raises it (its oneDNN path on AMX machines raises
    // RuntimeError; the generic one is the reference on every x86-64).
    TORCH_CHECK_VALUE(args[6].isNone() || t == o, "out_dtype must match output matrix type");
    t = o;
  }
  return at::empty({a.size(0), b.size(1)}, a.options().dtype(t).device(at::kMeta));
}

// Runs the op on meta tensors; returns the meta args (mutated ones show their new
// sizes) and the returns.
std::pair<std::vector<IValue>, std::vector<IValue>> run_meta(const c10::OperatorHandle& op,
                                                             c10::ArrayRef<IValue> args) {
  auto meta_args = [&] {
    std::vector<IValue> m;
    for (const IValue& v : args) m.push_back(to_meta(v));
    return m;
  };
  if (auto out = device_free_meta(op, args)) {
    std::vector<IValue> m = meta_args();
    if (!op.schema().is_mutable()) return {m, {*out}};
    // An out= op's out (last) takes the result's shape, with CPU's warning if it had elements.
    at::native::resize_output(m.back().toTensor(), out->toTensor().sizes());
    return {m, {m.back()}};
  }
  // PyTorch's C++ meta function where it has one; if it refuses the call, the active
  // (Python) Meta kernel decides on fresh arguments (the call may have resized outs),
  // so errors and the fallbacks they lead to stay as they were.
  if (const c10::KernelFunction* cxx = cxx_meta_kernel(op.operator_name())) {
    std::vector<IValue> cargs = meta_args();
    torch::jit::Stack s(cargs.begin(), cargs.end());
    try {
      cxx->callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &s);
      return {cargs, std::vector<IValue>(s.begin(), s.end())};
    } catch (const std::exception& e) {
      // CPU's refusal to promote float8 or uint16/32/64 with another dtype
      // (c10::promoteTypes, in this same function on CPU): the Python reference would
      // give float8 or the unsigned type instead.
      if (std::strstr(e.what(), "Promotion for Float8 Types is not supported") ||
          std::strstr(e.what(), "Promotion for uint16, uint32, uint64 types is not supported"))
        throw;
    }
  }
  std::vector<IValue> margs = meta_args();
  torch::jit::Stack s(margs.begin(), margs.end());
  try {
    op.callBoxed(&s);
  } catch (const std::exception&) {
    // masked_fill's reference takes a 0-dim CPU value only beside a tensor of an
    // accelerator's device type, which a meta tensor is not: shown a meta value, it
    // infers the same shapes (the CPU value is then read as a scalar operand).
    static const std::string masked_fill = "masked_fill";
    if (op.operator_name().name.find(masked_fill) == std::string::npos) throw;
    margs.clear();
    for (const IValue& v : args)
      margs.push_back(map_tensors(v, [](const at::Tensor& t) {
        if (!t.defined() || (t.device().is_cpu() && t.dim() != 0)) return t;
        return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
      }));
    s.assign(margs.begin(), margs.end());
    op.callBoxed(&s);
  }
  return {margs, std::vector<IValue>(s.begin(), s.end())};
}

void append_outs(const IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
}

// ---- the context rules see -------------------------------------------------------------

class KernelCtx final : public lowering::Ctx {
 public:
  KernelCtx(ir::Builder& b, const OpInfo& info, c10::ArrayRef<IValue> args, Plan& plan,
            std::vector<ir::Type> outs, bool f64)
      : Ctx(b), info_(info), args_(args), plan_(plan), outs_(std::move(outs)), f64_(f64) {
    b.set_number_operands([this](ir::Builder& bb, double v, DType t) {
      // f16/bf16 numbers travel as f32 (an exact count there), others in their dtype.
      DType pt = t == DType::F64 || t == DType::F32 ? t : DType::F32;
      plan_.sources.push_back({Source::Number, -1, -1, pt, v});
      return bb.convert(bb.param(ir::Type{pt, {}}), t);
    });
  }
  ~KernelCtx() override { b.set_number_operands(nullptr); }

  const std::string& op() const override { return info_.name; }
  int num_args() const override { return info_.num_args; }
  // Autograd passes an absent optional tensor as an undefined one.
  bool is_none(int i) const override {
    const IValue& v = args_.at(i);
    return v.isNone() || (v.isTensor() && !v.toTensor().defined());
  }
  bool is_tensor(int i) const override {
    return args_.at(i).isTensor() && args_[i].toTensor().defined();
  }

  Value in(int i) override {
    TORCH_CHECK(args_.at(i).isTensor(), info_.name, ": argument ", i, " is not a tensor");
    return tensor_value(i, -1);
  }
  std::vector<Value> list(int i) override {
    std::vector<Value> out;
    size_t n = args_.at(i).isTensorList() ? args_[i].toTensorList().size()
                                           : args_[i].toOptionalTensorList().size();
    for (size_t j = 0; j < n; ++j) out.push_back(tensor_value(i, static_cast<int>(j)));
    return out;
  }
  std::vector<std::optional<Value>> opt_list(int i) override {
    std::vector<std::optional<Value>> out;
    auto l = args_.at(i).toOptionalTensorList();
    for (size_t j = 0; j < l.size(); ++j) {
      std::optional<at::Tensor> o = l.get(j);
      if (o.has_value() && o->defined()) out.push_back(tensor_value(i, static_cast<int>(j)));
      else out.push_back(std::nullopt);
    }
    return out;
  }
  Value scalar(int i, DType t) override {
    const IValue& v = args_.at(i);
    if (v.isTensor()) return b.convert(in(i), t);
    return scalar_param(v.toScalar(), i, -1, t);
  }
  std::vector<Value> scalars(int i, DType t) override {
    std::vector<Value> out;
    auto l = args_.at(i).toList();
    for (size_t j = 0; j < l.size(); ++j)
      out.push_back(scalar_param(l.get(j).toScalar(), i, static_cast<int>(j), t));
    return out;
  }
  bool scalar_is_float(int i) const override {
    const IValue& v = args_.at(i);
    if (v.isTensor()) return at::isFloatingType(v.toTensor().scalar_type());
    return v.toScalar().isFloatingPoint();
  }
  // A Scalar argument is a runtime operand, absent from the signature: reading its
  // value while emitting would bake one call's value into a shared program.
  void check_not_runtime_scalar(int idx) const {
    TORCH_CHECK(!info_.is_scalar.at(idx) || args_[idx].isTensor(), "internal: the lowering of ",
                info_.name, " reads Scalar argument ", idx, " at compile time; use ctx.scalar()");
  }
  int64_t i(int idx) const override {
    check_not_runtime_scalar(idx);
    const IValue& v = args_.at(idx);
    if (v.isSymInt()) return v.toSymInt().expect_int();
    if (v.isScalar()) return v.toScalar().toLong();
    return v.toInt();
  }
  double f(int idx) const override {
    check_not_runtime_scalar(idx);
    const IValue& v = args_.at(idx);
    return v.isScalar() ? v.toScalar().toDouble() : v.toDouble();
  }
  bool flag(int idx) const override { return args_.at(idx).toBool(); }
  std::vector<int64_t> ints(int idx) const override {
    const IValue& v = args_.at(idx);
    if (v.isNone()) return {};
    if (v.isInt()) return {v.toInt()};
    if (v.isSymIntList()) {
      std::vector<int64_t> out;
      for (auto& s : v.toSymIntVector()) out.push_back(s.expect_int());
      return out;
    }
    return v.toIntVector();
  }
  std::string str(int idx) const override { return args_.at(idx).toStringRef(); }
  DType dtype_arg(int idx) const override {
    return device_dtype(static_cast<c10::ScalarType>(args_.at(idx).toInt()), info_.name.c_str());
  }
  ir::Type type_of(int i) const override {
    const at::Tensor& t = args_.at(i).toTensor();
    return ir::Type{device_dtype(t.scalar_type(), info_.name.c_str()),
                    std::vector<int64_t>(t.sizes().begin(), t.sizes().end())};
  }
  bool contiguous(int i) const override { return args_.at(i).toTensor().is_contiguous(); }
  std::vector<int64_t> strides(int i) const override {
    auto s = args_.at(i).toTensor().strides();
    return {s.begin(), s.end()};
  }
  int num_outs() const override { return static_cast<int>(outs_.size()); }
  ir::Type out(int j) const override { return outs_.at(j); }

  void check(const Value& ok, const std::string& message) override {
    checks_.push_back(b.reshape(b.convert(ok, DType::Bool), {}));
    plan_.checks.push_back(message);
  }
  void check_indices(const Value& ok, const std::string& message) override {
    plan_.checks_indices = true;
    check(ok, message);
  }
  const std::vector<Value>& checks() const { return checks_; }
  int value_class() const override { return value_class_of(info_, args_); }
  bool alpha_is_one(int i) const override {
    return i == info_.alpha_arg && args_.at(i).isScalar() && is_real_one(args_[i].toScalar());
  }

  Value random_bits(const ir::Type& t) override { return b.rng_bit_generator(random_state(), t).second; }
  Value random_state() override {
    plan_.sources.push_back({Source::Rng, info_.generator_arg, -1, DType::I64});
    return b.bitcast(b.param(ir::Type{DType::I64, {2}}), DType::U64);
  }

  // The storage of a tensor arg as a program value (a parameter, or zeros).
  Value storage_value(int arg, int elem) {
    auto key = std::make_pair(arg, elem);
    auto it = storages_.find(key);
    if (it != storages_.end()) return it->second;
    at::Tensor tmp;
    const at::Tensor& t = *tensor_at(args_, arg, elem, &tmp);
    ir::Type st = storage_type(t);
    Value v;
    if (storage_of(t).value) {
      plan_.sources.push_back({Source::Storage, arg, elem, st.dtype});
      v = b.param(st);
    } else {
      v = lowering::constant_any(b, 0, st.dtype, st.shape);
    }
    storages_.emplace(key, v);
    return v;
  }

  // The tensor arg's storage offset as an i64 parameter where offset_is_operand says so
  // (as the key asked it), else null: asked once per tensor, so an in-place op reads and
  // writes its view at the same operand.
  const Value* view_offset(int arg, int elem) {
    auto key = std::make_pair(arg, elem);
    auto it = offsets_.find(key);
    if (it == offsets_.end()) {
      at::Tensor tmp;
      std::optional<Value> v;
      if (offset_is_operand(*tensor_at(args_, arg, elem, &tmp), is_written(info_, arg))) {
        plan_.sources.push_back({Source::ViewOffset, arg, elem, DType::I64});
        v = b.param(ir::Type{DType::I64, {}});
      }
      it = offsets_.emplace(key, std::move(v)).first;
    }
    return it->second ? &*it->second : nullptr;
  }

 private:
  Value tensor_value(int arg, int elem) {
    auto key = std::make_pair(arg, elem);
    auto it = values_.find(key);
    if (it != values_.end()) return it->second;
    at::Tensor tmp;
    const at::Tensor& t = *tensor_at(args_, arg, elem, &tmp);
    DType dt = device_dtype(t.scalar_type(), info_.name.c_str());
    Value v;
    if (t.device().is_cpu()) {
      plan_.sources.push_back({Source::CpuTensor, arg, elem, dt});
      v = b.param(ir::Type{dt, {}});
      // A wrapped Python number behaves like a scalar of its category.
      if (t.unsafeGetTensorImpl()->is_wrapped_number() && dt == DType::F64 && !f64_)
        v = b.convert(v, DType::F32);
      if (t.unsafeGetTensorImpl()->is_wrapped_number() && dt == DType::C128 && !f64_)
        v = b.convert(v, DType::C64);
    } else {
      Value s = storage_value(arg, elem);
      if (s.dtype() != dt) s = reinterpret_bytes(b, s, dt);
      const Value* offset = view_offset(arg, elem);
      Value read = offset ? ir::read_view_at(b, s, geometry_of(t), *offset) : ir::read_view(b, s, geometry_of(t));
      // Ops the Conjugate/Negative fallbacks let through (mm, dot, ...) see lazy bits.
      v = apply_math_bits(b, read, t);
    }
    values_.emplace(key, v);
    return v;
  }

  Value scalar_param(const c10::Scalar& s, int arg, int elem, DType t) {
    DType pt = s.isFloatingPoint() ? (f64_ ? DType::F64 : DType::F32)
               : s.isBoolean()    ? DType::Bool
               // An integer above INT64_MAX (a uint64 value) travels as u64.
               : s.type() == c10::ScalarType::UInt64 ? DType::U64
               : s.isIntegral(false) ? DType::I64
               : s.isComplex()       ? (f64_ ? DType::C128 : DType::C64)
                                     : DType::Invalid;
    if (pt == DType::Invalid) throw lowering::Unsupported("scalars of this kind");
    plan_.sources.push_back({Source::Scalar, arg, elem, pt});
    return b.convert(b.param(ir::Type{pt, {}}), t);
  }

  const OpInfo& info_;
  c10::ArrayRef<IValue> args_;
  Plan& plan_;
  std::vector<ir::Type> outs_;
  bool f64_;
  std::map<std::pair<int, int>, Value> values_;
  std::map<std::pair<int, int>, Value> storages_;
  std::map<std::pair<int, int>, std::optional<Value>> offsets_;
  std::vector<Value> checks_;
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The value of a 0-dim CPU tensor (a wrapped Python number, mostly), read directly:
// this runs on every op with a Python scalar operand.
c10::Scalar cpu_scalar(const at::Tensor& t) {
  const void* p = t.const_data_ptr();  // the dtype is switched on: no typed accessor's check
  switch (t.scalar_type()) {
    case at::kDouble: return *static_cast<const double*>(p);
    case at::kFloat: return *static_cast<const float*>(p);
    case at::kLong: return *static_cast<const int64_t*>(p);
    case at::kInt: return *static_cast<const int32_t*>(p);
    case at::kBool: return *static_cast<const bool*>(p);
    default: return t.item();
  }
}

// ---- runtime operands -------------------------------------------------------------------

struct ScalarKeyHash {
  size_t operator()(const ScalarKey& k) const {
    return splitmix64(k.bytes[0] ^ splitmix64(k.bytes[1] ^ (uint64_t(k.dtype) << 32 | uint32_t(k.device))));
  }
};

ScalarKey scalar_key(const c10::Scalar& s, DType t, int device) {
  ScalarKey key{{0, 0}, static_cast<int>(t), device};
  char* bytes = reinterpret_cast<char*>(key.bytes);
  switch (t) {
    case DType::F32: { float v = static_cast<float>(s.toDouble()); std::memcpy(bytes, &v, 4); break; }
    case DType::F64: { double v = s.toDouble(); std::memcpy(bytes, &v, 8); break; }
    case DType::I64: { int64_t v = s.toLong(); std::memcpy(bytes, &v, 8); break; }
    case DType::U64: { uint64_t v = s.toUInt64(); std::memcpy(bytes, &v, 8); break; }
    case DType::I32: { int32_t v = s.toInt(); std::memcpy(bytes, &v, 4); break; }
    case DType::Bool: { bytes[0] = s.toBool() ? 1 : 0; break; }
    default: {
      at::Tensor tmp = at::scalar_tensor(s, at::TensorOptions().dtype(to_scalar_type(t)));
      std::memcpy(bytes, tmp.data_ptr(), itemsize(t));
    }
  }
  return key;
}

// Scalars' bytes on the device, least recently used dropped past `capacity`.
class ScalarBuffers {
 public:
  // Lives for the process (the client keeps its release hook): make it with `new`.
  explicit ScalarBuffers(size_t capacity) : capacity_(capacity) {
    runtime::Client::get().on_memory_pressure([this] { clear(); });
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.clear();
    order_.clear();
  }
  runtime::BufferPtr get(const ScalarKey& key) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) {
        order_.splice(order_.begin(), order_, it->second.second);
        return it->second.first;
      }
    }
    DType t = static_cast<DType>(key.dtype);
    runtime::BufferPtr buf =
        guarded([&] { return runtime::Client::get().from_host(key.bytes, t, {}, key.device); });
    buf->shared_constant = true;
    buf->mark_cached();
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = cache_.try_emplace(key, buf, order_.end());
    if (!fresh) return it->second.first;  // another thread made it meanwhile
    order_.push_front(key);
    it->second.second = order_.begin();
    if (cache_.size() > capacity_) {
      cache_.erase(order_.back());
      order_.pop_back();
    }
    return buf;
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::list<ScalarKey> order_;  // most recently used first
  std::unordered_map<ScalarKey, std::pair<runtime::BufferPtr, std::list<ScalarKey>::iterator>, ScalarKeyHash>
      cache_;
};

// A scalar's bytes on the device, from a cache shared by all plans.
runtime::BufferPtr shared_scalar_buffer(const ScalarKey& key) {
  // Small host->device copies of the same value (lr, betas, eps) are cached. The
  // cache is small: values that change every step (Adam's bias corrections) would
  // otherwise pile up as device memory that grows with the step count.
  static ScalarBuffers& values = *new ScalarBuffers(256);
  return values.get(key);
}

// A view's storage offset on the device. Apart from the values above and larger: a
// step writes and reads views at the same offsets every step (a DDP bucket's gradients,
// a flat buffer's parameters, hundreds of them), which the values changing every step
// would push out of a small cache, costing a host-to-device copy each.
runtime::BufferPtr offset_buffer(int64_t offset, int device) {
  static ScalarBuffers& offsets = *new ScalarBuffers(1 << 14);
  return offsets.get(scalar_key(c10::Scalar(offset), DType::I64, device));
}

runtime::BufferPtr scalar_buffer(const c10::Scalar& s, DType t, int device, ScalarMemo& memo) {
  ScalarKey key = scalar_key(s, t, device);
  if (!memo.busy.exchange(true, std::memory_order_acquire)) {
    runtime::BufferPtr hit = memo.key == key ? memo.buffer.lock() : nullptr;
    memo.busy.store(false, std::memory_order_release);
    if (hit) return hit;
  }
  runtime::BufferPtr buf = shared_scalar_buffer(key);
  if (!memo.busy.exchange(true, std::memory_order_acquire)) {
    memo.key = key;
    memo.buffer = buf;
    memo.busy.store(false, std::memory_order_release);
  }
  return buf;
}

// ---- plans --------------------------------------------------------------------------------

std::string describe(const OpInfo& info, c10::ArrayRef<IValue> args) {
  std::string s = std::string(info.ns) + "::" + info.name + "(";
  for (int i = 0; i < info.num_args; ++i) {
    const IValue& v = args[i];
    if (i) s += ", ";
    if (v.isTensor() && v.toTensor().defined())
      s += c10::str(v.toTensor().scalar_type(), v.toTensor().sizes());
    else if (v.isTensorList()) s += "Tensor[" + std::to_string(v.toTensorList().size()) + "]";
    // Tensor?[] (index's indices): types only; printing the values would read them on the
    // host (a copy, and a cut of a deferred graph) on every new signature.
    else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType)
      s += "Tensor?[" + std::to_string(v.toList().size()) + "]";
    else s += c10::str(v);
  }
  return s + ")";
}

// The storage after writing `val` into a tensor's view of it. A view of another dtype
// writes through a reinterpretation of the storage's bytes.
// `base`: the storage's value so far when an earlier output of the same op wrote it.
Value write_into_storage(ir::Builder& b, KernelCtx& ctx, int arg, int elem, const ir::Type& st,
                         const ir::Geometry& g, const Value& val, const Value* base) {
  if (itemsize(st.dtype) == itemsize(val.dtype()) && g.covers(st.shape)) {  // no old bytes needed
    Value bytes = reinterpret_bytes(b, b.reshape(val, {val.type.numel()}), st.dtype);
    return b.reshape(bytes, st.shape);
  }
  Value cur = base ? *base : ctx.storage_value(arg, elem);
  return write_storage_view(b, cur, st, g, val, ctx.view_offset(arg, elem));
}

// A complex tensor among the arguments (or a complex Scalar) or the outputs.
bool involves_complex(c10::ArrayRef<IValue> args, const std::vector<ir::Type>& outs) {
  for (const ir::Type& t : outs)
    if (is_complex(t.dtype)) return true;
  auto cplx = [](const at::Tensor& t) { return t.defined() && t.is_complex(); };
  for (const IValue& v : args) {
    if (v.isTensor() && cplx(v.toTensor())) return true;
    if (v.isComplexDouble()) return true;
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (cplx(t)) return true;
  }
  return false;
}

// Raises as CPU does where the call involves a complex tensor (an argument or a result).
void refuse_complex(const OpInfo& info, c10::ArrayRef<IValue> args, const std::vector<at::Tensor>& outs) {
  std::optional<c10::ScalarType> found;
  auto see = [&](const at::Tensor& t) {
    if (!found && t.defined() && t.is_complex()) found = t.scalar_type();
  };
  for (const at::Tensor& t : outs) see(t);
  for (const IValue& v : args) {
    if (v.isTensor()) see(v.toTensor());
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) see(t);
  }
  // A complex Scalar (x < 1j) makes CPU's common dtype complex: its kernel refuses that.
  for (size_t i = 0; !found && i < args.size(); ++i)
    if (args[i].isComplexDouble() && args[0].isTensor())
      found = at::result_type(args[0].toTensor(), args[i].toScalar());
  if (!found) return;
  std::string what = c10::str(info.name, ": not implemented for '", *found, "' (CPU refuses complex values too)");
  if (info.complex_refusal == ComplexRefusal::Runtime) TORCH_CHECK(false, what);
  TORCH_CHECK_NOT_IMPLEMENTED(false, what);
}

// Bool and integer inputs CPU's kernel refuses (integral_refusal_for): its first tensor
// argument's dtype decides, as CPU's dispatch does.
void refuse_integral(const OpInfo& info, c10::ArrayRef<IValue> args, const std::vector<at::Tensor>& outs) {
  // A foreach op runs its per-tensor op on each tensor of its lists (CPU's slow path
  // for these dtypes): float8 and uint16/32/64 take that op's support.
  if (info.base.rfind("_foreach_", 0) == 0) {
    const std::string op = info.base.substr(9);
    for (const IValue& v : args) {
      if (!v.isTensorList()) continue;
      for (const at::Tensor& t : v.toTensorList())
        TORCH_CHECK_NOT_IMPLEMENTED(!is_limited_support_dtype(t.scalar_type()) ||
                                        limited_dtype_supported(op, t.scalar_type()),
                                    info.name, ": not implemented for '", t.scalar_type(),
                                    "' (CPU's kernel refuses it too)");
    }
  }
  // A pointwise op computes in its result's dtype (bool % 5 is int64), as do the
  // pointwise losses (mse_loss(int64, float32) is float32). An out= overload computes in
  // its inputs' (CPU casts to the out after: add(f32, f32, out=float8) runs, add(float8,
  // float8, out=float8) does not).
  const bool by_result = info.pointwise || info.base == "mse_loss" || info.base == "smooth_l1_loss";
  std::optional<c10::ScalarType> computed;
  if (by_result && info.is_out) {
    at::native::ResultTypeState state;
    const int last = info.num_args - static_cast<int>(info.mutated.size());
    for (int i = 0; i < last; ++i) {
      if (args[i].isTensor() && args[i].toTensor().defined())
        state = at::native::update_result_type_state(args[i].toTensor(), state);
      else if (args[i].isScalar())
        state = at::native::update_result_type_state(args[i].toScalar(), state);
    }
    computed = at::native::result_type(state);
  } else if (by_result && !outs.empty() && outs[0].defined()) {
    computed = outs[0].scalar_type();
  }
  for (const IValue& v : args) {
    if (!v.isTensor()) continue;
    c10::ScalarType t = computed ? *computed : v.toTensor().scalar_type();
    ComplexRefusal r = integral_refusal_for(info.base_overload, info.base, t);
    if (r == ComplexRefusal::None) return;
    std::string what = c10::str(info.name, ": not implemented for '", t, "' (CPU's kernel refuses it too)");
    if (r == ComplexRefusal::Runtime) TORCH_CHECK(false, what);
    TORCH_CHECK_NOT_IMPLEMENTED(false, what);
  }
}

// Non-pointwise ops whose CPU kernels promote their (non-bool) tensor inputs to one dtype.
bool promotes_all_inputs(const std::string& base) {
  static const std::set<std::string> ops = {"rsub", "floor_divide", "stack", "bucketize", "searchsorted"};
  return ops.count(base) > 0;
}

// c10::promoteTypes refuses float8 beside any other dtype (CPU's "Promotion for Float8
// Types is not supported"), and uint16/32/64 beside another integer type ("Promotion for
// uint16, uint32, uint64 types is not supported"). Structured ops meet it in their C++
// meta function (run_meta); the Python references would give float8 or the unsigned
// type, so ops that promote their inputs check here, when a plan is made and such a
// tensor is among them. (Bool inputs, a where's condition or a mask, take no part.)
void refuse_fp8_promotion(const OpInfo& info, c10::ArrayRef<IValue> args) {
  if (!info.promotes_inputs) return;
  std::vector<at::Tensor> ins;
  bool fp8 = false;
  int last = info.is_out ? info.num_args - static_cast<int>(info.mutated.size()) : info.num_args;
  auto take = [&](const at::Tensor& t) {
    if (!t.defined() || t.scalar_type() == at::kBool) return;
    fp8 = fp8 || c10::isFloat8Type(t.scalar_type()) || c10::isBarebonesUnsignedType(t.scalar_type());
    ins.push_back(t);
  };
  for (int i = 0; i < last; ++i) {
    if (args[i].isTensor()) take(args[i].toTensor());
    else if (args[i].isTensorList()) for (const at::Tensor& t : args[i].toTensorList().vec()) take(t);
  }
  // One dtype throughout (cat of float8 tensors) promotes nothing; c10's result_type would
  // still refuse it.
  bool mixed = std::any_of(ins.begin(), ins.end(), [&](const at::Tensor& t) {
    return t.scalar_type() != ins.front().scalar_type();
  });
  if (fp8 && mixed) (void)at::native::result_type(ins);  // CPU's rules: 0-dim tensors and wrapped numbers included
}

// The memory format of an op whose meta kernel always answers contiguous while CPU's
// and CUDA's kernels follow their inputs: convolutions are channels_last when the input
// or the weight is (their outputs of the input's rank take it).
std::optional<c10::MemoryFormat> cpu_layout(const OpInfo& info, c10::ArrayRef<IValue> args) {
  int in = info.base == "convolution" || info.base == "convolution_overrideable" ? 0
           : info.base == "convolution_backward" ? 1 : -1;
  if (in < 0 || !args[in].isTensor() || !args[in + 1].isTensor()) return std::nullopt;
  const at::Tensor& x = args[in].toTensor();
  const at::Tensor& w = args[in + 1].toTensor();
  for (auto f : {c10::MemoryFormat::ChannelsLast, c10::MemoryFormat::ChannelsLast3d})
    if (x.suggest_memory_format() == f || w.suggest_memory_format() == f) return f;
  return std::nullopt;
}

std::shared_ptr<Plan> build_plan(const c10::OperatorHandle& op, const OpInfo& info,
                                 c10::ArrayRef<IValue> args, const KeyState& k,
                                 const std::vector<at::Tensor>& meta_outs) {
  auto plan = std::make_shared<Plan>();
  std::vector<ir::Type> out_types;
  for (const at::Tensor& m : meta_outs) {
    if (!m.defined()) {  // rules may return any placeholder for it
      out_types.push_back(ir::Type{DType::Invalid, {}});
      continue;
    }
    out_types.push_back(ir::Type{device_dtype(m.scalar_type(), info.name.c_str()),
                                 std::vector<int64_t>(m.sizes().begin(), m.sizes().end())});
  }
  ir::Builder b;
  b.set_matmul_precision(torch_matmul_precision());
  KernelCtx ctx(b, info, args, *plan, out_types, k.has_f64);
  std::vector<Value> results;
  const lowering::Rule* rule = info.complex_rule && involves_complex(args, out_types) ? info.complex_rule : info.rule;
  // Outputs with no elements need no computation (and a rule's gathers and slices of
  // zero-size operands need not be valid StableHLO): they are empty constants.
  bool all_empty = std::any_of(out_types.begin(), out_types.end(),
                               [](const ir::Type& t) { return t.dtype != DType::Invalid; }) &&
                   std::all_of(out_types.begin(), out_types.end(), [](const ir::Type& t) {
                     return t.dtype == DType::Invalid || t.numel() == 0;
                   });
  try {
    if (!rule) throw lowering::Unsupported("no lowering for real arguments");
    if (all_empty) {
      // The rule still runs, on a scratch program, for the argument checks it makes.
      ir::Builder scratch_b;
      Plan scratch_plan;
      KernelCtx scratch(scratch_b, info, args, scratch_plan, out_types, k.has_f64);
      (void)(*rule)(scratch);
      // Indices into a dim that has elements, while the result has none, would go
      // unchecked with no program run: CPU's kernel looks at them instead.
      if (scratch_plan.checks_indices) throw lowering::Unsupported("indices to check for an empty result");
      for (const ir::Type& t : out_types)
        results.push_back(t.dtype == DType::Invalid ? b.constant(0, DType::F32) : lowering::constant_any(b, 0, t.dtype, t.shape));
    } else {
      results = (*rule)(ctx);
    }
  } catch (const lowering::DtypeNotImplemented& e) {
    c10::ScalarType st = c10::ScalarType::Undefined;
    for (int i = 0; i < info.num_args && st == c10::ScalarType::Undefined; ++i)
      if (args[i].isTensor() && args[i].toTensor().defined()) st = args[i].toTensor().scalar_type();
    TORCH_CHECK_NOT_IMPLEMENTED(false, "\"", e.what(), "\" not implemented for '", c10::toString(st), "'");
  } catch (const lowering::Unsupported& e) {
    plan->fallback = true;
    plan->fallback_reason = e.what();
    return plan;
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, info.name, ": ", e.what());  // a dim out of range: IndexError, as CPU
  } catch (const std::invalid_argument& e) {
    // A RuntimeError on every path: pybind11 (an op called through torch.ops, as a
    // compiled graph does) would turn the bare exception into a ValueError.
    TORCH_CHECK(false, e.what());
  } catch (const lowering::CheckFailed& e) {
    raise_check_message(e.what());  // the type its message asks for (device_checks.h)
  }
  TORCH_CHECK(results.size() == out_types.size(), "internal: lowering of ", describe(info, args),
              " made ", results.size(), " outputs, PyTorch expects ", out_types.size());
  std::vector<Value> program_results;
  size_t j = 0;
  auto fit = [&](Value v, const ir::Type& want) {
    TORCH_CHECK(v.type.numel() == want.numel(), "internal: lowering of ", describe(info, args),
                " made ", v.type.str(), " where PyTorch expects ", want.str());
    return b.reshape(b.convert(v, want.dtype), want.shape);
  };
  if (info.mutated.empty()) {
    std::optional<c10::MemoryFormat> layout = cpu_layout(info, args);
    for (size_t r = 0; r < meta_outs.size(); ++r, ++j) {
      if (!meta_outs[r].defined()) {
        OutSpec u{false, -1, -1, c10::ScalarType::Undefined, {}};
        u.undefined = true;
        plan->outs.push_back(u);
        continue;
      }
      at::Tensor m = meta_outs[r];
      if (layout && m.dim() == (*layout == c10::MemoryFormat::ChannelsLast ? 4 : 5))
        m = at::empty(m.sizes(), m.options().memory_format(*layout));
      Value v = fit(results[j], out_types[j]);
      OutSpec spec{false, -1, -1, m.scalar_type(), std::vector<int64_t>(m.sizes().begin(), m.sizes().end())};
      // The layout PyTorch's meta kernel gives (channels_last in, channels_last out;
      // preserve_format): the program stores the values in that order, as CPU/CUDA do.
      if (m.numel() > 0 && m.is_non_overlapping_and_dense()) {
        std::vector<int64_t> order = physical_order(m.sizes(), m.strides());
        if (!order.empty()) {
          v = b.transpose(v, order);
          spec.strides.assign(m.strides().begin(), m.strides().end());
        }
      }
      program_results.push_back(v);
      plan->outs.push_back(spec);
    }
  } else {
    // Outputs that are views of one storage (split_with_sizes_copy's out= list into one
    // flat buffer, as FSDP2 does) write in turn: each starts from the previous write.
    std::vector<std::pair<const c10::StorageImpl*, Value>> written_storages;
    for (int a : info.mutated) {
      const IValue& v = args[a];
      size_t n = v.isTensor() ? 1 : v.toTensorList().size();
      for (size_t e = 0; e < n; ++e, ++j) {
        int elem = v.isTensor() ? -1 : static_cast<int>(e);
        at::Tensor tmp;
        const at::Tensor& t = *tensor_at(args, a, elem, &tmp);
        ir::Type st = storage_type(t);
        ir::Geometry g = geometry_of(t);
        const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
        const Value* base = nullptr;
        for (auto& [si, val] : written_storages)
          if (si == impl) base = &val;
        Value val = apply_math_bits(b, fit(results[j], out_types[j]), t);  // stored, not logical
        Value written = write_into_storage(b, ctx, a, elem, st, g, val, base);
        if (!ctx.checks().empty()) {  // a failed check leaves the tensor as it was
          Value ok = ctx.checks()[0];
          for (size_t c = 1; c < ctx.checks().size(); ++c)
            ok = b.binary("stablehlo.and", ok, ctx.checks()[c]);
          Value old = base ? *base : ctx.storage_value(a, elem);
          written = b.select(b.broadcast_in_dim(ok, st.shape, {}), written, old);
        }
        written_storages.emplace_back(impl, written);
        program_results.push_back(written);
        plan->outs.push_back({true, a, elem, t.scalar_type(), {}});
      }
    }
  }
  for (const Value& c : ctx.checks()) program_results.push_back(c);
  plan->reads_matmul_precision = b.reads_matmul_precision();
  plan->matmul_precision = b.matmul_precision();
  plan->program = std::make_shared<Program>(b, program_results, describe(info, args));
  return plan;
}

// Filled once at registration, read-only afterwards.
std::unordered_map<c10::OperatorName, OpInfo>& infos() {
  static std::unordered_map<c10::OperatorName, OpInfo> m;
  return m;
}
std::mutex g_plans_mu;
std::unordered_map<std::string_view, std::shared_ptr<Plan>> g_plans;  // keys view Plan::key

// The tensors of a Tensor, Tensor[] or Tensor?[] argument, in list order.
std::vector<at::Tensor> tensors_of(const IValue& v) {
  std::vector<at::Tensor> out;
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
  else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType)
    for (const std::optional<at::Tensor>& o : v.toOptionalTensorList()) out.push_back(o.value_or(at::Tensor()));
  return out;
}

// In-place and out= writes whose destination overlaps itself or an input raise as
// CPU's TensorIterator does (full overlap, x.add_(x), is fine). Lists of the same length
// (foreach ops) pair up element by element, as their per-tensor loops do.
void check_overlaps(const OpInfo& info, c10::ArrayRef<IValue> args) {
  std::vector<bool> written(info.num_args, false);
  for (int a : info.mutated) written[a] = true;
  auto on_tpu = [](const at::Tensor& t) { return t.defined() && !t.is_cpu(); };
  for (int a : info.mutated) {
    std::vector<at::Tensor> outs = tensors_of(args[a]);
    for (size_t e = 0; e < outs.size(); ++e) {
      if (!on_tpu(outs[e])) continue;
      if (info.check_internal_overlap) at::assert_no_internal_overlap(outs[e]);
      if (!info.check_input_overlap) continue;
      for (int i = 0; i < info.num_args; ++i) {
        if (written[i]) continue;
        std::vector<at::Tensor> ins = tensors_of(args[i]);
        bool paired = args[a].isList() && ins.size() == outs.size();
        for (size_t k = 0; k < ins.size(); ++k)
          if ((!paired || k == e) && on_tpu(ins[k])) {
            if (info.check_any_input_overlap) at::assert_no_overlap(outs[e], ins[k]);
            else at::assert_no_partial_overlap(outs[e], ins[k]);
          }
      }
    }
  }
}

// Advanced indexing takes index tensors on the CPU as CUDA does (ATen's index and
// index_put move them to self's device); other ops keep the same-device check.
bool moves_cpu_indices(const std::string& base) {
  return base == "index" || base == "index_put" || base == "_index_put_impl" ||
         base == "_unsafe_index" || base == "_unsafe_index_put";
}

// A new list (the caller's is left alone) with the cpu index tensors copied to `device`.
void move_cpu_indices(c10::IValue& slot, const c10::Device& device) {
  auto list = slot.toOptionalTensorList();
  bool any = false;
  for (size_t i = 0; i < list.size(); ++i) {
    std::optional<at::Tensor> t = list.get(i);
    any = any || (t && t->defined() && t->device().is_cpu());
  }
  if (!any) return;
  c10::List<std::optional<at::Tensor>> moved;
  moved.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    std::optional<at::Tensor> t = list.get(i);
    if (t && t->defined() && t->device().is_cpu()) t = t->to(device);
    moved.push_back(std::move(t));
  }
  slot = c10::IValue(std::move(moved));
}

// Tensor arguments an unboxed kernel put on a stack without taking references (see
// call_unboxed). They must leave the stack without dropping a reference: `release()`
// lets go of them; `own()` turns them into real references first, before the stack
// goes to code that keeps or pops its arguments (fallbacks, CPU's error path).
struct BorrowedArgs {
  torch::jit::Stack* stack;
  size_t first;
  uint32_t mask = 0;  // bit i: argument i is borrowed
  void own() {
    for (size_t i = 0; mask; ++i, mask >>= 1) {
      if (!(mask & 1)) continue;
      IValue& v = (*stack)[first + i];
      at::Tensor copy = v.toTensor();  // a reference of its own
      std::move(v).toTensor().unsafeReleaseTensorImpl();
      v = IValue(std::move(copy));
    }
  }
  void release() {
    for (size_t i = 0; mask; ++i, mask >>= 1) {
      if (!(mask & 1)) continue;
      IValue& v = (*stack)[first + i];
      std::move(v).toTensor().unsafeReleaseTensorImpl();
      v = IValue();
    }
  }
};

// fill_(self, value) with the value on another device fills self with value.item(), as
// ATen's fill_ does (a cpu tensor fills from a tpu one, as from a cuda one). True when
// it did (self is left on the stack: the op returns it).
bool fill_from_other_device(torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 2);
  at::Tensor self = args[0].toTensor();
  const at::Tensor& value = args[1].toTensor();
  if (!value.is_privateuseone() || self.device() == value.device()) return false;
  TORCH_CHECK(value.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ", value.dim(),
              " dimensions.");
  c10::Scalar v = value.item();
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // the fill_ being run is already recorded
    self.fill_(v);
  }
  torch::jit::drop(*stack, 1);
  return true;
}

void lowered_kernel(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                    BorrowedArgs* borrowed = nullptr);

// See its call in lowered_kernel.
void start_unwritten_from_zeros(const OpInfo& info, c10::ArrayRef<IValue> args) {
  c10::SmallVector<at::Tensor, 4> unwritten;
  auto start = [&](const at::Tensor& t) {
    if (!t.defined() || !t.is_privateuseone()) return;
    StorageData& s = storage_data(t);
    if (!s.value && s.pending.empty() && !s.copy_of && s.unreadable.empty() && s.nbytes > 0) unwritten.push_back(t);
  };
  for (int a : info.mutated) {
    if (args[a].isTensor()) start(args[a].toTensor());
    else if (args[a].isTensorList())
      for (const at::Tensor& t : args[a].toTensorList()) start(t);
  }
  if (deferring()) {  // recorded one by one: hoist_fills runs each state fill before its graph
    for (const at::Tensor& t : unwritten) storage_value(t);
  } else if (!unwritten.empty()) {
    start_from_zeros(unwritten);
  }
}

// A parameter or module buffer never written (zero-initialized on the device: zeros_,
// a BatchNorm's running mean) gets its zeros before an op reads or updates it, rather
// than being read as zeros baked into the op's program: the next step reads the written
// storage, and a program baked with zeros would be another one to compile (a fused step
// twice over). Strict and Debug make them in one program for all the op's such args;
// DeferAndFuse records them as state, run before the step's graph (hoist_fills).
void start_state_from_zeros(const OpInfo& info, c10::ArrayRef<IValue> args) {
  c10::SmallVector<at::Tensor, 4> unwritten;
  auto start = [&](const at::Tensor& t) {
    if (!t.defined() || !t.is_privateuseone()) return;
    StorageData& s = storage_data(t);
    if (s.value || !s.pending.empty() || s.copy_of || !s.unreadable.empty() || s.nbytes == 0) return;
    if (s.module_state || t.requires_grad()) unwritten.push_back(t);
  };
  for (size_t a = 0; a < args.size(); ++a) {
    if (args[a].isTensor()) start(args[a].toTensor());
    else if (args[a].isTensorList())
      for (const at::Tensor& t : args[a].toTensorList()) start(t);
  }
  if (unwritten.empty()) return;
  if (deferring()) {
    bool was = recording_state();
    set_recording_state(true);
    for (const at::Tensor& t : unwritten) storage_value(t);
    set_recording_state(was);
  } else {
    start_from_zeros(unwritten);
  }
}

// An out= write into a small part of a storage outside DeferAndFuse (DDP's Reducer
// divides each gradient into its view of a bucket): the op writes a fresh tensor, whose
// write joins the storage's queue as copy_'s does (one program per bucket at its next
// use, not one per gradient rewriting the whole bucket). Not for ops with device checks:
// a failed one must leave the destination as it was. (In-place ops read the storage they
// write, which runs its queue: they gain nothing here.)
bool write_out_later(const c10::OperatorHandle& op, const OpInfo& info, const Plan& plan,
                     torch::jit::Stack* stack) {
  if (!info.is_out || info.mutated.size() != 1 || deferring() || !plan.checks.empty()) return false;
  size_t first = stack->size() - info.num_args;
  IValue& slot = (*stack)[first + info.mutated[0]];
  if (!slot.isTensor()) return false;
  at::Tensor out = slot.toTensor();
  // (An empty out is written by no program: an empty fresh tensor would not cover its
  // storage either, and the call would come back here without end.)
  if (out.is_conj() || out.is_neg() || out.numel() == 0 || covers_storage(out)) return false;
  // A view of most of its storage: rewriting the storage at once costs less than a
  // value of the view's size and its write.
  if (2 * out.numel() * static_cast<int64_t>(out.element_size()) > static_cast<int64_t>(out.storage().nbytes()))
    return false;
  at::Tensor fresh = at::empty(out.sizes(), out.options());
  slot = fresh;
  lowered_kernel(op, info, stack);  // fresh covers its storage: the op's program writes it
  for (size_t r = first; r < stack->size(); ++r)
    if ((*stack)[r].isTensor() && (*stack)[r].toTensor().is_same(fresh)) (*stack)[r] = out;
  write_value(out, dense_value(fresh));
  return true;
}

// A pointwise out= op whose out dtype is not the inputs' common dtype: CPU's
// TensorIterator computes in the common dtype and casts into `out`
// (mul(f32, f32, out=f64) rounds to f32 first), so the functional op runs and its result
// is copied into `out` (already resized and checked by the out= op's meta kernel).
bool computed_in_common_dtype(const OpInfo& info, torch::jit::Stack* stack) {
  if (!info.functional) return false;
  auto args = torch::jit::last(*stack, info.num_args);
  const IValue& out_slot = args[info.num_args - 1];
  if (!out_slot.isTensor()) return false;
  at::Tensor out = out_slot.toTensor();
  bool all_same = true;
  for (int i = 0; i + 1 < info.num_args; ++i)
    if (args[i].isTensor() && args[i].toTensor().scalar_type() != out.scalar_type()) all_same = false;
  if (all_same) return false;  // DDP's mul_out into a bucket: the usual case, decided here
  torch::jit::Stack call(args.begin(), args.end() - 1);
  auto [margs, mrets] = run_meta(*info.functional, call);
  if (mrets.size() != 1 || !mrets[0].isTensor() || mrets[0].toTensor().scalar_type() == out.scalar_type())
    return false;
  info.functional->callBoxed(call);
  out.copy_(call[0].toTensor());
  torch::jit::drop(*stack, info.num_args);
  stack->push_back(out);
  return true;
}

// A pointwise out= op whose result dtype cannot cast to out's: CPU's TensorIterator
// message, ahead of the out= meta kernel's (PyTorch's Python reference words it otherwise).
// An out= tensor on another device than the op's tpu inputs: CUDA's error (the meta
// kernel would copy into it and name a "meta" device).
// A pointwise out= call of two or more operands whose tensor inputs are all 0-dim cpu
// tensors, with a tpu out, computes on the out's device, as CUDA's binary TensorIterator
// does (cpu scalars join the output's device): those inputs move there. (A unary op's
// iterator takes no cpu scalars: check_out_device refuses it, as CUDA does.)
void move_cpu_scalars_to_out(const OpInfo& info, torch::jit::Stack* stack) {
  if (!info.pointwise) return;
  auto args = torch::jit::last(*stack, info.num_args);
  int operands = 0;
  std::optional<at::Device> out_dev;
  for (int a : info.mutated)
    if (args[a].isTensor() && args[a].toTensor().defined() && args[a].toTensor().is_privateuseone())
      out_dev = args[a].toTensor().device();
  if (!out_dev) return;
  std::vector<int> scalars;
  for (int i = 0; i < info.num_args; ++i) {
    if (std::find(info.mutated.begin(), info.mutated.end(), i) != info.mutated.end()) continue;
    if (args[i].isTensorList()) return;
    if (!args[i].isTensor() || !args[i].toTensor().defined()) continue;
    const at::Tensor& t = args[i].toTensor();
    if (!t.device().is_cpu() || t.dim() != 0) return;
    scalars.push_back(i);
  }
  for (int i = 0; i < info.num_args; ++i) operands += args[i].isTensor() || args[i].isScalar();
  if (operands - static_cast<int>(info.mutated.size()) < 2) return;
  size_t first = stack->size() - info.num_args;
  for (int i : scalars) (*stack)[first + i] = (*stack)[first + i].toTensor().to(*out_dev);
}

void check_out_device(const OpInfo& info, c10::ArrayRef<IValue> args) {
  std::optional<at::Device> in;
  for (int i = 0; i < static_cast<int>(args.size()) && !in; ++i) {
    if (std::find(info.mutated.begin(), info.mutated.end(), i) != info.mutated.end()) continue;
    map_tensors(args[i], [&](const at::Tensor& t) {
      if (!in && t.defined() && t.is_privateuseone())
        in = at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index(t)));
      return t;
    });
  }
  if (!in) {
    // Only cpu inputs and a tpu out: CUDA's kernels take the out's device and refuse a cpu
    // input that is not 0-dim (the meta kernel would name a "meta" device); 0-dim ones
    // were moved to the out's device (move_cpu_scalars_to_out).
    std::optional<at::Device> out_dev;
    for (int a : info.mutated)
      if (args[a].isTensor() && args[a].toTensor().defined() && args[a].toTensor().is_privateuseone())
        out_dev = at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index(args[a].toTensor())));
    if (!out_dev) return;
    for (int i = 0; i < static_cast<int>(args.size()); ++i) {
      if (std::find(info.mutated.begin(), info.mutated.end(), i) != info.mutated.end()) continue;
      map_tensors(args[i], [&](const at::Tensor& t) {
        TORCH_CHECK(!t.defined() || !t.device().is_cpu(),
                    "Expected all tensors to be on the same device, but found at least two devices, ", *out_dev,
                    " and cpu!");
        return t;
      });
    }
    return;
  }
  for (int a : info.mutated) {
    if (!args[a].isTensor() || !args[a].toTensor().defined()) continue;
    const at::Tensor& out = args[a].toTensor();
    at::Device od = out.is_privateuseone()
                        ? at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index(out)))
                        : out.device();
    TORCH_CHECK(od == *in, "Expected out tensor to have device ", *in, ", but got ", od, " instead");
  }
}

void check_out_result_type(const OpInfo& info, c10::ArrayRef<IValue> args) {
  if (!info.functional || info.mutated.size() != 1 || !args[info.num_args - 1].isTensor()) return;
  c10::ScalarType out = args[info.num_args - 1].toTensor().scalar_type();
  // Only an integer (or bool) out, or a real out of complex inputs, can refuse a result
  // (true division of integers gives float): a float out (DDP's buckets) costs nothing.
  bool complex_in = false;
  for (int i = 0; i + 1 < info.num_args; ++i)
    if (args[i].isTensor() && args[i].toTensor().is_complex()) complex_in = true;
  if (!c10::isIntegralType(out, /*includeBool=*/true) && !(complex_in && !c10::isComplexType(out))) return;
  std::vector<IValue> mrets;
  try {
    mrets = run_meta(*info.functional, torch::jit::Stack(args.begin(), args.end() - 1)).second;
  } catch (const std::exception&) {
    return;  // the out= op's own checks decide
  }
  if (mrets.size() != 1 || !mrets[0].isTensor()) return;
  c10::ScalarType result = mrets[0].toTensor().scalar_type();
  TORCH_CHECK(c10::canCast(result, out), "result type ", result, " can't be cast to the desired output type ", out);
}

// CPU's in-place pointwise ops refuse a result dtype that cannot cast to self's
// (int.mul_(2.5)); PyTorch's meta kernels of mul_, addcmul_ and addcdiv_ do not check it,
// and the value would be silently cast. Runs where a plan is made: the key holds every
// argument's dtype (and a Python number's kind), so a plan's signature always passed.
void check_inplace_result_type(const OpInfo& info, c10::ArrayRef<IValue> args) {
  if (!args[0].isTensor() && !args[0].isTensorList()) return;
  std::vector<IValue> mrets;
  try {
    mrets = run_meta(*info.inplace_functional, args).second;
  } catch (const std::exception&) {
    return;  // the in-place op's own meta kernel accepted the call: nothing to add
  }
  if (mrets.size() != 1) return;
  auto check = [](c10::ScalarType result, c10::ScalarType self) {
    TORCH_CHECK(c10::canCast(result, self), "result type ", result, " can't be cast to the desired output type ", self);
  };
  if (args[0].isTensor() && mrets[0].isTensor()) {
    check(mrets[0].toTensor().scalar_type(), args[0].toTensor().scalar_type());
  } else if (args[0].isTensorList() && mrets[0].isTensorList()) {  // a foreach op: element by element
    auto selves = args[0].toTensorList();
    auto results = mrets[0].toTensorList();
    for (size_t k = 0; k < selves.size() && k < results.size(); ++k)
      check(results.get(k).scalar_type(), selves.get(k).scalar_type());
  }
}

// The storages an in-place or out= call rewrites whole that its program also reads (the
// write keeps what lies outside the written view): each such result may take the read
// storage's buffer (run_rewriting). None where one storage is written twice by the call.
c10::SmallVector<StorageRewrite, 2> storage_rewrites(const Plan& plan, c10::ArrayRef<IValue> args) {
  c10::SmallVector<StorageRewrite, 2> out;
  int result = 0;
  for (const OutSpec& o : plan.outs) {
    if (o.undefined) continue;
    if (o.write) {
      for (size_t i = 0; i < plan.sources.size(); ++i) {
        const Source& s = plan.sources[i];
        if (s.kind != Source::Storage || s.arg != o.arg || s.elem != o.elem) continue;
        at::Tensor tmp;
        out.push_back({static_cast<int>(i), result, &storage_data(*tensor_at(args, o.arg, o.elem, &tmp))});
        break;
      }
    }
    ++result;
  }
  for (size_t a = 0; a < out.size(); ++a)
    for (size_t b = a + 1; b < out.size(); ++b)
      if (out[a].storage == out[b].storage) return {};
  return out;
}

// The storages the call writes that its program does not read: written whole (a write
// into part of a storage reads the rest).
std::vector<StorageData*> unread_writes(const Plan& plan, c10::ArrayRef<IValue> args) {
  std::vector<StorageData*> out;
  for (const OutSpec& o : plan.outs) {
    if (o.undefined || !o.write) continue;
    bool read = std::any_of(plan.sources.begin(), plan.sources.end(), [&](const Source& s) {
      return s.kind == Source::Storage && s.arg == o.arg && s.elem == o.elem;
    });
    at::Tensor tmp;
    if (!read) out.push_back(&storage_data(*tensor_at(args, o.arg, o.elem, &tmp)));
  }
  return out;
}

// Sets each written storage's new value (the commit's part for written arguments).
void commit_writes(const Plan& plan, c10::ArrayRef<IValue> args, Results& results) {
  size_t next = 0;
  for (const OutSpec& o : plan.outs) {
    if (o.undefined) continue;
    if (o.write) {
      at::Tensor tmp;
      StorageData& sd = storage_of(*tensor_at(args, o.arg, o.elem, &tmp));
      note_replacement(results[next], sd.value);
      set_value(sd, results[next]);
    }
    ++next;
  }
}

void lowered_kernel(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                    BorrowedArgs* borrowed) {
  guarded([] { runtime::Client::check_not_forked(); return 0; });  // before any graph lock
  // Unboxed calls only come for functional ops with Tensor and Scalar arguments
  // (register_unboxed): none of these early paths, which rewrite the stack, is theirs.
  TORCH_INTERNAL_ASSERT(!borrowed || (info.cpu_indices_arg < 0 && info.cpu_tensor_arg < 0 && !info.host_fill &&
                                      !info.is_out));
  auto own = [&] {
    if (borrowed) borrowed->own();
  };
  if (info.fill_from_tensor && fill_from_other_device(stack)) return;
  // A cpu tensor written with tpu operands, or by a cpu random op given a tpu Generator
  // (out= ones with tpu inputs get check_out_device's error).
  if (!info.mutated.empty() && (!info.is_out || info.generator_arg >= 0))
    check_written_on_tpu(torch::jit::last(*stack, info.num_args), info.mutated);
  if (info.cpu_indices_arg >= 0) {
    size_t first = stack->size() - info.num_args;
    move_cpu_indices((*stack)[first + info.cpu_indices_arg], (*stack)[first].toTensor().device());
  }
  if (info.cpu_tensor_arg >= 0) {
    size_t first = stack->size() - info.num_args;
    c10::IValue& slot = (*stack)[first + info.cpu_tensor_arg];
    if (slot.isTensor() && slot.toTensor().is_cpu() && slot.toTensor().dim() > 0)
      slot = slot.toTensor().to((*stack)[first].toTensor().device());
  }
  auto args = torch::jit::last(*stack, info.num_args);
  metrics().op_calls += 1;
  if (info.value_check) info.value_check(args);
  if ((info.foreach_in_place && foreach_elements_share_memory(args, 0)) ||
      (info.foreach && foreach_spans_devices(args))) {
    own();
    run_foreach_per_element(op, stack, info.num_args);
    return;
  }
  // PyTorch's ADInplaceOrView kernels skip the foreach ops (CPU's per-tensor path and
  // CUDA's kernels bump the versions themselves): written tensors saved for a backward
  // must make it raise, not read the new values. (Bumped first, as CPU's per-tensor
  // add_: an inference tensor outside InferenceMode raises before anything is written.)
  if (info.foreach_in_place && args[0].isTensorList())
    for (const at::Tensor& t : args[0].toTensorList())
      if (t.defined()) t.unsafeGetTensorImpl()->bump_version();
  if (!info.mutated.empty()) check_overlaps(info, args);
  if (info.host_fill && try_host_fill(args[0].toTensor(), info.num_args > 1 ? args[1].toScalar() : c10::Scalar(0))) {
    torch::jit::drop(*stack, info.num_args - 1);  // self stays on the stack: the op returns it
    return;
  }

  // out=: PyTorch's meta kernel decides the out shapes; resize ours to match first.
  std::vector<at::Tensor> meta_outs;
  if (info.dtype_arg >= 0 && !args[info.dtype_arg].isNone() && args[info.mutated[0]].isTensor()) {
    // A reduction told its dtype writes an out of that dtype (CPU's kernels check it).
    c10::ScalarType want = args[info.dtype_arg].toScalarType();
    c10::ScalarType got = args[info.mutated[0]].toTensor().scalar_type();
    TORCH_CHECK(want == got, "Expected out tensor to have dtype ", c10::scalarTypeToTypeMeta(want).name(),
                ", but got ", c10::scalarTypeToTypeMeta(got).name(), " instead");
  }
  if (info.is_out) {
    move_cpu_scalars_to_out(info, stack);
    check_out_result_type(info, args);
    check_out_device(info, args);
    // CPU's argument checks before the out= meta kernel (a Python reference, whose own
    // errors differ: cat's out dtype is CPU's TypeError); they run again below, harmlessly.
    if (info.kernel_check) info.kernel_check(args);
    // An `indices` out (sort, topk, max.dim, ...) is int64 on CPU and CUDA; the reference
    // would write the indices converted.
    for (int a : info.mutated) {
      if (op.schema().arguments()[a].name() != "indices" || !args[a].isTensor()) continue;
      c10::ScalarType t = args[a].toTensor().scalar_type();
      TORCH_CHECK(t == at::kLong, "Expected out tensor to have dtype long int, but got ",
                  c10::scalarTypeToTypeMeta(t).name(), " instead");
    }
    auto [margs, mrets] = run_meta(op, args);
    for (int a : info.mutated) {
      if (margs[a].isTensor()) {
        const at::Tensor& m = margs[a].toTensor();
        at::Tensor real = args[a].toTensor();
        if (real.sizes() != m.sizes()) {
          real.resize_(m.sizes());
          // A resized out takes the layout the meta kernel gave it (TensorIterator's
          // follows its inputs' order), as CPU's does: views of its storage see it.
          if (real.strides() != m.strides()) real.as_strided_(m.sizes(), m.strides(), real.storage_offset());
        }
        meta_outs.push_back(m);
      } else {
        append_outs(margs[a], meta_outs);
      }
    }
    if (computed_in_common_dtype(info, stack)) return;
  }

  // Recording, a storage never written that an in-place op updates starts from recorded
  // zeros (a constant in the graph, as before) rather than zeros baked into the op's
  // program: the program reads the storage as the later updates do, and when the updated
  // value outlives its graph (a state made by torch.zeros) the zeros run before the graph
  // (deferred.cpp's hoist_fills), so the first step's graph is the next steps'. Not for
  // fills and random fills, which overwrite without reading.
  // Outside a recording the same holds for an optimizer's state (recording_state: inside
  // its step): its zeros come first, from one program for all the op's fresh states, so
  // the first step's update program is the later steps' (it compiled again at step 1).
  // Zeros made for other in-place ops (torch.zeros, then index_add_) stay folded into
  // their program, one launch fewer every step.
  if (!info.is_out && !info.host_fill && info.generator_arg < 0) {
    start_state_from_zeros(info, args);
    if (!info.mutated.empty() && (deferring() || recording_state())) start_unwritten_from_zeros(info, args);
  }

  thread_local KeyBuffer key_buffer;
  KeyState k(key_buffer);
  std::string_view key = build_key(info, args, k);
  std::shared_ptr<Plan> owned;  // a new plan, until the map holds it
  const Plan* plan = nullptr;   // plans are never removed: the map keeps them alive
  {
    std::lock_guard<std::mutex> lock(g_plans_mu);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) plan = it->second.get();
  }
  if (plan && plan->reads_matmul_precision) {
    // Only plans that read it pay for reading the setting; one built under another
    // precision sends the lookup to the signature extended by the current one.
    ir::DotPrecision now = torch_matmul_precision();
    if (now != plan->matmul_precision) {
      k.tag('P');
      k.tag(static_cast<char>(now));
      key = k.key.view();
      std::lock_guard<std::mutex> lock(g_plans_mu);
      auto it = g_plans.find(key);
      plan = it != g_plans.end() ? it->second.get() : nullptr;
    }
  }
  if (plan) {
    metrics().signature_hits += 1;
  } else {
    metrics().signature_misses += 1;
    // Planning may run other tpu ops on this thread, which reuse the key buffer.
    std::string new_key(key);
    std::vector<int> ret_counts;
    if (!info.is_out) {
      if (wants_sparse_variant(op, *stack)) {  // never planned: a sparse result is not a lowering's
        own();
        run_sparse_variant(op, stack);
        return;
      }
      std::vector<IValue> margs, mrets;
      try {
        std::tie(margs, mrets) = run_meta(op, args);
      } catch (const std::exception& e) {
        // Outputs whose shape depends on values cannot be planned ahead: boolean-mask
        // indices become coordinates (value_shaped_ops.cpp); anything else takes the
        // counted fallback. Other errors are the user's.
        std::string w = e.what();
        if (w.find("NotImplementedError") == std::string::npos &&
            w.find("data-independent") == std::string::npos) {
          if (info.kernel_check) info.kernel_check(args);  // CPU's own error before the meta kernel's
          own();
          raise_as_cpu_or_fallback(op, stack, info.num_args, e);
          return;
        }
        if (info.kernel_check) info.kernel_check(args);  // a mask's shape, before its coordinates
        own();
        if (redispatch_with_mask_coordinates(op, stack)) return;
        run_fallback(op, stack, "output shape depends on tensor values");
        return;
      }
      if (info.inplace_functional) check_inplace_result_type(info, args);
      if (info.mutated.empty()) {
        for (auto& r : mrets) {
          append_outs(r, meta_outs);
          ret_counts.push_back(r.isTensorList() ? static_cast<int>(r.toTensorList().size()) : 1);
        }
      } else {
        for (int a : info.mutated) append_outs(margs[a], meta_outs);
      }
    }
    if (info.kernel_check) info.kernel_check(args);  // out= forms too (their arguments lead alike)
    if (info.complex_refusal != ComplexRefusal::None) refuse_complex(info, args, meta_outs);
    refuse_integral(info, args, meta_outs);
    refuse_fp8_promotion(info, args);
    owned = build_plan(op, info, args, k, meta_outs);
    owned->ret_counts = std::move(ret_counts);
    owned->memos = std::make_unique<ScalarMemo[]>(owned->sources.size());
    plan = owned.get();
    owned->key = std::move(new_key);
    std::lock_guard<std::mutex> lock(g_plans_mu);
    g_plans.emplace(std::string_view(owned->key), owned);
  }
  if (plan->fallback) {
    own();
    run_fallback(op, stack, plan->fallback_reason);
    return;
  }
  // An imported module may read no tensor (jax_op of its inputs' shapes only): it runs
  // on the current device, where its caller's tensors are (pallas.py).
  if (k.device < 0 && info.name == "call_stablehlo") k.device = current_device();
  TORCH_CHECK(k.device >= 0, info.name, ": no tpu tensor among the arguments");
  if (write_out_later(op, info, *plan, stack)) return;

  // Gather the parameters. While deferring, nothing may flush the graph between
  // reading the operands and recording the call.
  std::unique_lock<std::recursive_mutex> recording;
  if (deferring()) recording = graph_lock();
  c10::SmallVector<Operand, 4> keep;
  for (size_t i = 0; i < plan->sources.size(); ++i) {
    const Source& s = plan->sources[i];
    at::Tensor tmp;
    switch (s.kind) {
      case Source::Storage:
        keep.push_back(storage_value(*tensor_at(args, s.arg, s.elem, &tmp)));
        break;
      case Source::CpuTensor: {
        const at::Tensor& cpu = *tensor_at(args, s.arg, s.elem, &tmp);
        runtime::BufferPtr b = scalar_buffer(cpu_scalar(cpu), s.dtype, k.device, plan->memos[i]);
        // A wrapped Python number is the graph's constant (or a number input, guarded), as
        // is torch.tensor(number) made while recording.
        bool constant = cpu.unsafeGetTensorImpl()->is_wrapped_number() || noted_constant(cpu);
        note_host_input(b, constant ? HostInput::Constant : HostInput::Varying);
        keep.push_back(std::move(b));
        break;
      }
      case Source::Scalar: {
        const IValue& v = args[s.arg];
        c10::Scalar sc = s.elem < 0 ? v.toScalar() : v.toList().get(s.elem).toScalar();
        runtime::BufferPtr b = scalar_buffer(sc, s.dtype, k.device, plan->memos[i]);
        note_host_input(b, HostInput::Constant);
        keep.push_back(std::move(b));
        break;
      }
      case Source::Number: {  // fixed by the plan: reused as such on replays
        runtime::BufferPtr b = scalar_buffer(c10::Scalar(s.number), s.dtype, k.device, plan->memos[i]);
        note_host_input(b, HostInput::Constant);
        keep.push_back(std::move(b));
        break;
      }
      case Source::ViewOffset: {  // a number the view's layout fixes: reused as such on replays
        const at::Tensor& t = *tensor_at(args, s.arg, s.elem, &tmp);
        runtime::BufferPtr b = offset_buffer(t.storage_offset(), k.device);
        note_host_input(b, HostInput::Constant);
        keep.push_back(std::move(b));
        break;
      }
      case Source::Rng: {
        std::optional<at::Generator> gen;
        if (s.arg >= 0 && args[s.arg].isGenerator()) gen = args[s.arg].toGenerator();
        runtime::BufferPtr b = rng_state_buffer(gen, k.device);
        note_host_input(b, gen ? HostInput::Varying : HostInput::Rng);
        keep.push_back(std::move(b));
        break;
      }
    }
  }
  struct Call {
    const OpInfo& info;
    c10::ArrayRef<IValue> args;
  } call{info, args};
  Results results;
  bool donated = false;  // an old buffer of a written storage went to the launch
  // Written storages no op wrote yet: the launch's outputs are their first buffers
  // (counted once, until the commit below sets them).
  FillingUnwritten filling;
  for (const OutSpec& o : plan->outs)
    if (!o.undefined && o.write) {
      at::Tensor tmp;
      filling.add(storage_data(*tensor_at(args, o.arg, o.elem, &tmp)));
    }
  {
    NamingCall naming([](const void* c) {
      auto* call = static_cast<const Call*>(c);
      return describe(call->info, call->args);
    }, &call);
    const bool eager = !recording.owns_lock() && !deferring();
    c10::SmallVector<StorageRewrite, 2> rewrites;
    if (eager && eager_donation()) rewrites = storage_rewrites(*plan, args);
    // Storages written whole and not read (x.normal_()): their old buffers go first.
    std::vector<StorageData*> dropped;
    if (eager && !info.mutated.empty() && plan->checks.empty()) {
      std::vector<StorageData*> unread = unread_writes(*plan, args);
      if (!unread.empty()) {
        runtime::ExecutablePtr exe = plan->program->executable();
        dropped = drop_overwritten(unread, k.device, exe->output_bytes() + exe->temp_bytes());
      }
    }
    try {
      if (!rewrites.empty())
        results = run_rewriting(plan->program, keep, k.device, rewrites.data(), rewrites.size(), &donated);
      else
        results = run(plan->program, keep, k.device, true, recording.owns_lock());
    } catch (const std::exception& e) {
      fail_overwrite(dropped, e);
      throw;
    }
    finish_overwrite(dropped);
  }

  // Debug mode reads each check at once: before the results are committed, so a failed
  // op leaves the tensors it would have written as they were. So do the ops whose CUDA
  // kernels read their checks on the host before returning.
  bool at_call = !plan->checks.empty() && checks_at_call(info, args);
  bool checks_read = !plan->checks.empty() && (eager_mode() == EagerMode::Debug || at_call);
  if (checks_read) {
    try {
      size_t first_check = results.size() - plan->checks.size();
      for (size_t c = 0; c < plan->checks.size(); ++c) add_device_check(results[first_check + c], plan->checks[c]);
      if (at_call) verify_device_checks();
    } catch (...) {
      // A donated old value is gone: the written results hold it (a checked in-place
      // rule leaves its argument as it was when its check fails).
      if (donated) commit_writes(*plan, args, results);
      throw;
    }
  }

  // Commit results: new storage buffers for mutated args, new tensors otherwise.
  c10::SmallVector<at::Tensor, 2> fresh;
  // New tensors a failed device check makes unreadable. (A written argument keeps its
  // values: the rules of checked in-place ops leave it as it was when the check fails.)
  std::vector<c10::Storage> checked;
  size_t next_result = 0;
  for (const OutSpec& o : plan->outs) {
    if (o.undefined) {
      fresh.emplace_back();
    } else if (o.write) {
      at::Tensor tmp;
      StorageData& sd = storage_of(*tensor_at(args, o.arg, o.elem, &tmp));
      note_replacement(results[next_result], sd.value);
      set_value(sd, std::move(results[next_result++]));
    } else {
      Operand v = std::move(results[next_result++]);
      fresh.push_back(o.strides.empty() ? wrap_value(std::move(v), o.dtype, o.sizes, k.device)
                                        : wrap_value(std::move(v), o.dtype, o.sizes, o.strides, k.device));
    }
  }

  if (!plan->checks.empty())
    for (const at::Tensor& t : fresh)
      if (t.defined()) checked.push_back(t.storage());
  if (!checks_read)
    for (const std::string& message : plan->checks) add_device_check(results[next_result++], message, checked);

  c10::SmallVector<IValue, 4> out_vals;
  size_t next_fresh = 0;
  for (size_t r = 0; r < info.ret_alias.size(); ++r) {
    int alias = info.ret_alias[r];
    if (alias >= 0) {
      out_vals.push_back(args[alias]);  // the written argument this return aliases
    } else if (alias == OpInfo::kNoArgument) {
      continue;  // as before: a written return with no matching argument adds nothing
    } else if (alias == OpInfo::kListReturn) {
      c10::List<at::Tensor> l;
      for (int n = 0; n < plan->ret_counts.at(r); ++n) l.push_back(std::move(fresh.at(next_fresh++)));
      out_vals.push_back(std::move(l));
    } else {
      out_vals.push_back(std::move(fresh.at(next_fresh++)));
    }
  }
  if (borrowed) borrowed->release();
  torch::jit::drop(*stack, info.num_args);
  for (auto& v : out_vals) stack->push_back(std::move(v));
}

// Benchmarks' floor of a recorded op: with the probe on, a kernel whose op returns one
// tensor returns a new tensor over its first argument's storage and does nothing else,
// so timing `x + 1` then measures PyTorch's own cost of the call (Python binding,
// argument parsing, autograd, boxing, the result's tensor and Python object, freeing
// them) that recording one op cannot go below while each op is a PyTorch call. With
// the launching probe, each such call also makes one chained launch through the runtime
// alone: Strict's floor measured in place, the two costs interleaved as they run.
enum FloorProbe : int { kProbeOff = 0, kProbeDispatch = 1, kProbeDispatchAndLaunch = 2 };
std::atomic<int> g_dispatch_floor_probe{kProbeOff};
runtime::ChainProbe* g_chain_probe = nullptr;  // kept once made (its buffers outlive exit)

at::Tensor floor_probe_result(const at::Tensor& t) {
  if (g_dispatch_floor_probe.load(std::memory_order_relaxed) == kProbeDispatchAndLaunch)
    guarded([] { g_chain_probe->step(); return 0; });
  at::Tensor r = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  r.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return r;
}

// The kernel registered per op carries its OpInfo: no lookup by operator name (two
// string hashes) on every call.
// The JIT tracer never records `convolution`: CPU's and CUDA's kernels call _convolution,
// which it records. While tracing, call _convolution too, so that the trace holds the op
// and not its result as a constant; its kernel comes back to our rule through
// convolution_overrideable, the hook PyTorch gives backends outside its tree.
void convolution_for_tracer(torch::jit::Stack* stack) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::_convolution", "");
  for (bool flag : {false, false, true, true}) stack->emplace_back(flag);  // benchmark .. allow_tf32
  op.callBoxed(stack);
}

struct LoweredKernel final : c10::OperatorKernel {
  explicit LoweredKernel(const OpInfo* i) : info(i) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    if (info->traced_as_convolution && torch::jit::tracer::isTracing()) return convolution_for_tracer(stack);
    if (g_dispatch_floor_probe.load(std::memory_order_relaxed) && info->ret_alias.size() == 1 &&
        info->num_args > 0 && (*stack)[stack->size() - info->num_args].isTensor()) {
      at::Tensor result = floor_probe_result((*stack)[stack->size() - info->num_args].toTensor());
      torch::jit::drop(*stack, info->num_args);
      stack->push_back(std::move(result));
      return;
    }
    lowered_kernel(op, *info, stack);
  }
  const OpInfo* info;  // an element of infos(): nodes never move
};

// The kernel of a functional op with Tensor and Scalar arguments, called unboxed.
// The boxed kernel gets copies of its tensor arguments, and copying a tensor that has a
// Python object takes the GIL (PyObject preservation: its refcount going 1 -> 2, then
// 2 -> 1 when the stack drops it). Here the stack borrows them from the caller, which
// holds them for the call, and lets go of them without dropping a reference.
void push_borrowed(torch::jit::Stack& stack, BorrowedArgs& b, const at::Tensor& t) {
  if (t.defined()) {
    b.mask |= 1u << (stack.size() - b.first);
    stack.emplace_back(at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim(
        t.unsafeGetTensorImpl())));
  } else {
    stack.emplace_back(at::Tensor());
  }
}
void push_borrowed(torch::jit::Stack& stack, BorrowedArgs&, const c10::Scalar& s) { stack.emplace_back(s); }

template <class... Args>
at::Tensor call_unboxed(const c10::OperatorHandle& op, const OpInfo& info, const at::Tensor& self,
                        const Args&... rest) {
  if (g_dispatch_floor_probe.load(std::memory_order_relaxed)) return floor_probe_result(self);
  // Each nesting depth of these calls on a thread reuses one stack: no allocation per
  // call once warm (an op's planning or fallback may call another op).
  thread_local std::deque<torch::jit::Stack> stacks;
  thread_local size_t depth = 0;
  if (depth == stacks.size()) stacks.emplace_back().reserve(8);
  torch::jit::Stack& stack = stacks[depth];
  stack.clear();
  struct Nest {
    size_t& d;
    ~Nest() { --d; }
  } nest{++depth};
  BorrowedArgs borrowed{&stack, 0};
  push_borrowed(stack, borrowed, self);
  (push_borrowed(stack, borrowed, rest), ...);
  try {
    lowered_kernel(op, info, &stack, &borrowed);
  } catch (...) {
    borrowed.release();
    stack.clear();  // what it holds belongs to the caller's failed call
    throw;
  }
  TORCH_INTERNAL_ASSERT(stack.size() == 1 && stack.back().isTensor(), info.name, ": expected one tensor result");
  at::Tensor result = std::move(stack.back()).toTensor();
  stack.clear();
  return result;
}

// Registers `info`'s op with an unboxed kernel where its schema is one of the common
// functional signatures below; false (the boxed kernel is registered) otherwise.
bool register_unboxed(torch::Library& lib, const char* name, const c10::OperatorHandle& op,
                      const OpInfo* info) {
  const c10::FunctionSchema& schema = op.schema();
  if (!info->mutated.empty() || info->is_out || info->cpu_indices_arg >= 0 || info->cpu_tensor_arg >= 0 ||
      info->host_fill ||
      schema.returns().size() != 1 || schema.returns()[0].type()->kind() != c10::TypeKind::TensorType ||
      schema.returns()[0].alias_info() || schema.is_vararg() || schema.is_varret())
    return false;
  std::string sig;  // T: Tensor, S: Scalar
  for (const auto& a : schema.arguments()) {
    if (a.alias_info()) return false;
    auto kind = a.type()->kind();
    if (kind == c10::TypeKind::TensorType) sig += 'T';
    else if (kind == c10::TypeKind::NumberType) sig += 'S';
    else return false;
  }
  using T = const at::Tensor&;
  using S = const c10::Scalar&;
  if (sig == "T") {
    lib.impl(name, [op, info](T a) { return call_unboxed(op, *info, a); });
  } else if (sig == "TT") {
    lib.impl(name, [op, info](T a, T b) { return call_unboxed(op, *info, a, b); });
  } else if (sig == "TTS") {
    lib.impl(name, [op, info](T a, T b, S c) { return call_unboxed(op, *info, a, b, c); });
  } else if (sig == "TS") {
    lib.impl(name, [op, info](T a, S b) { return call_unboxed(op, *info, a, b); });
  } else if (sig == "TSS") {
    lib.impl(name, [op, info](T a, S b, S c) { return call_unboxed(op, *info, a, b, c); });
  } else {
    return false;
  }
  return true;
}

// Per return of the schema: the written argument it aliases, or where its tensors come
// from (computed once: comparing alias sets per call costs more than the op's lookup).
std::vector<int> return_aliases(const c10::FunctionSchema& schema) {
  std::vector<int> out;
  const auto& sargs = schema.arguments();
  for (const auto& ret : schema.returns()) {
    const auto* alias = ret.alias_info();
    int v = ret.type()->kind() == c10::TypeKind::ListType ? OpInfo::kListReturn : OpInfo::kFreshReturn;
    if (alias && alias->isWrite()) {
      v = OpInfo::kNoArgument;
      for (size_t a = 0; a < sargs.size(); ++a)
        if (sargs[a].alias_info() && sargs[a].alias_info()->beforeSets() == alias->beforeSets()) {
          v = static_cast<int>(a);
          break;
        }
    }
    out.push_back(v);
  }
  return out;
}

// The rule for an op: its own, the functional op's for an in-place op, or the
// functional op with the same non-out arguments for an out= op.
// `prefix` selects a family of rules ("complex:" for the complex overrides).
const lowering::Rule* rule_for(const c10::FunctionSchema& schema, const std::string& prefix = "") {
  std::string base = schema.name().substr(schema.name().find("::") + 2);
  const std::string& ov = schema.overload_name();
  if (auto* r = lowering::find_rule(prefix + (ov.empty() ? base : base + "." + ov))) return r;
  if (!base.empty() && base.back() == '_') {
    std::string f = base.substr(0, base.size() - 1);
    if (auto* r = lowering::find_rule(prefix + (ov.empty() ? f : f + "." + ov))) return r;
  }
  if (!schema.is_mutable()) return nullptr;
  std::vector<std::string> want;
  for (const auto& a : schema.arguments())
    if (!(a.kwarg_only() && a.alias_info() && a.alias_info()->isWrite()))
      want.push_back(a.name() + ":" + a.type()->str());
  for (const std::string& full : lowering::overloads_of(prefix + base)) {
    std::string name = full.substr(prefix.size());
    std::string rov = name.find('.') == std::string::npos ? "" : name.substr(name.find('.') + 1);
    auto h = c10::Dispatcher::singleton().findSchema({"aten::" + base, rov});
    if (!h) continue;
    std::vector<std::string> have;
    for (const auto& a : h->schema().arguments()) have.push_back(a.name() + ":" + a.type()->str());
    if (have == want) return lowering::find_rule(full);
  }
  return nullptr;
}

// The functional overload of an out= op: the overload whose arguments are the out= op's
// without its out (mul.Tensor for mul.out).
std::optional<c10::OperatorHandle> functional_of(const c10::FunctionSchema& schema,
                                                 const std::vector<c10::OperatorName>& candidates) {
  const auto& want = schema.arguments();
  for (const c10::OperatorName& c : candidates) {
    auto h = c10::Dispatcher::singleton().findOp(c);
    if (!h || !h->hasSchema() || h->schema().is_mutable()) continue;
    const auto& have = h->schema().arguments();
    if (have.size() + 1 != want.size() || h->schema().returns().size() != 1) continue;
    bool same = true;
    for (size_t i = 0; i < have.size() && same; ++i)
      same = have[i].name() == want[i].name() && *have[i].type() == *want[i].type();
    if (same) return h;
  }
  return std::nullopt;
}

}  // namespace

runtime::BufferPtr view_offset_operand(int64_t offset, int device) {
  runtime::BufferPtr b = offset_buffer(offset, device);
  note_host_input(b, HostInput::Constant);  // as a lowered op's ViewOffset source
  return b;
}

runtime::BufferPtr view_offset_operand(const at::Tensor& t) {
  return view_offset_operand(t.storage_offset(), device_index(t));
}

ir::DotPrecision torch_matmul_precision() {
  at::Float32MatmulPrecision p;
  try {
    p = at::globalContext().float32MatmulPrecision();
  } catch (const c10::Error&) {
    // PyTorch refuses to answer once the legacy and per-backend settings disagree; a
    // program moved from CUDA then means the CUDA matmul setting.
    switch (at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL)) {
      case at::Float32Precision::TF32: return ir::DotPrecision::High;
      case at::Float32Precision::BF16: return ir::DotPrecision::Default;
      default: return ir::DotPrecision::Highest;
    }
  }
  return p == at::Float32MatmulPrecision::HIGHEST ? ir::DotPrecision::Highest
         : p == at::Float32MatmulPrecision::HIGH  ? ir::DotPrecision::High
                                                  : ir::DotPrecision::Default;
}

runtime::BufferPtr rng_state_buffer(const std::optional<at::Generator>& gen, int device) {
  auto [seed, counter] = next_rng_state(gen, device);
  // Threefry streams of (key, n) and (key, n+1) overlap: give each op its own key.
  int64_t st[2] = {static_cast<int64_t>(splitmix64(seed ^ splitmix64(counter))), 0};
  return guarded([&] { return runtime::Client::get().from_host(st, DType::I64, {2}, device); });
}

// CompositeImplicitAutograd ops whose results are bool, so no gradient flows through
// them: one lowering rule replaces the composite's chain of programs.
static bool composite_without_gradient(const std::string& name) { return name == "aten::isclose"; }

int register_lowered_kernels() {
  static torch::Library* lib = new torch::Library(torch::Library::IMPL, "aten",
                                                  c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  // Our own ops with lowering rules (external_op.cpp).
  static torch::Library* own = new torch::Library(torch::Library::IMPL, "torch_tpu",
                                                  c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  int n = 0;
  auto& d = c10::Dispatcher::singleton();
  std::map<std::string, std::vector<c10::OperatorName>> overloads;  // aten::mul -> its overloads
  for (const c10::OperatorName& name : d.getAllOpNames()) overloads[name.name].push_back(name);
  for (const c10::OperatorName& name : d.getAllOpNames()) {
    bool ours = name.name.rfind("torch_tpu::", 0) == 0;  // our own ops (external_op.cpp, foreach_norm.cpp)
    if (name.name.rfind("aten::", 0) != 0 && !ours) continue;
    auto h = d.findOp(name);
    if (!h || !h->hasSchema()) continue;
    // A backend kernel on a CompositeImplicitAutograd op would bypass its autograd, unless
    // the op's results are never differentiable.
    if (h->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
        !composite_without_gradient(name.name))
      continue;
    const c10::FunctionSchema& schema = h->schema();
    if (is_glue_op(op_key_name(name))) continue;
    const lowering::Rule* rule = rule_for(schema);
    const lowering::Rule* complex_rule = rule_for(schema, "complex:");
    if (!rule && !complex_rule) continue;
    OpInfo info;
    info.name = op_key_name(name);
    if (ours) info.ns = "torch_tpu";
    info.rule = rule;
    info.complex_rule = complex_rule;
    if (rule && !complex_rule) info.runtime_args = lowering::find_runtime_args(*rule);
    const auto& sargs = schema.arguments();
    info.num_args = static_cast<int>(sargs.size());
    for (size_t i = 0; i < sargs.size(); ++i) {
      const auto& a = sargs[i];
      bool write = a.alias_info() && a.alias_info()->isWrite();
      bool out = write && a.kwarg_only();
      if (write) info.mutated.push_back(static_cast<int>(i));
      if (out) info.is_out = true;
      info.is_scalar.push_back(is_number_type(a.type()) || (is_runtime_arg(info, static_cast<int>(i)) &&
                                                            is_int_or_float_type(a.type())));
      if (a.type()->kind() == c10::TypeKind::OptionalType &&
          a.type()->cast<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType)
        info.generator_arg = static_cast<int>(i);
      if (a.type()->kind() == c10::TypeKind::ListType &&
          a.type()->cast<c10::ListType>()->getElementType()->kind() == c10::TypeKind::OptionalType)
        info.cpu_indices_arg = static_cast<int>(i);
      if (a.name() == "alpha" && a.type()->kind() == c10::TypeKind::NumberType) info.alpha_arg = static_cast<int>(i);
    }
    if (info.is_out && info.mutated.size() == 1) {
      for (size_t i = 0; i < schema.arguments().size(); ++i) {
        // A ScalarType is an int to the schema's types: the name tells it.
        const auto& a = schema.arguments()[i];
        auto opt = a.type()->cast<c10::OptionalType>();
        auto kind = (opt ? opt->getElementType() : a.type())->kind();
        if (a.name() == "dtype" && (kind == c10::TypeKind::ScalarTypeType || kind == c10::TypeKind::IntType))
          info.dtype_arg = static_cast<int>(i);
      }
    }
    std::string base = name.name.substr(6);
    if (!base.empty() && base.back() == '_') base.pop_back();
    if (!moves_cpu_indices(base)) info.cpu_indices_arg = -1;
    // CUDA's bernoulli_(p) copies a cpu p to the device; CPU's kernel has no device rule.
    if (base == "bernoulli" && sargs.size() > 1 && sargs[1].type()->kind() == c10::TypeKind::TensorType)
      info.cpu_tensor_arg = 1;
    info.check_internal_overlap = !cpu_allows_internal_overlap(base);
    // An in-place op's own check (its self is the result), else its base's.
    KernelCheck in_place_check = name.name.back() == '_' ? kernel_check_for(name.name.substr(6)) : nullptr;
    info.kernel_check = in_place_check ? in_place_check : kernel_check_for(base);
    info.value_check = value_check_for(base);
    info.base = base;
    info.base_overload = name.overload_name.empty() ? base : base + "." + name.overload_name;
    info.complex_refusal = complex_refusal_for(info.base_overload, base);
    info.foreach = base.rfind("_foreach_", 0) == 0;
    info.foreach_in_place = info.foreach && name.name.back() == '_' &&
                            info.mutated.size() == 1 && info.mutated[0] == 0;
    info.check_any_input_overlap = cpu_forbids_any_input_overlap(base);
    info.check_input_overlap = info.check_any_input_overlap || !cpu_allows_input_overlap(base);
    info.host_fill = info.name == "fill_.Scalar" || info.name == "zero_";
    info.fill_from_tensor = info.name == "fill_.Tensor";
    info.traced_as_convolution = info.name == "convolution";
    info.pointwise = h->hasTag(at::Tag::pointwise);
    info.promotes_inputs = info.pointwise || promotes_all_inputs(base);
    info.ret_alias = return_aliases(schema);
    if (info.is_out && info.mutated.size() == 1 && info.mutated[0] == info.num_args - 1 &&
        h->hasTag(at::Tag::pointwise))
      info.functional = functional_of(schema, overloads[name.name]);
    // (copy_ and zero_ cast by design: they have no result type to check)
    bool foreach_checked = info.foreach_in_place && base != "_foreach_copy" && base != "_foreach_zero";
    if (!info.is_out && info.mutated.size() == 1 && info.mutated[0] == 0 && name.name.back() == '_' &&
        (h->hasTag(at::Tag::pointwise) || foreach_checked))
      info.inplace_functional = c10::Dispatcher::singleton().findOp(
          {name.name.substr(0, name.name.size() - 1), name.overload_name});
    // Rules index the functional op's arguments: out= args come last, so they line up.
    const OpInfo* stored = &infos().emplace(name, std::move(info)).first->second;
    // torch::Library keeps the name pointer: give it storage that lives as long.
    static std::deque<std::string> names;
    names.push_back(name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
    torch::Library* target = ours ? own : lib;
    if (!register_unboxed(*target, names.back().c_str(), *h, stored))
      target->impl(names.back().c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<LoweredKernel>(stored)));
    ++n;
  }
  return n;
}

std::vector<std::string> lowered_op_names() {
  std::vector<std::string> out;
  for (auto& [h, i] : infos()) out.push_back(i.name);
  return out;
}

void set_dispatch_floor_probe(int mode) {
  if (mode == kProbeDispatchAndLaunch && !g_chain_probe)
    g_chain_probe = guarded([] { return new runtime::ChainProbe(runtime::Client::get(), current_device()); });
  g_dispatch_floor_probe.store(mode);
}

float wait_chain_probe() { return g_chain_probe ? guarded([] { return g_chain_probe->wait(); }) : 0.0f; }

}  // namespace tpu::backend
