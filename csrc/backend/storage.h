// The promise behind each `tpu` storage: a device buffer, a pending value of the
// deferred graph, or nothing yet (memory from `empty` that no op has written). The
// at::Storage's DataPtr carries it.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <ATen/Tensor.h>

#include "backend/deferred.h"
#include "ir/views.h"
#include "runtime/client.h"

namespace tpu::backend {

// A copy_ into part of a storage not run yet (see StorageData::pending).
struct PendingWrite {
  ir::Geometry view;  // where, in elements of `dtype`
  DType dtype;        // the destination view's dtype
  Operand value;      // broadcastable to the view, any dtype: converted
  // Set when `value` is a source storage's value and the write reads this view of it
  // (in elements of `source_dtype`): copy_ from a view, read in the same program.
  bool from_view = false;
  ir::Geometry source_view;
  DType source_dtype = DType::F32;
  // Set when source_view's offset is a runtime operand (offset_is_operand): its i64 buffer.
  Operand source_offset;
};

struct ViewCopies;

struct StorageData {
  int device = 0;
  size_t nbytes = 0;
  Operand value;  // empty: not written yet (reads see zeros)
  // Why the storage holds nothing to read, raised by every read and write: it was
  // donated (consumed by a jax_op's donate_argnums), or the op that computed it failed
  // its device-side check (its values are garbage, as CUDA's after a device assert).
  std::string unreadable;
  // Writes into views of this storage that follow `value`, in order, when not deferring:
  // run as one program by the next storage_of() (every read and write of the storage
  // asks for it), so N copies into one bucket cost one program, not N rewrites of it.
  // `pending_type` is the storage's type they write through.
  std::vector<PendingWrite> pending;
  ir::Type pending_type;
  // Set when this whole storage is to become a copy of a view of another storage's
  // value (copy_ from a view) not run yet: copies from one source run together as one
  // program when any of their destinations is next used (DDP's copies of a bucket back
  // into the gradients: one program per bucket, not one per gradient).
  std::shared_ptr<ViewCopies> copy_of;
  // The bytes of the computed buffer `host_copy_of`, brought to the host whole by reads
  // of parts of the storage (copy_ to the CPU, item()): printing a tensor, or
  // `[v.item() for v in t]`, reads every element, and each then costs a host copy, not a
  // program and a transfer. Valid while the storage's value is that buffer (buffers are
  // immutable; a write replaces the value; a collective writing into the buffer's
  // memory clears it).
  std::weak_ptr<runtime::Buffer> host_copy_of;
  std::shared_ptr<const std::vector<uint8_t>> host_copy;  // shared with the views read from it
  std::weak_ptr<runtime::Buffer> part_read_of;  // the value a first read took part of
  // Marks a live record: a storage's data pointer is its record, and PyTorch may make a
  // tensor over that pointer (at::from_blob, as pickling a storage does to copy it).
  static constexpr uint64_t kTag = 0x7470752d73746f72;  // "tpu-stor"
  uint64_t tag = kTag;
  // Bytes counted as allocated while the storage holds no value (set_value keeps it).
  int64_t unwritten_bytes = 0;
  // A module's parameter or buffer (torch_tpu/_module_state.py): state a step reads
  // and updates every step, so never read as zeros baked into a program (see
  // start_state_from_zeros in lowered_kernel.cpp).
  bool module_state = false;
  // Host bytes torch.load restored into this whole storage, not uploaded yet (the CPU
  // tensor read from the checkpoint, which nothing else writes): uploaded in the dtype
  // and shape of the tensor rebuilt over them, one host-to-device copy and no program
  // (serialization.cpp). Any other use of the storage uploads them first, as bytes.
  at::Tensor loaded_bytes;
  // The dtype of a tensor set onto the storage that does not span it (upload_loaded_bytes).
  std::optional<c10::ScalarType> loaded_dtype;
  ~StorageData();
};

// The allocator registered for PrivateUse1: it hands out promises, never host memory.
c10::Allocator* tpu_allocator();

// The runtime's buffer counts for `device` (-1: the current one), after pending deferred
// values have run (memory figures count buffers).
runtime::DeviceStats& settled_memory_stats(int device);

// While one lives, this thread's allocations are storages for values already computed
// (their buffers are counted): neither checked against the limit nor counted again.
class AllocatingForValue {
 public:
  AllocatingForValue();
  ~AllocatingForValue();
  AllocatingForValue(const AllocatingForValue&) = delete;
  AllocatingForValue& operator=(const AllocatingForValue&) = delete;
};
// Sets the storage's value (empty: unwritten again, which reads as zeros). While it holds
// none its bytes still count as allocated: memory figures and the limit see them.
void set_value(StorageData& s, Operand value);
// Storages a launch or upload is about to give their first value: while one lives, their
// bytes leave the unwritten count, since the launch counts its outputs (the limit check
// and the peak see one allocation, not two, as CUDA's write into an `empty` tensor). A
// storage still unwritten when the scope ends (the launch failed) counts again.
class FillingUnwritten {
 public:
  FillingUnwritten() = default;
  explicit FillingUnwritten(StorageData& s) { add(s); }
  ~FillingUnwritten();
  void add(StorageData& s);
  FillingUnwritten(const FillingUnwritten&) = delete;
  FillingUnwritten& operator=(const FillingUnwritten&) = delete;

 private:
  std::vector<StorageData*> storages_;
};
// The tensor's storage, its pending writes applied first.
StorageData& storage_of(const at::Tensor& t);
// Its value as a buffer where its launch has run (Strict's queued launches, a flushed
// graph), else as it is (the stored operand keeps its identity).
Operand ready_value(const StorageData& s);
// Where none of `ts`' storages waits in the pending graph (DeferAndFuse), reading them
// launches its programs at once (LaunchNow): a read of computed values does not cut the
// graph being recorded. Elsewhere it changes nothing.
class ReadOfComputed {
 public:
  explicit ReadOfComputed(std::initializer_list<std::reference_wrapper<const at::Tensor>> ts);

 private:
  std::optional<LaunchNow> now_;
};
// The same without applying them (for code that queues or drops writes).
StorageData& storage_data(const at::Tensor& t);
// Forgets `s`'s host copy (glue_ops.cpp): for writes into its buffer's memory in place.
void drop_host_copy(StorageData& s);
// Runs `s`'s pending writes (one program) into its value, and its pending copy.
void apply_pending(StorageData& s);
// Queues `dst` (covering its whole storage, same device) to become `src`'s values, or
// returns false where that is not how to copy them (then the caller copies now).
bool copy_view_later(const at::Tensor& dst, const at::Tensor& src);
// Writes `value` (broadcastable to dst, any dtype) into dst's view of its storage; into
// part of a storage, outside DeferAndFuse, the write is queued (StorageData::pending).
// (glue_ops.cpp, beside copy_.)
void write_value(const at::Tensor& dst, Operand value);
// Whether dst's view covers its storage (as the storage will be once its writes ran).
bool covers_storage(const at::Tensor& dst);
// Raises when the storage holds nothing to read (StorageData::unreadable).
void check_readable(const StorageData& s);
// Drops the storage's value; its reads and writes raise `why` from now on.
void make_unreadable(StorageData& s, std::string why);
// The record of a tpu storage (nullptr for another device's).
StorageData* storage_record(const c10::StorageImpl& s);
// The tensor's view of its storage, in elements of its dtype.
ir::Geometry geometry_of(const at::Tensor& t);
// The value's type, or (when not written yet) a flat type of the tensor's dtype.
ir::Type storage_type(const at::Tensor& t);
// The storage's value, zeros if nothing was written yet (pending while deferring).
Operand storage_value(const at::Tensor& t);
// Gives the never-written storages among `ts` (those that read as zeros) their zeros, all
// from one program per list of types (storage_value would run one per tensor).
void start_from_zeros(c10::ArrayRef<at::Tensor> ts);
// torch.load (serialization.cpp). While a load runs on this thread, a copy of host
// bytes into the whole of a fresh storage (the uint8 copy torch.load restores each
// storage with) keeps them on the host as `loaded_bytes`; true when it did.
bool defer_loaded_bytes(const at::Tensor& dst, const at::Tensor& src);
// Uploads `s.loaded_bytes` as its value: in the dtype and shape of `as` (a tensor set
// onto the storage) where it spans the storage; a tensor that does not span it gives
// the dtype of a flat value (uploaded once the load ends or the storage is used);
// without one, in the dtype such a tensor gave, else as bytes.
void upload_loaded_bytes(StorageData& s, const at::Tensor* as = nullptr);
// The storage's buffer: runs the pending graph if the value is still pending.
runtime::BufferPtr materialized(const at::Tensor& t);
// A view a program reads, of a value already made (not in the pending graph), that
// starts past the storage's start or is a dense block of it: its offset is a runtime
// operand, not part of the program, so a loop over row blocks (x[i * b:(i + 1) * b]) or
// schedule entries (alphas[t].float(), t = 0 included) reuses one program (one fused
// graph) instead of compiling one per offset. (Strided views at offset 0, a weight's
// transpose, stay static: XLA reads them in place; a view of a value computed in the
// pending graph stays static, a slice XLA fuses into its consumers.) A view a program
// writes (`written`) takes the operand whatever its storage holds: the rows of a
// preallocated output or a cache filled step by step (out[t] = h, cache[l, 0, :, pos] =
// k, several such writes into one storage per step) reuse one program, the write an
// update in place at any offset. Lowered ops and the copies here (dense_value, queued
// copies from and into a view) all ask this.
bool offset_is_operand(const at::Tensor& t, bool written = false);
// Its geometric part, for a view `g` of a storage of `storage_numel` elements.
bool offset_is_operand(const ir::Geometry& g, int64_t storage_numel);
// That operand: the view's storage offset, an i64 scalar on its device (lowered_kernel.cpp).
runtime::BufferPtr view_offset_operand(const at::Tensor& t);
runtime::BufferPtr view_offset_operand(int64_t offset, int device);
// dtype, view and storage layout: what a program reading the tensor depends on.
std::string view_key(const at::Tensor& t);
// A dense value holding exactly the tensor's values (its storage's value when that fits).
Operand dense_value(const at::Tensor& t);
runtime::BufferPtr dense_buffer(const at::Tensor& t);  // the same, materialized
// A new contiguous tensor on `device` whose storage holds `value`.
at::Tensor wrap_value(Operand value, c10::ScalarType dtype, at::IntArrayRef sizes, int device);
// The same with `strides` (non-overlapping and dense): `value` holds the storage's
// contents, the logical values transposed into the order of decreasing strides.
at::Tensor wrap_value(Operand value, c10::ScalarType dtype, at::IntArrayRef sizes, at::IntArrayRef strides,
                      int device);
// That order (outermost first) for a non-overlapping and dense layout, or empty when it
// is the identity (a contiguous layout).
std::vector<int64_t> physical_order(at::IntArrayRef sizes, at::IntArrayRef strides);
int device_index(const at::Tensor& t);
// For kernels that run their own programs (not through a lowering's plan, which checks):
// every defined tensor of `ts` is on one tpu device, else PyTorch's device error.
void check_same_device(std::initializer_list<std::reference_wrapper<const at::Tensor>> ts);
// ir::reinterpret that also crosses between complex and real dtypes (StableHLO's
// bitcast_convert refuses complex): a complex element is its (re, im) pair of parts.
// Bytes that do not fill a last element of `to` are padded with zeros (a float storage
// of odd length seen as complex): no valid view addresses that element.
ir::Value reinterpret_bytes(ir::Builder& b, const ir::Value& storage, DType to);
// `v`'s bytes as a storage of type `st` again (dropping such padding).
ir::Value as_storage(ir::Builder& b, const ir::Value& v, const ir::Type& st);
// The storage `cur` (of type `st`) after writing `v` (of the view's dtype) into the view
// `g` of its bytes seen as `v`'s dtype. A bool view of other bytes writes bytes (bools
// read from them would turn every byte the write leaves alone into 0 or 1). `offset`:
// the view's offset as an i64 operand (offset_is_operand), else g.offset.
ir::Value write_storage_view(ir::Builder& b, const ir::Value& cur, const ir::Type& st, const ir::Geometry& g,
                             const ir::Value& v, const ir::Value* offset = nullptr);
// The complex conjugate of a complex value.
ir::Value conj_value(ir::Builder& b, const ir::Value& v);
// A tensor's lazy conjugate / negative bits applied to its stored values `v` (both are
// self-inverse: the same turns a logical value back into the one to store).
ir::Value apply_math_bits(ir::Builder& b, const ir::Value& v, const at::Tensor& t);
// Key suffix for those bits (programs differ by them).
const char* math_bits_key(const at::Tensor& t);

}  // namespace tpu::backend
