// The library ops' C++ kernels: `torch.ops.opmux.<name>` without a round trip into Python.
//
// Every op is a torch library op (fused_op._register_library) whose kernel is the generated
// Python hot path; the dispatcher's boxing into a Python kernel costs microseconds per call
// (docs/benchmarks/host_overhead*.md). This unit registers one boxed C++ kernel per library op for
// the CPU and CUDA keys that runs the op's serving lane (opmux/lane.h) itself:
//
//   torch.ops.opmux.<name>(...) -> dispatcher -> LaneKernel: the lane the default call bound for
//   (device, dtype) (fused_op._remember -> opmux_bridge_set_lane), called on DLTensor views of the
//   arguments -> its result pushed; or, when there is no bound lane, grad mode is on and an input
//   requires grad, or the lane refuses, the op's Python kernel (its twin library op
//   `opmux::_py_<name>`, same schema): the contract, selection, errors, exactly as before.
//
// What the Python hot path does around a lane is done here the same way: no input may require
// grad (the twin raises the contract's error); written tensors' versions are bumped in grad mode;
// a lane's kernel error keeps its class (ValueError, TypeError, IndexError) and message.
// Compiled against the torch C++ API of the interpreter's torch (not its stable ABI: that cannot
// read requires_grad or bump a version), so it is built per torch build, in the JIT cache
// (opmux/kernels/torch_kernels.py), and never on the hot path.
// tvm-ffi's DLPack (1.x) first: a torch before 2.9 ships an older ATen/dlpack.h under the same
// include guard, which is then never read (nothing here uses torch's DLPack helpers).
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>
#ifdef BRIDGE_PY_ENTRY  // the Python entries (below); built where the interpreter's headers are
#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <structmember.h>  // (after Python.h)
#endif

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace opmux {
namespace torch_bridge {

namespace ffi = tvm::ffi;

constexpr int kMaxArgs = 24;

// The lanes one op's default calls bound, per (device type, dtype): shared by its library ops
// (the functional form and `_out`). `flag`: -1, the lane takes no PDL flag (CPU); else the flag.
struct Bound {
  ffi::Function lane;
  int flag = -1;
};
struct OpLanes {
  std::mutex mu;
  std::unordered_map<int64_t, Bound> bound;  // (device type << 8 | scalar type) -> lane
  static int64_t key(c10::DeviceType d, c10::ScalarType s) {
    return (static_cast<int64_t>(d) << 8) | static_cast<int64_t>(s);
  }
  bool find(c10::DeviceType d, c10::ScalarType s, Bound* out) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = bound.find(key(d, s));
    if (it == bound.end()) return false;
    *out = it->second;
    return true;
  }
};

std::mutex g_mu;
std::atomic<int64_t> g_lane_calls{0};
std::unordered_map<int64_t, std::shared_ptr<OpLanes>>& ops() {
  static std::unordered_map<int64_t, std::shared_ptr<OpLanes>> table;
  return table;
}
std::shared_ptr<OpLanes> op_lanes(int64_t op_id) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& slot = ops()[op_id];
  if (!slot) slot = std::make_shared<OpLanes>();
  return slot;
}

// Tensors a lane allocates (lane::empty -> TVMFFIEnvTensorAlloc) come from here while the bridge
// calls it: at::empty on the requested device, lent to tvm-ffi as DLPack (the at::Tensor owns the
// memory; the DLPack deleter drops that reference). Each is also kept here, so that a result
// crosses back as the very tensor, not a DLPack re-wrap.
struct Lent {
  at::Tensor tensor;
  DLManagedTensorVersioned managed;
};
thread_local std::vector<at::Tensor> t_allocs;

// The dtypes a lane can take, both ways (by hand: torch's DLPack helpers are not in every torch).
// `name`: torch's (fused_op.dtype_name), as set_lane receives it.
struct DtypeMap {
  c10::ScalarType scalar;
  DLDataType dl;
  const char* name;
};
constexpr DtypeMap kDtypes[] = {
    {c10::ScalarType::Float, {kDLFloat, 32, 1}, "float32"},
    {c10::ScalarType::Half, {kDLFloat, 16, 1}, "float16"},
    {c10::ScalarType::BFloat16, {kDLBfloat, 16, 1}, "bfloat16"},
    {c10::ScalarType::Double, {kDLFloat, 64, 1}, "float64"},
    {c10::ScalarType::Int, {kDLInt, 32, 1}, "int32"},
    {c10::ScalarType::Long, {kDLInt, 64, 1}, "int64"},
    {c10::ScalarType::Short, {kDLInt, 16, 1}, "int16"},
    {c10::ScalarType::Char, {kDLInt, 8, 1}, "int8"},
    {c10::ScalarType::Byte, {kDLUInt, 8, 1}, "uint8"},
    {c10::ScalarType::Bool, {kDLBool, 8, 1}, "bool"},
    {c10::ScalarType::Float8_e4m3fn, {kDLFloat8_e4m3fn, 8, 1}, "float8_e4m3fn"},
};
bool to_dl(c10::ScalarType s, DLDataType* out) {
  for (const DtypeMap& m : kDtypes)
    if (m.scalar == s) return *out = m.dl, true;
  return false;
}
bool to_scalar(DLDataType d, c10::ScalarType* out) {
  for (const DtypeMap& m : kDtypes)
    if (m.dl.code == d.code && m.dl.bits == d.bits && m.dl.lanes == d.lanes) return *out = m.scalar, true;
  return false;
}

// A DLTensor view of `t` (its sizes and strides, not copies); false: a dtype no lane takes.
bool fill_dl(const at::Tensor& t, DLTensor* dl) {
  if (!to_dl(t.scalar_type(), &dl->dtype)) return false;
  dl->data = t.data_ptr();
  dl->device = t.is_cuda() ? DLDevice{kDLCUDA, static_cast<int32_t>(t.device().index())} : DLDevice{kDLCPU, 0};
  dl->ndim = static_cast<int32_t>(t.dim());
  dl->shape = const_cast<int64_t*>(t.sizes().data());
  dl->strides = const_cast<int64_t*>(t.strides().data());
  dl->byte_offset = 0;
  return true;
}

// A failure inside the allocator (out of memory, ...): rethrown as itself once the lane is back.
thread_local std::exception_ptr t_alloc_error;

int alloc_tensor(DLTensor* proto, DLManagedTensorVersioned** out, void* error_ctx,
                 void (*set_error)(void* error_ctx, const char* kind, const char* message)) {
  try {
    c10::Device device = proto->device.device_type == kDLCUDA
                             ? c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(proto->device.device_id))
                             : c10::Device(c10::DeviceType::CPU);
    c10::ScalarType dtype;
    TORCH_CHECK(to_scalar(proto->dtype, &dtype), "opmux: a lane asked for a tensor of an unknown dtype");
    auto lent = std::make_unique<Lent>();
    lent->tensor = at::empty(c10::IntArrayRef(proto->shape, proto->ndim), at::TensorOptions().dtype(dtype).device(device));
    DLManagedTensorVersioned& m = lent->managed;
    m.version.major = DLPACK_MAJOR_VERSION;
    m.version.minor = DLPACK_MINOR_VERSION;
    m.flags = 0;
    fill_dl(lent->tensor, &m.dl_tensor);
    m.manager_ctx = lent.get();
    m.deleter = [](DLManagedTensorVersioned* self) { delete static_cast<Lent*>(self->manager_ctx); };
    t_allocs.push_back(lent->tensor);
    *out = &lent.release()->managed;
    return 0;
  } catch (const c10::Error& e) {
    t_alloc_error = std::current_exception();
    set_error(error_ctx, "RuntimeError", e.what_without_backtrace());
    return -1;
  } catch (const std::exception& e) {
    t_alloc_error = std::current_exception();
    set_error(error_ctx, "RuntimeError", e.what());
    return -1;
  }
}

// The allocated tensor whose data a lane's result holds (every result a lane allocates is).
// (Matched by address, dtype and shape, each taken once: empty tensors share the null address.)
at::Tensor allocated(const ffi::Any& v, std::vector<at::Tensor>* allocs, const std::string& name) {
  auto t = v.try_cast<ffi::Tensor>();
  TORCH_CHECK(t.has_value(), "opmux: ", name, ": its lane returned ", v.GetTypeKey(), ", not a tensor");
  for (at::Tensor& a : *allocs) {
    if (!a.defined() || a.data_ptr() != t->data_ptr() || a.dim() != t->ndim()) continue;
    DLDataType d, e = t->dtype();
    if (!to_dl(a.scalar_type(), &d) || d.code != e.code || d.bits != e.bits || d.lanes != e.lanes) continue;
    bool same = true;
    for (int i = 0; i < a.dim(); ++i) same = same && a.size(i) == t->size(i);
    if (!same) continue;
    at::Tensor out = std::move(a);
    a = at::Tensor();
    return out;
  }
  TORCH_CHECK(false, "opmux: ", name, ": its lane returned a tensor it did not allocate here");
}

// One lane call in the environment tvm-ffi's Python call would set: torch's current stream of
// `cuda_key`'s device (null: a CPU call) and, for the tensors the lane allocates, at::empty
// (alloc_tensor). Whatever it raises is kept in `call` (the caller raises it its own way).
struct Call {
  ffi::Any result;
  std::string kind, message;           // a kernel error: its class name and message
  std::exception_ptr alloc_error;      // torch's own error from an allocation
  std::vector<at::Tensor> allocs;      // what the lane allocated (its results among them)
};

void run_lane(const ffi::Function& lane, const ffi::AnyView* packed, int na, const at::Tensor* cuda_key, Call* call) {
  TVMFFIStreamHandle old_stream = nullptr;
  const int32_t dev_id = cuda_key != nullptr ? cuda_key->device().index() : 0;
  if (cuda_key != nullptr) {
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    TVMFFIEnvSetStream(kDLCUDA, dev_id, impl->getStream(cuda_key->device()).native_handle(), &old_stream);
  }
  DLPackManagedTensorAllocator old_alloc = nullptr;
  TVMFFIEnvSetDLPackManagedTensorAllocator(alloc_tensor, 0, &old_alloc);
  try {
    lane.CallPacked(packed, na, &call->result);
  } catch (const ffi::Error& e) {
    call->kind = e.kind();
    call->message = e.message();
  } catch (const std::exception& e) {  // (the environment is restored below either way)
    call->kind = "RuntimeError";
    call->message = e.what();
  }
  TVMFFIEnvSetDLPackManagedTensorAllocator(old_alloc, 0, nullptr);
  if (cuda_key != nullptr) TVMFFIEnvSetStream(kDLCUDA, dev_id, old_stream, nullptr);
  call->allocs.swap(t_allocs);
  t_allocs.clear();
  call->alloc_error = t_alloc_error;
  t_alloc_error = nullptr;
}

// A tensor a lane can take as a DLTensor view (torch's strided CPU / CUDA tensors).
bool viewable(const at::Tensor& t) {
  return t.layout() == c10::kStrided && t.has_storage() && !t.is_quantized() && !t.is_nested() &&
         (t.is_cpu() || t.is_cuda());
}

// The library op's kernel. `lane_map[i]`: the schema index of the lane's i-th argument (the op's
// public parameters in order), or -1 (None: a parameter the library op lacks, `out` of the
// functional form).
class LaneKernel final : public c10::OperatorKernel {
 public:
  LaneKernel(std::shared_ptr<OpLanes> lanes, std::vector<int> lane_map, int key_index, std::vector<int> results,
             std::vector<int> written, std::vector<int> tensors, c10::OperatorHandle twin)
      : lanes_(std::move(lanes)),
        lane_map_(std::move(lane_map)),
        key_index_(key_index),
        results_(std::move(results)),
        written_(std::move(written)),
        tensors_(std::move(tensors)),
        twin_(std::move(twin)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    if (!try_lane(op, stack)) twin_.callBoxed(stack);
  }

 private:
  bool try_lane(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    auto args = torch::jit::last(*stack, n);
    const c10::IValue& key = args[key_index_];
    if (!key.isTensor()) return false;
    const at::Tensor& x = key.toTensor();
    Bound b;
    if (!lanes_->find(x.device().type(), x.scalar_type(), &b)) return false;
    const bool grad = c10::GradMode::is_enabled();
    if (grad) {
      for (int i : tensors_) {
        const c10::IValue& v = args[i];
        if (v.isTensor() && v.toTensor().requires_grad()) return false;  // the contract raises
      }
    }
    const int nl = static_cast<int>(lane_map_.size());
    if (nl + 1 > kMaxArgs) return false;
    std::array<DLTensor, kMaxArgs> dl;
    std::array<ffi::AnyView, kMaxArgs> packed;
    for (int i = 0; i < nl; ++i) {
      const int s = lane_map_[i];
      if (s < 0) {
        packed[i] = ffi::AnyView(nullptr);
        continue;
      }
      const c10::IValue& v = args[s];
      if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        if (!viewable(t) || !fill_dl(t, &dl[i])) return false;  // (a dtype no lane takes: the contract names it)
        packed[i] = ffi::AnyView(&dl[i]);
      } else if (v.isNone()) {
        packed[i] = ffi::AnyView(nullptr);
      } else if (v.isBool()) {
        packed[i] = ffi::AnyView(v.toBool());
      } else if (v.isInt()) {
        packed[i] = ffi::AnyView(v.toInt());
      } else if (v.isDouble()) {
        packed[i] = ffi::AnyView(v.toDouble());
      } else {
        return false;  // (a list, a string: no lane takes one)
      }
    }
    int na = nl;
    if (b.flag >= 0) packed[na++] = ffi::AnyView(static_cast<bool>(b.flag));

    Call call;
    run_lane(b.lane, packed.data(), na, x.is_cuda() ? &x : nullptr, &call);
    if (call.alloc_error) std::rethrow_exception(call.alloc_error);  // torch's own (OutOfMemoryError, ...)
    if (!call.kind.empty()) {  // raised inside the kernel after the lane accepted: the Python path's error
      TORCH_CHECK_VALUE(call.kind != "ValueError", call.message);
      TORCH_CHECK_TYPE(call.kind != "TypeError", call.message);
      TORCH_CHECK_INDEX(call.kind != "IndexError", call.message);
      TORCH_CHECK_NOT_IMPLEMENTED(call.kind != "NotImplementedError", call.message);
      TORCH_CHECK(false, call.message);
    }
    ffi::Any& result = call.result;
    std::vector<at::Tensor>& allocs = call.allocs;
    const std::string& name = op.schema().name();
    if (result.type_index() == ffi::TypeIndex::kTVMFFINone) return false;  // refused: nothing done
    g_lane_calls.fetch_add(1, std::memory_order_relaxed);
    if (grad) {  // as torch._C._increment_version: inference tensors have no version to bump
      for (int i : written_) {
        const c10::IValue& v = args[i];
        if (v.isTensor() && !v.toTensor().is_inference()) v.toTensor().unsafeGetTensorImpl()->bump_version();
      }
    }
    // the op's results: none; the one tensor the lane allocated (results_ = {-1}); or several, each
    // the caller's buffer (results_[i]: its schema index) or the lane's (ran_all: an array)
    std::vector<c10::IValue> outs;
    if (results_.size() == 1 && results_[0] < 0) {
      outs.emplace_back(allocated(result, &allocs, name));
    } else if (!results_.empty()) {
      auto many = result.try_cast<ffi::Array<ffi::Any>>();
      for (size_t i = 0; i < results_.size(); ++i) {
        const int s = results_[i];
        const bool given = s >= 0 && args[s].isTensor();
        if (given) {
          outs.emplace_back(args[s]);
        } else {
          TORCH_CHECK(many.has_value() && many->size() == results_.size(), "opmux: ", name,
                      ": its lane ran without returning the results it allocated");
          outs.emplace_back(allocated((*many)[i], &allocs, name));
        }
      }
    }
    torch::jit::drop(*stack, n);
    for (c10::IValue& v : outs) stack->emplace_back(std::move(v));
    return true;
  }

  std::shared_ptr<OpLanes> lanes_;
  std::vector<int> lane_map_;
  int key_index_;
  std::vector<int> results_;
  std::vector<int> written_, tensors_;
  c10::OperatorHandle twin_;
};

std::vector<std::unique_ptr<torch::Library>>& libraries() {
  static std::vector<std::unique_ptr<torch::Library>> libs;
  return libs;
}

std::vector<int> ints(const ffi::Array<int64_t>& a) {
  std::vector<int> v;
  for (int64_t x : a) v.push_back(static_cast<int>(x));
  return v;
}

// Registers the C++ kernel of library op `opmux::<name>` for the dispatch keys of `devices` (DLPack
// device types: CPU, CUDA). `results`: what it returns, as above (empty: nothing).
void define(const ffi::String& name, int64_t op_id, const ffi::Array<int64_t>& lane_map, int64_t key_index,
            const ffi::Array<int64_t>& results, const ffi::Array<int64_t>& written,
            const ffi::Array<int64_t>& tensors, const ffi::String& twin, const ffi::Array<int64_t>& devices) {
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(("opmux::" + std::string(twin)).c_str(), "");
  std::shared_ptr<OpLanes> lanes = op_lanes(op_id);
  std::lock_guard<std::mutex> lock(g_mu);
  for (int64_t device : devices) {
    const c10::DispatchKey k = device == kDLCUDA ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "opmux", k, __FILE__, __LINE__);
    lib->impl(std::string(name).c_str(),
              torch::CppFunction::makeFromBoxedFunctor(std::make_unique<LaneKernel>(
                  lanes, ints(lane_map), static_cast<int>(key_index), ints(results), ints(written), ints(tensors),
                  handle)));
    libraries().push_back(std::move(lib));
  }
  if (devices.empty()) return;
  // the kernel itself refuses grad inputs (the twin raises the contract's error), so autograd's
  // not-implemented fallback, a boxed pass over every argument per call, is skipped
  auto autograd = std::make_unique<torch::Library>(torch::Library::IMPL, "opmux", c10::DispatchKey::Autograd,
                                                   __FILE__, __LINE__);
  autograd->impl(std::string(name).c_str(), torch::CppFunction::makeFallthrough());
  libraries().push_back(std::move(autograd));
}

// The lane a default call of op `op_id` bound for (device, dtype) (fused_op._remember).
void set_lane(int64_t op_id, int64_t device_type, const ffi::String& dtype, ffi::Function lane, int64_t flag) {
  const DtypeMap* m = nullptr;
  for (const DtypeMap& e : kDtypes)
    if (std::string(dtype) == e.name) m = &e;
  if (m == nullptr) return;  // (a dtype no lane takes: the Python kernel serves it)
  const c10::DeviceType d = device_type == kDLCUDA ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  std::shared_ptr<OpLanes> lanes = op_lanes(op_id);
  std::lock_guard<std::mutex> lock(lanes->mu);
  lanes->bound[OpLanes::key(d, m->scalar)] = Bound{std::move(lane), static_cast<int>(flag)};
}

// Forget every lane op `op_id` bound (its cached choices were dropped: fused_op.invalidate).
void clear(int64_t op_id) {
  std::shared_ptr<OpLanes> lanes = op_lanes(op_id);
  std::lock_guard<std::mutex> lock(lanes->mu);
  lanes->bound.clear();
}

int64_t lane_calls() { return g_lane_calls.load(); }


#ifdef BRIDGE_PY_ENTRY
// -- The default call's entry into its lane (fused_op: FusedOp.entry_form) --
// Through tvm-ffi, the outputs of an op returning several tensors cost about 1 us each on the host
// (allocated in Python, or returned by the lane and converted back), more than the lane itself at
// T=1, and each tensor argument is converted on the way in. This entry takes the public function's
// arguments as they are (torch tensors, int, float, bool, None), lets the lane allocate with
// at::empty and wraps its results as torch tensors (a lane that ran on the caller's tensors:
// True): one Python call, no conversion layer. The Python side keeps the contract (grad refusal,
// which form reaches a lane); this returns None where the lane refuses, exactly as the tvm-ffi
// call would.
constexpr const char* kCapsule = "opmux.torch_bridge.lane";

// An exact Python int's value; false (no error left set): outside int64.
bool int64_value(PyObject* o, int64_t* out) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  *out = static_cast<int64_t>(v);
  return true;
}
std::atomic<int64_t> g_py_lane_calls{0};

struct PyLane {
  ffi::Function lane;
  std::string name;
};

PyObject* raise_kind(const std::string& kind, const std::string& message) {
  PyObject* cls = kind == "ValueError"            ? PyExc_ValueError
                  : kind == "TypeError"           ? PyExc_TypeError
                  : kind == "IndexError"          ? PyExc_IndexError
                  : kind == "NotImplementedError" ? PyExc_NotImplementedError
                  : kind == "MemoryError"         ? PyExc_MemoryError
                                                  : PyExc_RuntimeError;
  PyErr_SetString(cls, message.c_str());
  return nullptr;
}

PyObject* py_lane_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  auto* pl = static_cast<PyLane*>(PyCapsule_GetPointer(self, kCapsule));
  if (pl == nullptr) return nullptr;
  if (nargs > kMaxArgs) Py_RETURN_NONE;
  std::array<DLTensor, kMaxArgs> dl;
  std::array<ffi::AnyView, kMaxArgs> packed;
  const at::Tensor* cuda_key = nullptr;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* o = args[i];
    if (o == Py_None) {
      packed[i] = ffi::AnyView(nullptr);
    } else if (PyBool_Check(o)) {
      packed[i] = ffi::AnyView(o == Py_True);
    } else if (PyLong_CheckExact(o)) {
      int64_t v = 0;
      if (!int64_value(o, &v)) Py_RETURN_NONE;  // (out of int64: the contract names it)
      packed[i] = ffi::AnyView(v);
    } else if (PyFloat_CheckExact(o)) {
      packed[i] = ffi::AnyView(PyFloat_AS_DOUBLE(o));
    } else if (THPVariable_Check(o)) {
      const at::Tensor& t = THPVariable_Unpack(o);
      if (!viewable(t) || !fill_dl(t, &dl[i])) Py_RETURN_NONE;
      if (cuda_key == nullptr && t.is_cuda()) cuda_key = &t;
      packed[i] = ffi::AnyView(&dl[i]);
    } else {
      Py_RETURN_NONE;  // (anything else: the contract speaks)
    }
  }
  Call call;
  Py_BEGIN_ALLOW_THREADS;  // as tvm-ffi's call: a CPU kernel at prefill sizes runs for a while
  run_lane(pl->lane, packed.data(), static_cast<int>(nargs), cuda_key, &call);
  Py_END_ALLOW_THREADS;
  if (call.alloc_error) {  // torch's own error (torch.OutOfMemoryError, ...), as its Python API raises it
    torch::translate_exception_to_python(call.alloc_error);
    return nullptr;
  }
  if (!call.kind.empty()) return raise_kind(call.kind, call.message);
  if (call.result.type_index() == ffi::TypeIndex::kTVMFFINone) Py_RETURN_NONE;  // refused: nothing done
  if (call.result.type_index() == ffi::TypeIndex::kTVMFFIBool) {  // lane::ran(): on the caller's tensors
    g_py_lane_calls.fetch_add(1, std::memory_order_relaxed);
    if (call.result.cast<bool>()) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
  }
  try {
    auto many = call.result.try_cast<ffi::Array<ffi::Any>>();
    std::vector<at::Tensor> outs;
    if (many.has_value()) {
      for (const ffi::Any& v : *many) outs.push_back(allocated(v, &call.allocs, pl->name));
    } else {
      outs.push_back(allocated(call.result, &call.allocs, pl->name));
    }
    g_py_lane_calls.fetch_add(1, std::memory_order_relaxed);
    if (!many.has_value()) return THPVariable_Wrap(std::move(outs[0]));
    PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
    if (tuple == nullptr) return nullptr;
    for (size_t i = 0; i < outs.size(); ++i) {
      PyObject* t = THPVariable_Wrap(std::move(outs[i]));
      if (t == nullptr) {
        Py_DECREF(tuple);
        return nullptr;
      }
      PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), t);
    }
    return tuple;
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
}

PyMethodDef g_py_lane_def = {"lane", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(py_lane_call)),
                             METH_FASTCALL, "opmux: a serving lane's entry from the default call"};

// lane(op_id, device_type, dtype) -> the entry of the lane set_lane bound for (op, device, dtype), or None
PyObject* py_make_lane(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  long long op_id = 0, device_type = 0;
  const char* dtype = nullptr;
  if (nargs != 4 || (op_id = PyLong_AsLongLong(args[0]), PyErr_Occurred()) ||
      (device_type = PyLong_AsLongLong(args[1]), PyErr_Occurred()) || (dtype = PyUnicode_AsUTF8(args[2])) == nullptr ||
      !PyUnicode_Check(args[3])) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "lane(op_id, device_type, dtype, name)");
    return nullptr;
  }
  const DtypeMap* m = nullptr;
  for (const DtypeMap& e : kDtypes)
    if (std::string(dtype) == e.name) m = &e;
  if (m == nullptr) Py_RETURN_NONE;
  const c10::DeviceType d = device_type == kDLCUDA ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  Bound b;
  if (!op_lanes(op_id)->find(d, m->scalar, &b)) Py_RETURN_NONE;
  auto* pl = new PyLane{std::move(b.lane), PyUnicode_AsUTF8(args[3])};
  PyObject* capsule = PyCapsule_New(pl, kCapsule, [](PyObject* c) {
    delete static_cast<PyLane*>(PyCapsule_GetPointer(c, kCapsule));
  });
  if (capsule == nullptr) {
    delete pl;
    return nullptr;
  }
  PyObject* fn = PyCFunction_NewEx(&g_py_lane_def, capsule, nullptr);
  Py_DECREF(capsule);
  return fn;
}

PyObject* py_lane_calls(PyObject*, PyObject*) { return PyLong_FromLongLong(g_py_lane_calls.load()); }

// -- `torch.ops.opmux.<name>`'s call from Python (torch_kernels.attach_call) --------------------
// torch's Python entry into a library op (OpOverload._op: pybind, createStackForSchema) converts
// every scalar argument with isinstance checks against SymInt / SymFloat / SymBool: about 0.4 us a
// scalar and 0.2 us a None on the hosts measured, so an op with nine parameters pays 3-4 us before
// the dispatcher runs (docs/benchmarks/host_overhead*.md). OpCall is that entry for one library op
// whose schema has only Tensor, Tensor?, int, float and bool parameters and Tensor results: it
// converts exactly what torch would (exact tensors, Python int / float / bool, None), calls the
// same operator through the dispatcher (callBoxed, the GIL released, as torch does: every dispatch
// key, mode, fake and functional tensor, profiler and tracer keeps working) and returns what
// torch's entry returns. Anything else (a torch-function mode, a tensor subclass, a SymInt, a
// keyword it does not know, a missing argument) is handed to torch's own entry, kept as
// `original`: the same call, the same errors. It hashes as `original` does, because OpOverload
// and OpOverloadPacket hash as their `_op` and may already be keys of torch's tables.
enum class ArgKind : uint8_t { kTensor, kOptTensor, kInt, kFloat, kBool };

struct ArgSpec {
  ArgKind kind;
  PyObject* name;  // interned
  std::optional<c10::IValue> fallback;  // the schema's default
};

struct OpCallState {  // (made and dropped with the GIL held)
  c10::OperatorHandle op;
  std::vector<ArgSpec> args;
  size_t returns;
  OpCallState(c10::OperatorHandle h, size_t r) : op(std::move(h)), returns(r) {}
  OpCallState(const OpCallState&) = delete;
  OpCallState& operator=(const OpCallState&) = delete;
  ~OpCallState() {
    for (ArgSpec& a : args) Py_XDECREF(a.name);
  }
};

struct OpCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  OpCallState* state;
  PyObject* original;
  Py_hash_t hash;
  PyObject* weakrefs;
};

std::atomic<int64_t> g_op_calls{0};

// Whether `t` has dimension names (torch < 2.13; later torchs have none). (A template: the
// discarded branch is not compiled where Tensor lacks the method.)
template <typename T>
bool named(const T& t) {
  if constexpr (requires { t.has_names(); })
    return t.has_names();
  else
    return false;
}

// One argument as torch's createStackForSchema converts it; false: not a case handled here.
bool push_arg(const ArgSpec& spec, PyObject* o, torch::jit::Stack* stack) {
  switch (spec.kind) {
    case ArgKind::kOptTensor:
      if (o == Py_None) {
        stack->emplace_back();
        return true;
      }
      [[fallthrough]];
    case ArgKind::kTensor: {
      if (!THPVariable_CheckExact(o)) return false;  // (None for a Tensor, a subclass: torch's entry)
      const at::Tensor& t = THPVariable_Unpack(o);
      if (named(t)) return false;  // (torch's entry refuses named tensors)
      stack->emplace_back(t);
      return true;
    }
    case ArgKind::kInt: {
      int64_t v = 0;
      if (!PyLong_CheckExact(o) || !int64_value(o, &v)) return false;
      stack->emplace_back(v);
      return true;
    }
    case ArgKind::kFloat:
      if (!PyFloat_CheckExact(o)) return false;
      stack->emplace_back(PyFloat_AS_DOUBLE(o));
      return true;
    case ArgKind::kBool:
      if (o != Py_True && o != Py_False) return false;
      stack->emplace_back(o == Py_True);
      return true;
  }
  return false;
}

bool build_stack(const OpCallState& st, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                 torch::jit::Stack* stack) {
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  const size_t n = st.args.size();
  if (static_cast<size_t>(nargs + nkw) > n) return false;
  stack->reserve(n);
  for (Py_ssize_t i = 0; i < nargs; ++i)
    if (!push_arg(st.args[i], args[i], stack)) return false;
  Py_ssize_t used = 0;
  for (size_t i = static_cast<size_t>(nargs); i < n; ++i) {
    const ArgSpec& spec = st.args[i];
    PyObject* value = nullptr;
    for (Py_ssize_t j = 0; j < nkw && value == nullptr; ++j) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, j);
      if (key == spec.name || PyUnicode_Compare(key, spec.name) == 0) value = args[nargs + j];
    }
    if (value != nullptr) {
      if (!push_arg(spec, value, stack)) return false;
      ++used;
    } else if (spec.fallback.has_value()) {
      stack->push_back(*spec.fallback);
    } else {
      return false;  // (missing: torch's entry names it)
    }
  }
  return used == nkw;  // (an unknown keyword, or one given twice: torch's entry names it)
}

struct NoGil {  // pybind11::gil_scoped_release without pybind
  PyThreadState* state = PyEval_SaveThread();
  ~NoGil() { PyEval_RestoreThread(state); }
};

// What torch's entry would do before converting anything (then it is the one to call): a
// torch-function mode, or (torch 2.13+) a pending `_skip_one_hop_torch_function` that its
// has_torch_function check consumes (torch.overrides.redispatch_function).
template <typename TLS = at::impl::PythonTorchFunctionTLS>
bool torch_function_pending() {
  if (at::impl::torch_function_mode_enabled()) return true;
  if constexpr (requires { TLS::peek_skip_next(); })
    return TLS::peek_skip_next();
  else
    return false;
}

// A C++ exception from the call, raised in Python as torch's pybind entry raises it: pybind's
// own exceptions keep their class (a cast error is a TypeError), a Python error is restored, and
// torch's (c10::Error and kin) are translated by torch. No warning handler: torch's entry has
// none either (a TORCH_WARN goes to c10's handler, not to Python's warning filters).
PyObject* raise_from_call() {
  try {
    throw;
  } catch (pybind11::error_already_set& e) {
    e.restore();
  } catch (const pybind11::builtin_exception& e) {
    e.set_error();
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
  }
  return nullptr;
}

PyObject* wrap_results(torch::jit::Stack* stack, const OpCallState& st) {
  const size_t nr = st.returns;
  TORCH_CHECK(stack->size() == nr, "opmux: ", st.op.schema().name(), " left ", stack->size(), " values, not ", nr);
  for (const c10::IValue& v : *stack)
    TORCH_CHECK(v.isTensor(), "opmux: ", st.op.schema().name(), " returned a non-tensor");
  if (nr == 0) Py_RETURN_NONE;
  if (nr == 1) return THPVariable_Wrap(std::move((*stack)[0]).toTensor());
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(nr));
  if (tuple == nullptr) return nullptr;
  for (size_t i = 0; i < nr; ++i) {
    PyObject* t = THPVariable_Wrap(std::move((*stack)[i]).toTensor());
    if (t == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), t);
  }
  return tuple;
}

PyObject* op_call(PyObject* self_obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<OpCall*>(self_obj);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  try {
    torch::jit::Stack stack;
    if (torch_function_pending() || !build_stack(*self->state, args, nargs, kwnames, &stack))
      return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    g_op_calls.fetch_add(1, std::memory_order_relaxed);
    {
      NoGil released;  // (its destructor takes the GIL back before any catch below runs)
      self->state->op.callBoxed(&stack);
    }
    return wrap_results(&stack, *self->state);
  } catch (...) {
    return raise_from_call();
  }
}

void op_call_dealloc(PyObject* self_obj) {
  auto* self = reinterpret_cast<OpCall*>(self_obj);
  PyTypeObject* type = Py_TYPE(self_obj);
  if (self->weakrefs != nullptr) PyObject_ClearWeakRefs(self_obj);
  delete self->state;
  Py_XDECREF(self->original);
  type->tp_free(self_obj);
  Py_DECREF(type);
}

Py_hash_t op_call_hash(PyObject* self) { return reinterpret_cast<OpCall*>(self)->hash; }

PyObject* op_call_repr(PyObject* self) { return PyObject_Repr(reinterpret_cast<OpCall*>(self)->original); }

// Attributes are the original's (``__name__``, ``__module__``, what torch reads or sets on `_op`);
// ``__wrapped__`` is the original itself.
// ``__copy__`` / ``__deepcopy__`` give the object itself, as for torch's builtin.
PyObject* op_call_getattro(PyObject* self, PyObject* name) {
  PyObject* original = reinterpret_cast<OpCall*>(self)->original;
  if (PyUnicode_Check(name)) {
    if (PyUnicode_CompareWithASCIIString(name, "__copy__") == 0 ||
        PyUnicode_CompareWithASCIIString(name, "__deepcopy__") == 0)
      return PyObject_GenericGetAttr(self, name);
    if (PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0) {
      Py_INCREF(original);
      return original;
    }
  }
  return PyObject_GetAttr(original, name);
}
int op_call_setattro(PyObject* self, PyObject* name, PyObject* value) {
  return PyObject_SetAttr(reinterpret_cast<OpCall*>(self)->original, name, value);
}
PyObject* op_call_self(PyObject* self, PyObject* const*, Py_ssize_t) {
  Py_INCREF(self);
  return self;
}
PyMethodDef g_op_call_methods[] = {
    {"__copy__", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(op_call_self)), METH_FASTCALL, nullptr},
    {"__deepcopy__", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(op_call_self)), METH_FASTCALL, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyMemberDef g_op_call_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, static_cast<Py_ssize_t>(offsetof(OpCall, vectorcall)), READONLY, nullptr},
    {"__weaklistoffset__", T_PYSSIZET, static_cast<Py_ssize_t>(offsetof(OpCall, weakrefs)), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot g_op_call_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(op_call_dealloc)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_hash, reinterpret_cast<void*>(op_call_hash)},
    {Py_tp_repr, reinterpret_cast<void*>(op_call_repr)},
    {Py_tp_getattro, reinterpret_cast<void*>(op_call_getattro)},
    {Py_tp_setattro, reinterpret_cast<void*>(op_call_setattro)},
    {Py_tp_members, g_op_call_members},
    {Py_tp_methods, g_op_call_methods},
    {0, nullptr}};

PyType_Spec g_op_call_spec = {"_opmux_torch_bridge.OpCall", sizeof(OpCall), 0,
                              Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                              g_op_call_slots};
PyObject* g_op_call_type = nullptr;

// op_call(qualname, original) -> an OpCall for library op `qualname` (its default overload) that
// hands what it does not take to `original`, or None: a schema it does not cover.
PyObject* py_make_op_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyCallable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "op_call(qualname, original)");
    return nullptr;
  }
  const char* qualname = PyUnicode_AsUTF8(args[0]);
  if (qualname == nullptr) return nullptr;
  const Py_hash_t hash = PyObject_Hash(args[1]);
  if (hash == -1) return nullptr;
  HANDLE_TH_ERRORS
  auto handle = c10::Dispatcher::singleton().findSchema({qualname, ""});
  if (!handle.has_value()) Py_RETURN_NONE;
  const c10::FunctionSchema& schema = handle->schema();
  if (schema.is_vararg() || schema.is_varret()) Py_RETURN_NONE;
  for (const c10::Argument& r : schema.returns())
    if (r.real_type()->kind() != c10::TypeKind::TensorType) Py_RETURN_NONE;
  auto state = std::make_unique<OpCallState>(*handle, schema.returns().size());
  for (const c10::Argument& a : schema.arguments()) {
    ArgKind kind;
    const c10::TypePtr& t = a.real_type();  // (SymInt, ScalarType, ... are not IntType here)
    if (a.kwarg_only() || a.N().has_value()) Py_RETURN_NONE;  // (none of opmux's schemas has these)
    switch (t->kind()) {
      case c10::TypeKind::TensorType: kind = ArgKind::kTensor; break;
      case c10::TypeKind::IntType: kind = ArgKind::kInt; break;
      case c10::TypeKind::FloatType: kind = ArgKind::kFloat; break;
      case c10::TypeKind::BoolType: kind = ArgKind::kBool; break;
      case c10::TypeKind::OptionalType:
        if (t->expectRef<c10::OptionalType>().getElementType()->kind() != c10::TypeKind::TensorType)
          Py_RETURN_NONE;
        kind = ArgKind::kOptTensor;
        break;
      default: Py_RETURN_NONE;
    }
    PyObject* name = PyUnicode_InternFromString(a.name().c_str());
    if (name == nullptr) return nullptr;
    state->args.push_back(ArgSpec{kind, name, a.default_value()});
  }
  auto* self = PyObject_New(OpCall, reinterpret_cast<PyTypeObject*>(g_op_call_type));
  if (self == nullptr) return nullptr;
  self->weakrefs = nullptr;
  self->vectorcall = op_call;
  self->state = state.release();
  Py_INCREF(args[1]);
  self->original = args[1];
  self->hash = hash;
  return reinterpret_cast<PyObject*>(self);
  END_HANDLE_TH_ERRORS
}

PyObject* py_op_calls(PyObject*, PyObject*) { return PyLong_FromLongLong(g_op_calls.load()); }

PyMethodDef g_module_methods[] = {
    {"lane", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(py_make_lane)), METH_FASTCALL,
     "lane(op_id, device_type, dtype, name): the default call's entry into a bound lane, or None"},
    {"lane_calls", py_lane_calls, METH_NOARGS, "how many calls these entries ran through a lane"},
    {"op_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(py_make_op_call)), METH_FASTCALL,
     "op_call(qualname, original): torch.ops' entry into a library op, or None"},
    {"op_calls", py_op_calls, METH_NOARGS, "how many library-op calls OpCall entries took (raised or not)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef g_module = {PyModuleDef_HEAD_INIT, "_opmux_torch_bridge", nullptr, -1, g_module_methods};
#endif  // BRIDGE_PY_ENTRY
}  // namespace torch_bridge
}  // namespace opmux

TVM_FFI_DLL_EXPORT_TYPED_FUNC(opmux_bridge_define, opmux::torch_bridge::define);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(opmux_bridge_set_lane, opmux::torch_bridge::set_lane);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(opmux_bridge_clear, opmux::torch_bridge::clear);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(opmux_bridge_lane_calls, opmux::torch_bridge::lane_calls);

#ifdef BRIDGE_PY_ENTRY
PyMODINIT_FUNC PyInit__opmux_torch_bridge() {
  using opmux::torch_bridge::g_op_call_type;
  if (g_op_call_type == nullptr) g_op_call_type = PyType_FromSpec(&opmux::torch_bridge::g_op_call_spec);
  if (g_op_call_type == nullptr) return nullptr;
  return PyModule_Create(&opmux::torch_bridge::g_module);
}
#endif
