#include "backend/captured_graph.h"

#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <map>

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>

#include "backend/device.h"
#include "backend/device_checks.h"
#include "backend/executor.h"
#include "backend/storage.h"

namespace py = pybind11;

namespace tpu::backend {
namespace {

bool same_type(const ir::Type& a, const ir::Type& b) { return a.dtype == b.dtype && a.shape == b.shape; }

const void* identity(const Operand& v) {
  return v.slot ? static_cast<const void*>(v.slot.get()) : static_cast<const void*>(v.buffer.get());
}

// What a tensor's program and its view depend on.
struct TensorSpec {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  size_t nbytes = 0;
  int device = 0;

  static TensorSpec of(const at::Tensor& t) {
    TensorSpec s;
    s.dtype = t.scalar_type();
    s.sizes.assign(t.sizes().begin(), t.sizes().end());
    s.strides.assign(t.strides().begin(), t.strides().end());
    s.offset = t.storage_offset();
    s.nbytes = t.storage().nbytes();
    s.device = device_index(t);
    return s;
  }
  bool matches(const at::Tensor& t) const {
    return t.scalar_type() == dtype && t.sizes().vec() == sizes && t.strides().vec() == strides &&
           t.storage_offset() == offset && t.storage().nbytes() == nbytes && device_index(t) == device;
  }
};

// A strided tpu tensor with no lazy conj/neg bit: one storage read as is. A sparse one
// (an Embedding(sparse=True) weight's gradient) has no storage of its own, so a graph
// taking or returning one is not replayed.
bool plain_tpu_tensor(const py::handle& h, at::Tensor* out) {
  if (!THPVariable_Check(h.ptr())) return false;
  at::Tensor t = THPVariable_Unpack(h.ptr());
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || t.layout() != c10::kStrided ||
      t.is_conj() || t.is_neg())
    return false;
  *out = std::move(t);
  return true;
}

// Builds a tensor on `storage` with the recorded view.
at::Tensor tensor_on(const c10::Storage& storage, const TensorSpec& s) {
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), ks,
                                                          caffe2::TypeMeta::fromScalarType(s.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(s.sizes, s.strides, s.offset);
  return t;
}

c10::Storage storage_holding(Operand value, size_t nbytes, int device) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  std::optional<AllocatingForValue> computed;
  if (value) computed.emplace();
  c10::Storage st(c10::Storage::use_byte_size_t(), nbytes, tpu_allocator(), /*resizable=*/true);
  computed.reset();
  set_value(*static_cast<StorageData*>(st.data_ptr().get_context()), std::move(value));
  return st;
}

}  // namespace

// One recorded call of a graph, and (once explained) how to launch its program again.
// Hidden, as pybind11 is: it holds Python objects.
class __attribute__((visibility("hidden"))) CapturedGraph {
 public:
  // `apart`: the call is a training step's forward, backward or update after them, whose
  // program joins the step's pending graph (see begin_side_recording): it is recorded
  // apart from that graph, explained, then (recorded_apart) discarded and replayed into
  // it by the caller. A step's first program is then the one its later steps run.
  CapturedGraph(const py::list& args, const std::vector<int>& mutated, bool apart) : mutated_(mutated) {
    if (apart) {
      std::vector<Operand> pending;
      for (size_t k = 0; k < args.size(); ++k) {
        at::Tensor t;
        if (plain_tpu_tensor(args[k], &t) && storage_of(t).value) pending.push_back(storage_of(t).value);
      }
      begin_side_recording(pending);
      apart_ = true;
      // The recording draws random states the replay draws again: it gives them back.
      for (int d = 0; d < device_count(); ++d) rng_offsets_.push_back(default_generator(d).get_offset());
    }
    // A storage never written reads as zeros, which the recorded program bakes in as a
    // constant: the capture then matches only calls whose input is unwritten again
    // (right for a zero tangent AOTAutograd makes afresh each call). An input the graph
    // writes is written by then: a compiled optimizer's first step reads its fresh state
    // (exp_avg...) unwritten, so its second step recorded and compiled the update again,
    // and the joined step program a step later. Such storages get their zeros first,
    // recorded and flushed as one small program of their own (compiled off this thread),
    // so the graph's program reads them as inputs like any other. So do queued copies
    // into an input (Debug's eager `.contiguous()` of a backward's expanded seed is a
    // copy of a view left to its first read): run inside the recording, the program read
    // the copy's source, which is no input, and the capture declined.
    bool settle = false;
    for (size_t k = 0; k < args.size(); ++k) {
      Input in;
      at::Tensor t;
      py::handle h = args[k];
      if (THPVariable_Check(h.ptr())) {
        if (!plain_tpu_tensor(h, &t)) {
          decline("input " + std::to_string(k) + " is not a plain tpu tensor");
          return;
        }
        StorageData& queued = storage_data(t);
        if (queued.copy_of || !queued.pending.empty()) settle = true;
        StorageData& sd = storage_of(t);  // (records the queued copies)
        if (!sd.unreadable.empty()) {
          decline("input " + std::to_string(k) + " holds nothing to read");
          return;
        }
        if (!sd.value && std::find(mutated.begin(), mutated.end(), static_cast<int>(k)) != mutated.end()) {
          storage_value(t);
          settle = true;
        }
        in.tensor = true;
        in.spec = TensorSpec::of(t);
        in.entry = sd.value ? identity(sd.value) : nullptr;  // none: never written (zeros)
        if (apart) in.entry_value = sd.value;  // (held only through the call: donation)
        if (!sd.pending.empty() || sd.copy_of) plain_storages_ = false;
        if (sd.value) in.type = sd.value.type();
        in.storage = t.storage().getWeakStorageImpl();
        for (size_t e = 0; e < inputs_.size(); ++e)
          if (inputs_[e].tensor && inputs_[e].storage._unsafe_get_target() == in.storage._unsafe_get_target()) {
            in.shares = static_cast<int>(e);
            break;
          }
      } else if (py::isinstance<py::int_>(h) || py::isinstance<py::float_>(h) || py::isinstance<py::bool_>(h) ||
                 h.is_none()) {
        in.value = py::reinterpret_borrow<py::object>(h);
      } else {
        decline("input " + std::to_string(k) + " is neither a tensor nor a number");
        return;
      }
      inputs_.push_back(std::move(in));
    }
    if (settle) flush("zeros and queued copies of compiled graph inputs");
  }

  bool ready() const { return static_cast<bool>(graph_); }
  // Its recording was discarded (nothing ran): the caller replays the call.
  bool recorded_apart() const { return recorded_apart_; }
  // Why the last replay did not match (which input, in what).
  const std::string& miss_reason() const { return miss_; }
  const std::string& why() const { return why_; }

  // Recording hooks (under the graph lock, while this capture is active).
  void host_input(const runtime::BufferPtr& b, HostInput kind) {
    // Cached scalar buffers are shared: one that some op read from a CPU tensor varies.
    auto [it, fresh] = host_inputs_.emplace(b.get(), std::make_pair(b, kind));
    if (!fresh && kind == HostInput::Varying) it->second.second = kind;
  }
  void check(const Operand& ok, const std::string& message) {
    if (ok.slot) checks_[ok.slot.get()] = message;
  }
  // A 0-D tensor made from a Python number while recording (torch.tensor(-inf) in a
  // higher-order op's eager body, which runs at each call): a constant of the graph, as a
  // Python scalar argument is. On tpu its upload is; on the CPU the tensor is, while no
  // in-place op changes it (its version).
  void constant_tensor(const at::Tensor& t) {
    if (t.is_cpu() && t.dim() == 0) {
      constant_cpu_.emplace_back(t, t._version());
    } else if (t.is_privateuseone()) {
      const Operand& v = storage_of(t).value;
      if (v.buffer && !v.slot) host_input(v.buffer, HostInput::Constant);
    }
  }
  bool constant_cpu(const at::Tensor& t) const {
    for (const auto& [c, version] : constant_cpu_)
      if (c.unsafeGetTensorImpl() == t.unsafeGetTensorImpl() && t._version() == version) return true;
    return false;
  }
  void flushed(const FlushReport& r) { reports_.push_back(r); }
  void host_read() { decline("the graph reads a device value on the host (.item(), .tolist())"); }

  // After the recorded call: flush, then explain the program in terms of the graph.
  void finish(const py::list& outs);
  // The recorded call raised.
  void abort() {
    set_flush_observer(nullptr);
    g_active_clear();
    constant_cpu_.clear();
    for (Input& in : inputs_) in.entry_value = Operand();
    if (apart_) end_side_recording(/*drop=*/false);
  }

  // Launches the program on `args` when they look like the recorded ones (clearing
  // `args`, as the boxed call does); None otherwise, leaving `args` alone. `how`:
  // Launch (a program of its own), Defer (one call in the pending graph, its results
  // pending until something flushes it), Join (Defer then flush when calls are pending,
  // e.g. a training step's forward and backward; otherwise Launch).
  enum class How { Launch = 0, Defer = 1, Join = 2 };
  py::object replay(py::list args, int how);

 private:
  struct Input {
    bool tensor = false;
    TensorSpec spec;
    const void* entry = nullptr;  // the storage's value at the call
    Operand entry_value;          // ... itself (a discarded recording puts it back)
    ir::Type type;
    int shares = -1;              // an earlier input on the same storage
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
    py::object value;             // a number input: must stay equal
  };
  enum class From { Input, Constant, Rng };
  struct Param {
    From from;
    int input = -1;
    runtime::BufferPtr constant;
  };
  enum class OutKind { None, Result, InputStorage, InputValue, Unwritten };
  struct Output {
    OutKind kind = OutKind::None;
    int index = -1;  // result, or input
    int group = -1;  // outputs on one new storage share a group (its first output)
    TensorSpec spec;
  };

  py::object miss(const char* what, size_t k) {
    miss_ = std::string(what) + " of input " + std::to_string(k);
    return py::none();
  }
  void decline(std::string why) {
    if (why_.empty()) why_ = std::move(why);
  }
  void explain(const py::list& outs);
  void drop_recording();
  static void g_active_clear();

  bool apart_ = false;           // recorded apart from the pending graph
  bool recorded_apart_ = false;  // ... and discarded
  bool plain_storages_ = true;   // no input storage has queued view copies
  std::vector<uint64_t> rng_offsets_;  // each device generator's offset at the call
  std::vector<const void*> recorded_checks_;  // the recording's device checks' flags

  std::vector<Input> inputs_;
  std::vector<int> mutated_;
  std::map<const void*, std::pair<runtime::BufferPtr, HostInput>> host_inputs_;
  std::vector<std::pair<at::Tensor, int64_t>> constant_cpu_;  // (tensor, its version), while recording
  std::map<const void*, std::string> checks_;
  std::vector<FlushReport> reports_;
  std::string why_, miss_;

  FlushedGraphPtr graph_;
  ProgramPtr program_;  // graph_ as one call of a pending graph (made on first Defer)
  int device_ = 0;
  // The recorded program's f32 matmuls took this precision; another setting records anew.
  ir::DotPrecision matmul_precision_ = torch_matmul_precision();
  std::vector<Param> params_;
  std::vector<Output> outputs_;
  std::vector<std::pair<int, int>> writes_;  // input k's storage takes result j
  std::vector<std::pair<int, std::string>> result_checks_;
};

namespace {
std::atomic<CapturedGraph*> g_active{nullptr};
// Set (on the recording thread) while an ATen op of the recorded graph runs whose
// arguments hold Python numbers and no CPU tensor. A CPU 0-D tensor its kernel reads then
// came from those numbers: functorch's batching rules (a flex_attention score_mod's
// `score * 0.5` under vmap) convert the wrapped number to the other operand's dtype,
// a plain CPU tensor that no longer says it was a number.
thread_local bool t_number_scope = false;
}  // namespace

void note_host_input(const runtime::BufferPtr& b, HostInput kind) {
  if (CapturedGraph* c = g_active.load()) c->host_input(b, kind);
}
bool noted_constant(const at::Tensor& cpu) {
  CapturedGraph* c = g_active.load();
  return c && ((t_number_scope && cpu.dim() == 0) || c->constant_cpu(cpu));
}
void note_host_read() {
  if (CapturedGraph* c = g_active.load()) c->host_read();
}
void note_device_check(const Operand& ok, const std::string& message) {
  if (CapturedGraph* c = g_active.load()) c->check(ok, message);
}

void CapturedGraph::g_active_clear() { g_active.store(nullptr); }

void CapturedGraph::finish(const py::list& outs) {
  const bool apart = apart_ && side_recording();  // not spoiled by a value read meanwhile
  if (apart) flush_held("compiled graph");
  else flush("compiled graph");
  set_flush_observer(nullptr);
  g_active.store(nullptr);
  constant_cpu_.clear();
  explain(outs);
  if (!apart_) return;
  struct Release {  // the inputs' values, held for the call only
    std::vector<Input>& inputs;
    ~Release() {
      for (Input& in : inputs) in.entry_value = Operand();
    }
  } release{inputs_};
  if (apart && graph_ && !held_calls_own()) {  // another thread's ops joined the recording
    graph_.reset();
    decline("another thread's ops joined its recording");
  }
  for (const Input& in : inputs_) {  // a storage's queued view copies are not put back
    c10::intrusive_ptr<c10::StorageImpl> st = in.tensor ? in.storage.lock() : nullptr;
    const auto* sd = st ? static_cast<const StorageData*>(st->data_ptr().get_context()) : nullptr;
    if (sd && (!sd->pending.empty() || sd->copy_of)) plain_storages_ = false;
  }
  if (apart && graph_ && plain_storages_) {
    drop_recording();
    return;
  }
  end_side_recording(/*drop=*/false);  // it runs as recorded, after the set-aside graph
}

// The recording is discarded: its writes into inputs are undone and its random draws
// given back, so the caller's replay computes the call as the recording would have.
void CapturedGraph::drop_recording() {
  forget_device_checks(recorded_checks_);  // flags never computed; the replay adds its own
  recorded_checks_.clear();
  end_side_recording(/*drop=*/true);
  for (const Input& in : inputs_) {
    if (!in.tensor) continue;
    c10::intrusive_ptr<c10::StorageImpl> st = in.storage.lock();
    if (!st) continue;
    auto* sd = static_cast<StorageData*>(st->data_ptr().get_context());
    const void* now = sd->value ? identity(sd->value) : nullptr;
    if (now != in.entry) set_value(*sd, in.entry_value);
  }
  for (size_t d = 0; d < rng_offsets_.size(); ++d) {
    at::Generator g = default_generator(static_cast<int>(d));
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_offset(rng_offsets_[d]);
  }
  recorded_apart_ = true;
}

void CapturedGraph::explain(const py::list& outs) {
  if (!why_.empty()) return;
  if (reports_.size() != 1)
    return decline(reports_.empty() ? "the graph ran no program" : "the graph was flushed in parts");
  const FlushReport& r = reports_[0];

  // Parameters: graph inputs, constants, or random states.
  for (size_t i = 0; i < r.params.size(); ++i) {
    Param p{From::Input};
    for (size_t k = 0; k < inputs_.size() && p.input < 0; ++k)
      if (inputs_[k].tensor && inputs_[k].entry == r.params[i]) p.input = static_cast<int>(k);
    if (p.input < 0) {
      auto it = host_inputs_.find(r.params[i]);
      if (it == host_inputs_.end()) return decline("the graph reads a tpu value that is not among its inputs");
      if (it->second.second == HostInput::Varying) return decline("the graph reads a host value that may vary");
      p.from = it->second.second == HostInput::Rng ? From::Rng : From::Constant;
      if (p.from == From::Constant) p.constant = it->second.first;
    } else if (!same_type(r.param_types[i], inputs_[p.input].type)) {
      return decline("an input is read as another type");
    }
    params_.push_back(std::move(p));
  }
  std::vector<bool> used(r.results.size(), false);
  auto result_of = [&](const void* id) -> int {
    for (size_t j = 0; j < r.results.size(); ++j)
      if (r.results[j] == id) return static_cast<int>(j);
    return -1;
  };

  // Writes into inputs: only those AOTAutograd says it mutates, each a result.
  for (size_t k = 0; k < inputs_.size(); ++k) {
    if (!inputs_[k].tensor) continue;
    c10::intrusive_ptr<c10::StorageImpl> st = inputs_[k].storage.lock();
    bool mutated = std::find(mutated_.begin(), mutated_.end(), static_cast<int>(k)) != mutated_.end();
    if (!st) {
      if (mutated) return decline("a mutated input died during the call");
      continue;
    }
    const auto* sd = static_cast<const StorageData*>(st->data_ptr().get_context());
    const void* now = sd->value ? identity(sd->value) : nullptr;
    if (now == inputs_[k].entry) continue;
    int j = result_of(now);
    // Besides AOTAutograd's writes, a storage never written gets the zeros it reads.
    if ((!mutated && inputs_[k].entry) || j < 0) return decline("an input's storage changed unexpectedly");
    if (inputs_[k].shares < 0) {
      writes_.push_back({static_cast<int>(k), j});
      used[j] = true;
    }
  }

  // Outputs: new storages holding results, or views of inputs.
  std::vector<const c10::StorageImpl*> out_storages;
  for (size_t p = 0; p < outs.size(); ++p) {
    Output o;
    at::Tensor t;
    py::handle h = outs[p];
    out_storages.push_back(nullptr);
    if (THPVariable_Check(h.ptr())) {
      if (!plain_tpu_tensor(h, &t)) return decline("an output is not a plain tpu tensor");
      o.spec = TensorSpec::of(t);
      const c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
      out_storages.back() = st;
      for (size_t k = 0; k < inputs_.size() && o.kind == OutKind::None; ++k)
        if (inputs_[k].tensor && inputs_[k].storage._unsafe_get_target() == st) {
          o.kind = OutKind::InputStorage;
          o.index = inputs_[k].shares >= 0 ? inputs_[k].shares : static_cast<int>(k);
        }
      for (size_t q = 0; q < p && o.kind == OutKind::None; ++q)
        if (out_storages[q] == st) {
          o = outputs_[q];
          o.spec = TensorSpec::of(t);
        }
      if (o.kind == OutKind::None) {
        const void* v = identity(storage_of(t).value);
        int j = result_of(v);
        o.group = static_cast<int>(p);
        if (j >= 0) {
          o.kind = OutKind::Result;
          o.index = j;
          used[j] = true;
        } else {
          for (size_t k = 0; k < inputs_.size() && o.kind == OutKind::None; ++k)
            if (v && inputs_[k].tensor && inputs_[k].entry == v) {
              o.kind = OutKind::InputValue;
              o.index = static_cast<int>(k);
            }
          if (o.kind == OutKind::None && !v) o.kind = OutKind::Unwritten;  // reads zeros
          if (o.kind == OutKind::None) {
            const Operand& ov = storage_of(t).value;
            return decline("output " + std::to_string(p) + " holds a value the program did not produce (" +
                           (ov.slot ? "a slot" : ov.buffer ? "a buffer" : "nothing") + ")");
          }
        }
      }
    } else if (!(h.is_none() || py::isinstance<py::int_>(h) || py::isinstance<py::float_>(h))) {
      return decline("an output is neither a tensor nor a number");
    }
    outputs_.push_back(std::move(o));
  }
  for (size_t j = 0; j < r.results.size(); ++j) {
    auto it = checks_.find(r.results[j]);
    if (it != checks_.end()) {
      result_checks_.push_back({static_cast<int>(j), it->second});
      used[j] = true;
    }
    if (!used[j]) return decline("a result outlives the call outside its outputs");
  }
  host_inputs_.clear();
  for (auto& [ok, message] : checks_) recorded_checks_.push_back(ok);
  checks_.clear();
  graph_ = r.graph;
  device_ = r.device;
  reports_.clear();
}

py::object CapturedGraph::replay(py::list args, int how_) {
  if (!graph_ || args.size() != inputs_.size()) return miss("count", -1);
  if (torch_matmul_precision() != matmul_precision_) {
    miss_ = "the float32 matmul precision";
    return py::none();
  }
  std::vector<at::Tensor> ins(inputs_.size());
  for (size_t k = 0; k < inputs_.size(); ++k) {
    const Input& in = inputs_[k];
    py::handle h = args[k];
    if (!in.tensor) {
      if (THPVariable_Check(h.ptr()) || !in.value.equal(h)) return miss("number", k);
      continue;
    }
    if (!plain_tpu_tensor(h, &ins[k]) || !in.spec.matches(ins[k])) return miss("layout", k);
    const StorageData& sd = storage_of(ins[k]);
    if (!sd.unreadable.empty() || static_cast<bool>(sd.value) != (in.entry != nullptr)) return miss("written", k);
    if (sd.value && !same_type(sd.value.type(), in.type)) return miss("storage type", k);
    int shares = -1;  // the same storages shared, no others
    for (size_t e = 0; e < k && shares < 0; ++e)
      if (inputs_[e].tensor && ins[e].storage().unsafeGetStorageImpl() == ins[k].storage().unsafeGetStorageImpl())
        shares = static_cast<int>(e);
    if (shares != in.shares) return miss("storage sharing", k);
  }
  const int device = device_;
  std::vector<Operand> params;
  for (const Param& p : params_) {
    if (p.from == From::Input) params.push_back(storage_of(ins[p.input]).value);
    else if (p.from == From::Constant) params.push_back(p.constant);
    else params.push_back(rng_state_buffer(std::nullopt, device));
  }
  std::vector<c10::Storage> kept(inputs_.size());  // storages written or viewed by outputs
  std::vector<Operand> values(inputs_.size());     // input values outputs hold
  for (auto& [k, j] : writes_) kept[k] = ins[k].storage();
  for (const Output& o : outputs_) {
    if (o.kind == OutKind::InputStorage) kept[o.index] = ins[o.index].storage();
    if (o.kind == OutKind::InputValue) values[o.index] = storage_of(ins[o.index]).value;
  }
  args.attr("clear")();  // inputs the caller no longer holds die now, as in the graph
  ins.clear();
  FillingUnwritten filling;  // written storages no op wrote yet: the replay makes their first buffers
  for (auto& [k, j] : writes_) filling.add(*static_cast<StorageData*>(kept[k].data_ptr().get_context()));

  auto bind = [&](const std::vector<SlotPtr>& res) {
    for (auto& [k, j] : writes_) {
      auto* sd = static_cast<StorageData*>(kept[k].data_ptr().get_context());
      note_replacement(res[j], sd->value);
      set_value(*sd, res[j]);
    }
  };
  How how = static_cast<How>(how_);
  std::vector<SlotPtr> results;
  {
    auto lock = graph_lock();  // nothing flushes between the check and the record
    if (how == How::Join && pending_ops() == 0) how = How::Launch;
    if (how == How::Launch) {
      results = relaunch(graph_, std::move(params), bind);
    } else {
      if (!program_) program_ = graph_program(graph_);
      TORCH_INTERNAL_ASSERT(deferring(), "a deferred compiled graph outside a deferring mode");
      for (Operand& o : run(program_, params, device, /*eager=*/false)) results.push_back(std::move(o.slot));
      bind(results);
    }
  }
  if (how == How::Join) flush("compiled step");

  py::list outs;
  std::vector<c10::Storage> made(outputs_.size());
  for (size_t p = 0; p < outputs_.size(); ++p) {
    const Output& o = outputs_[p];
    switch (o.kind) {
      case OutKind::None:
        outs.append(py::none());
        continue;
      case OutKind::InputStorage:
        outs.append(tensor_on(kept[o.index], o.spec));
        continue;
      case OutKind::Result:
      case OutKind::InputValue:
      case OutKind::Unwritten:
        if (static_cast<size_t>(o.group) == p)
          made[p] = storage_holding(o.kind == OutKind::Result       ? Operand(results[o.index])
                                    : o.kind == OutKind::InputValue ? values[o.index]
                                                                    : Operand(),
                                    o.spec.nbytes, device);
        outs.append(tensor_on(made[o.group], o.spec));
        continue;
    }
  }
  if (!result_checks_.empty()) {  // a failed check taints the step's new results
    std::vector<c10::Storage> checked;
    for (const c10::Storage& st : made)
      if (st) checked.push_back(st);
    for (auto& [j, message] : result_checks_) add_device_check(results[j], message, checked);
  }
  return outs;
}

void bind_captured_graph(py::module_& m) {
  py::class_<CapturedGraph, std::shared_ptr<CapturedGraph>>(m, "CapturedGraph")
      .def_property_readonly("ready", &CapturedGraph::ready)
      .def_property_readonly("why", &CapturedGraph::why)
      .def_property_readonly("miss", &CapturedGraph::miss_reason)
      .def_property_readonly("recorded_apart", &CapturedGraph::recorded_apart)
      .def("replay", &CapturedGraph::replay, py::arg("args"), py::arg("how") = 0);
  // Starts watching a graph's recorded call; `mutated`: the inputs it writes.
  // `apart`: a training step's graph, recorded apart and replayed into its pending graph.
  m.def("_capture_begin", [](const py::list& args, const std::vector<int>& mutated, bool apart) {
    auto c = std::make_shared<CapturedGraph>(args, mutated, apart);
    CapturedGraph* raw = c.get();
    set_flush_observer([raw](const FlushReport& r) { raw->flushed(r); });
    g_active.store(raw);
    return c;
  });
  // Flushes the recorded call and explains it (ready) or says why not (why).
  m.def("_capture_end", [](CapturedGraph& c, const py::list& outs) { c.finish(outs); });
  // Marks a 0-D tensor made from a Python number during the active capture's recording
  // as a constant (compile.py's _PythonNumberTensors).
  m.def("_capture_note_constant", [](const at::Tensor& t) {
    auto lock = graph_lock();  // other threads' ops may note host inputs meanwhile
    if (CapturedGraph* c = g_active.load()) c->constant_tensor(t);
  });
  // Enters (true) or leaves an ATen op call whose host values are only Python numbers
  // (compile.py's _PythonNumberTensors); returns the previous state.
  m.def("_capture_number_scope", [](bool on) {
    bool prev = t_number_scope;
    t_number_scope = on;
    return prev;
  });
  // A graph module's tensor constant's buffer, taken when the graph is made (compile.py's
  // _tensor_constants): a later call's recording reads that buffer, while the tensor's
  // storage may by then name a pending copy of it.
  m.def("_constant_buffer", [](const at::Tensor& t) -> py::object {
    if (!t.is_privateuseone() || !t.has_storage()) return py::none();
    runtime::BufferPtr b;
    {
      py::gil_scoped_release nogil;
      b = guarded([&] {
        StorageData& sd = storage_of(t);
        runtime::BufferPtr buf = resolve(sd.value);
        // A copy computed by a program (AOTAutograd's copy of the constant for a backward
        // graph, made while the forward recorded) keeps naming its slot, which a recording
        // reads under the slot's identity, not the buffer's: the capture could not name it
        // and the backward recorded anew at every call. The storage holds the buffer now.
        if (sd.value.slot) set_value(sd, Operand(buf));
        return buf;
      });
    }
    return py::capsule(new runtime::BufferPtr(std::move(b)),
                       [](void* p) { delete static_cast<runtime::BufferPtr*>(p); });
  });
  m.def("_capture_note_constant_buffer", [](const py::capsule& c) {
    auto lock = graph_lock();
    if (CapturedGraph* cg = g_active.load())
      cg->host_input(*static_cast<runtime::BufferPtr*>(c.get_pointer()), HostInput::Constant);
  });
  // Abandons a capture (the recorded call raised).
  m.def("_capture_abort", [](CapturedGraph& c) { c.abort(); });
}

}  // namespace tpu::backend
