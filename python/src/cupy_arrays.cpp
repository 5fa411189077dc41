// CuPy arrays read from CuPy's own attributes (see cupy_arrays.hpp).
#include "cupy_arrays.hpp"

#include <algorithm>

namespace gpupool_python {
namespace {

// Attribute names interned once; NumPy's dtype objects of gpupool's types (CuPy arrays carry
// NumPy dtypes, and NumPy keeps one object per built-in type).
struct cached_names {
  PyObject* dtype = PyUnicode_InternFromString("dtype");
  PyObject* c_contiguous = PyUnicode_InternFromString("_c_contiguous");
  PyObject* data = PyUnicode_InternFromString("data");
  PyObject* ptr = PyUnicode_InternFromString("ptr");
  PyObject* device_id = PyUnicode_InternFromString("device_id");
  PyObject* size = PyUnicode_InternFromString("size");
  PyObject* shape = PyUnicode_InternFromString("shape");
  PyObject* ndim = PyUnicode_InternFromString("ndim");
  PyObject* ndarray = PyUnicode_InternFromString("ndarray");
  PyObject* cupy = PyUnicode_InternFromString("cupy");
  std::vector<std::pair<PyObject*, gpupool::dtype>> dtypes = [] {
    std::vector<std::pair<PyObject*, gpupool::dtype>> out;
    nb::object numpy_dtype = nb::module_::import_("numpy").attr("dtype");
    for (const gpupool::dtype_info& info : gpupool::dtypes)
      out.emplace_back(numpy_dtype(info.name).release().ptr(), info.type);
    return out;
  }();
};

const cached_names& names() {
  static const auto* const n = new cached_names;  // leaked: used until the process ends
  return *n;
}

nb::object attribute(nb::handle o, PyObject* name) {
  PyObject* r = PyObject_GetAttr(o.ptr(), name);
  if (r == nullptr) throw nb::python_error();
  return nb::steal(r);
}

}  // namespace

cupy_reading read_cupy(nb::handle a) {
  const cached_names& n = names();
  cupy_reading r;
  nb::object dtype = attribute(a, n.dtype);
  auto known = std::find_if(n.dtypes.begin(), n.dtypes.end(),
                            [&](const auto& d) { return d.first == dtype.ptr(); });
  if (known == n.dtypes.end())  // an equal dtype that is another object (unpickled, say)
    known = std::find_if(n.dtypes.begin(), n.dtypes.end(), [&](const auto& d) {
      const int equal = PyObject_RichCompareBool(dtype.ptr(), d.first, Py_EQ);
      if (equal < 0) throw nb::python_error();
      return equal == 1;
    });
  if (known == n.dtypes.end()) {
    r.trouble = cupy_reading::problem::dtype;
    r.dtype = std::move(dtype);
    return r;
  }
  r.view.type = known->second;
  // CuPy's readonly `_c_contiguous`; `flags.c_contiguous` (an object made per access) otherwise.
  PyObject* contiguous = PyObject_GetAttr(a.ptr(), n.c_contiguous);
  bool is_contiguous = false;
  if (contiguous != nullptr) {
    is_contiguous = PyObject_IsTrue(contiguous) == 1;
    Py_DECREF(contiguous);
  } else {
    PyErr_Clear();
    is_contiguous = nb::cast<bool>(a.attr("flags").attr("c_contiguous"));
  }
  if (!is_contiguous) {
    r.trouble = cupy_reading::problem::not_contiguous;
    return r;
  }
  nb::object memory = attribute(a, n.data);
  r.view.address = nb::cast<std::uintptr_t>(attribute(memory, n.ptr));
  r.view.ordinal = nb::cast<int>(attribute(memory, n.device_id));
  r.view.count = nb::cast<std::size_t>(attribute(a, n.size));
  // `ndim` is a small int; `shape` a new tuple each time, needed only beyond one dimension.
  r.view.ndim = nb::cast<std::size_t>(attribute(a, n.ndim));
  if (r.view.ndim != 1) r.view.shape = attribute(a, n.shape);
  return r;
}

void prepare_cupy_reading() {
  static_cast<void>(names());
}

nb::handle cupy_ndarray_type() {
  PyObject* cupy = PyImport_GetModule(names().cupy);  // new reference, or null
  if (cupy == nullptr) {
    PyErr_Clear();
    return {};
  }
  nb::object module = nb::steal(cupy);
  PyObject* type = PyObject_GetAttr(module.ptr(), names().ndarray);
  if (type == nullptr) {
    PyErr_Clear();
    return {};
  }
  // The module holds the type as long as CuPy is imported, which it stays.
  Py_DECREF(type);
  return type;
}

std::vector<std::size_t> sizes_of(const cupy_array_view& view) {
  if (view.ndim == 1) return {view.count};
  std::vector<std::size_t> sizes;
  sizes.reserve(view.ndim);
  for (nb::handle n : view.shape) sizes.push_back(nb::cast<std::size_t>(n));
  return sizes;
}

}  // namespace gpupool_python
