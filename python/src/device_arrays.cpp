// Device arrays read into plain data (see device_arrays.hpp).
#include "device_arrays.hpp"

#include <atomic>
#include <bit>
#include <string_view>
#include <utility>
#include <vector>

#include "arrays.hpp"

namespace gpupool_python {
namespace {

// Names interned once: a map reads them for every array that is not a CuPy array.
struct interned {
  PyObject* cai = PyUnicode_InternFromString("__cuda_array_interface__");
  PyObject* dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
  PyObject* cupy = PyUnicode_InternFromString("cupy");
  PyObject* from_dlpack = PyUnicode_InternFromString("from_dlpack");
  PyObject* data = PyUnicode_InternFromString("data");
  PyObject* shape = PyUnicode_InternFromString("shape");
  PyObject* typestr = PyUnicode_InternFromString("typestr");
  PyObject* strides = PyUnicode_InternFromString("strides");
  PyObject* stream = PyUnicode_InternFromString("stream");
};

const interned& names() {
  static const auto* const n = new interned;  // leaked: used until the process ends
  return *n;
}

constexpr int dlpack_cuda = 2;  // kDLCUDA

// Set only by tests on machines without a GPU (see bind_device_arrays).
std::atomic<bool> host_memory_as_device{false};

// `o.name`, or nothing where `o` has no such attribute (as hasattr sees it: any other error
// raised while looking it up propagates).
std::optional<nb::object> attribute_if_any(nb::handle o, PyObject* name) {
  PyObject* r = PyObject_GetAttr(o.ptr(), name);
  if (r != nullptr) return nb::steal(r);
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw nb::python_error();
  PyErr_Clear();
  return std::nullopt;
}

// Whether `a.__dlpack_device__()` names a CUDA device; a protocol that fails says it does not.
bool is_dlpack_cuda(nb::handle a) {
  PyObject* method = PyObject_GetAttr(a.ptr(), names().dlpack_device);
  if (method == nullptr) {
    PyErr_Clear();
    return false;
  }
  nb::object owned = nb::steal(method);
  PyObject* device = PyObject_CallNoArgs(method);
  if (device == nullptr) {
    PyErr_Clear();
    return false;
  }
  nb::object held = nb::steal(device);
  PyObject* type = PySequence_GetItem(device, 0);
  if (type == nullptr) {
    PyErr_Clear();
    return false;
  }
  nb::object cuda = nb::int_(dlpack_cuda);
  const int equal = PyObject_RichCompareBool(type, cuda.ptr(), Py_EQ);
  Py_DECREF(type);
  if (equal < 0) PyErr_Clear();
  return equal == 1;
}

// The interface's value for `key`, or None: `cai.get(key)`.
nb::object entry_or_none(const nb::object& cai, PyObject* key) {
  if (PyDict_Check(cai.ptr())) {
    PyObject* value = PyDict_GetItemWithError(cai.ptr(), key);  // borrowed
    if (value == nullptr && PyErr_Occurred()) throw nb::python_error();
    return value == nullptr ? nb::none() : nb::borrow(value);
  }
  return cai.attr("get")(nb::handle(key));
}

// The gpupool dtype of array-interface type string `typestr`, or nothing. Native byte order only:
// the kernels read elements as the machine stores them.
std::optional<gpupool::dtype> dtype_of_typestr(std::string_view typestr) {
  constexpr char native = std::endian::native == std::endian::little ? '<' : '>';
  if (typestr.size() < 2 || (typestr[0] != native && typestr[0] != '=' && typestr[0] != '|'))
    return std::nullopt;
  for (const gpupool::dtype_info& info : gpupool::dtypes)
    if (typestr.substr(1) ==
        std::string(1, info.is_integer ? 'i' : 'f') + std::to_string(info.size))
      return info.type;
  return std::nullopt;
}

const char* memory_kind_name(gpupool::memory_kind kind) {
  switch (kind) {
    case gpupool::memory_kind::pinned_host:
      return "pinned_host";
    case gpupool::memory_kind::device:
      return "device";
    case gpupool::memory_kind::managed:
      return "managed";
    case gpupool::memory_kind::unknown:
      break;
  }
  return "unknown";
}

}  // namespace

std::optional<device_array_reading> read_device_array(nb::handle a,
                                                      const std::function<std::string()>& where) {
  const interned& n = names();
  device_array_reading r;
  r.read = nb::borrow(a);
  std::optional<nb::object> cai = attribute_if_any(a, n.cai);
  if (!cai) {
    if (!is_dlpack_cuda(a)) return std::nullopt;
    // CuPy's view speaks the interface; without CuPy there is nothing to read the capsule with.
    PyObject* cupy = PyImport_GetModule(n.cupy);  // new reference, or null
    if (cupy == nullptr) {
      if (PyErr_Occurred()) throw nb::python_error();
      throw nb::type_error(
          ("gpupool: " + where() + " is a DLPack device array; import cupy to pass it").c_str());
    }
    r.read = nb::steal(cupy).attr(nb::handle(n.from_dlpack))(a);
    cai = r.read.attr(nb::handle(n.cai));
  }
  r.address = nb::cast<std::uintptr_t>(nb::int_(nb::object((*cai)[nb::handle(n.data)])[0]));
  std::vector<std::size_t> sizes;
  for (nb::handle size : nb::object((*cai)[nb::handle(n.shape)]))
    sizes.push_back(nb::cast<std::size_t>(nb::int_(size)));
  const std::string typestr = nb::cast<std::string>(nb::str((*cai)[nb::handle(n.typestr)]));
  std::optional<gpupool::dtype> type = dtype_of_typestr(typestr);
  // Spellings the table does not know (another byte order, another type) as NumPy reads them:
  // a type string NumPy refuses is refused with NumPy's error, as it always was.
  nb::object numpy_dtype;
  if (!type) {
    numpy_dtype = nb::module_::import_("numpy").attr("dtype")(typestr);
    const auto name = nb::cast<std::string>(numpy_dtype.attr("name"));
    if (nb::cast<bool>(numpy_dtype.attr("isnative")))
      for (const gpupool::dtype_info& info : gpupool::dtypes)
        if (name == info.name) type = info.type;
  }
  nb::object stream = entry_or_none(*cai, n.stream);
  if (!stream.is_none()) {
    const auto handle = nb::cast<std::uintptr_t>(stream);
    if (handle != 0) r.stream = handle;  // 0 is no stream (v3 disallows it)
  }
  r.count = 1;
  for (std::size_t size : sizes) r.count *= size;
  if (!type)
    throw nb::type_error(("gpupool: " + where() + " has unsupported dtype " +
                          nb::cast<std::string>(nb::str(numpy_dtype)) + "; expected " +
                          dtype_names(" or "))
                             .c_str());
  r.type = *type;
  // Dimensions of one element may have any stride, and an array of one element any layout.
  nb::object strides = entry_or_none(*cai, n.strides);
  if (!strides.is_none() && r.count > 1) {
    std::size_t expected = gpupool::size_of(r.type);
    std::vector<std::size_t> c_strides(sizes.size());
    for (std::size_t i = sizes.size(); i-- > 0;) {
      c_strides[i] = expected;
      expected *= sizes[i];
    }
    std::size_t i = 0;
    for (nb::handle stride : strides) {
      if (i == sizes.size()) break;
      if (sizes[i] != 1 &&
          nb::cast<std::int64_t>(nb::int_(stride)) != static_cast<std::int64_t>(c_strides[i]))
        throw nb::value_error(
            ("gpupool: " + where() + " is not C-contiguous; make a contiguous copy").c_str());
      ++i;
    }
  }
  nb::tuple shape = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(sizes.size())));
  if (!shape.is_valid()) throw nb::python_error();
  for (std::size_t i = 0; i < sizes.size(); ++i)
    PyTuple_SET_ITEM(shape.ptr(), static_cast<Py_ssize_t>(i), nb::int_(sizes[i]).release().ptr());
  r.shape = std::move(shape);
  if (r.count != 0) {
    const gpupool::pointer_info info =
        gpupool::describe_pointer(reinterpret_cast<const void*>(r.address));
    if (info.kind == gpupool::memory_kind::unknown && host_memory_as_device.load()) {
      r.ordinal = 0;
    } else if (info.kind == gpupool::memory_kind::device ||
               info.kind == gpupool::memory_kind::managed) {
      r.ordinal = info.device;
    } else {
      throw nb::type_error(("gpupool: " + where() + " claims to be on a GPU, but its memory is " +
                            memory_kind_name(info.kind))
                               .c_str());
    }
  }
  return r;
}

void bind_device_arrays(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "describe_device_array",
      [](nb::handle a, const std::string& where) {
        std::optional<device_array_reading> r = read_device_array(a, [&] { return where; });
        if (!r) throw nb::type_error(("gpupool: " + where + " is not a device array").c_str());
        return std::make_tuple(r->address, r->count, std::string(gpupool::info_of(r->type).name),
                               r->ordinal, nb::borrow<nb::tuple>(r->shape), r->stream,
                               std::move(r->read));
      },
      "array"_a, "where"_a,
      "(address, element count, dtype name, ordinal (-1 when empty), shape, the producer's stream "
      "to wait for or None, the object read: the array or CuPy's view of a DLPack one) of a "
      "device array, checked as every device array gpupool takes is.");
  // Without a GPU, nothing is device memory: tests of the reading on the CPU backend, where host
  // memory stands in for device memory, take memory describe_pointer does not know as GPU 0's.
  m.def(
      "_take_host_memory_as_device", [](bool on) { return host_memory_as_device.exchange(on); },
      "on"_a, "For tests without a GPU only: sets the switch, returning what it was.");
}

}  // namespace gpupool_python
