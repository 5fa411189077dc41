// Device arrays and a device map's calls read into plain data (see device_arrays.hpp).
#include "device_arrays.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "cupy_arrays.hpp"

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

// Clears the Python error just raised where it is an Exception (a broken protocol says "not a
// device array"); anything else (KeyboardInterrupt, say) propagates.
void clear_exception() {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) throw nb::python_error();
  PyErr_Clear();
}

// Whether `a.__dlpack_device__()` names a CUDA device; a protocol that fails says it does not.
bool is_dlpack_cuda(nb::handle a) {
  std::optional<nb::object> method = attribute_if_any(a, names().dlpack_device);
  if (!method || method->is_none()) return false;
  PyObject* device = PyObject_CallNoArgs(method->ptr());
  if (device == nullptr) {
    clear_exception();
    return false;
  }
  nb::object held = nb::steal(device);
  PyObject* type = PySequence_GetItem(device, 0);
  if (type == nullptr) {
    clear_exception();
    return false;
  }
  nb::object cuda = nb::int_(dlpack_cuda);
  const int equal = PyObject_RichCompareBool(type, cuda.ptr(), Py_EQ);
  Py_DECREF(type);
  if (equal < 0) clear_exception();
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

}  // namespace

bool is_device_array(nb::handle a) {
  return attribute_if_any(a, names().cai).has_value() || is_dlpack_cuda(a);
}

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
  const nb::object data = (*cai)[nb::handle(n.data)];
  r.address = nb::cast<std::uintptr_t>(nb::int_(data[0]));
  if (nb::len(data) > 1) {
    const int read_only = PyObject_IsTrue(nb::object(data[1]).ptr());
    if (read_only < 0) throw nb::python_error();
    r.read_only = read_only == 1;
  }
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
                            gpupool::to_string(info.kind))
                               .c_str());
    }
  }
  return r;
}

namespace {

// `message` with " (call c)" after it, unless it already names call c.
std::string numbered(const std::string& message, std::size_t c) {
  const std::string name = "call " + std::to_string(c);
  const auto at = message.find(name);
  const bool names_it = at != std::string::npos &&
                        (at + name.size() == message.size() ||
                         !std::isdigit(static_cast<unsigned char>(message[at + name.size()])));
  return names_it ? message : message + " (" + name + ")";
}

gpupool::kernel_argument device_argument(std::uintptr_t address, std::size_t count,
                                         gpupool::dtype t) {
  return gpupool::visit_dtype(t, [&]<class T>() {
    return gpupool::kernel_argument(std::span<const T>(reinterpret_cast<const T*>(address), count));
  });
}

}  // namespace

void rethrow_reworded(const std::exception_ptr& failure,
                      const std::function<std::string(const std::string&)>& message_for) {
  try {
    std::rethrow_exception(failure);
  } catch (const nb::builtin_exception& e) {
    throw nb::builtin_exception(e.type(), message_for(e.what()).c_str());
  } catch (const gpupool::argument_range_error& e) {
    throw gpupool::argument_range_error(message_for(e.what()));
  } catch (const gpupool::argument_kind_error& e) {
    throw gpupool::argument_kind_error(message_for(e.what()));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(message_for(e.what()));
  } catch (const nb::python_error& e) {
    // gpupool's own refusals raised as Python errors (a number out of range, say): the same
    // error with the new message; anything else as it came.
    const nb::handle type = e.type();
    if (type.is(PyExc_TypeError) || type.is(PyExc_ValueError) || type.is(PyExc_OverflowError)) {
      nb::object args = e.value().attr("args");
      if (nb::len(args) == 1 && PyUnicode_Check(nb::handle(args[0]).ptr())) {
        const std::string message = nb::cast<std::string>(args[0]);
        const std::string reworded = message_for(message);
        if (reworded != message) throw_python(type.ptr(), reworded);
      }
    }
    throw;
  }
}

call_reader::call_reader(const std::string& kernel_name,
                         const std::vector<gpupool::kernel_parameter>& inputs,
                         const gpupool::kernel_parameter& output, nb::sequence calls,
                         nb::handle cupy_ndarray, nb::object out, bool out_is_one_array,
                         reading_notes& notes)
    : name_(kernel_name),
      inputs_(inputs),
      output_(output),
      calls_(std::move(calls)),
      cupy_ndarray_(cupy_ndarray.is_valid() && !cupy_ndarray.is_none() ? nb::borrow(cupy_ndarray)
                                                                       : nb::object()),
      out_(std::move(out)),
      notes_(notes),
      given_outputs_(out_.is_valid() && !out_.is_none()),
      last_number_(inputs.size()),
      last_number_argument_(inputs.size()) {
  if (!out_is_one_array) return;
  if (!given_outputs_) throw nb::value_error("gpupool: one output array needs out");
  const auto where = [] { return std::string("out"); };
  if (!is_cupy(out_) && !is_device_array(out_))
    throw nb::type_error(
        "gpupool: out must be one device array (CuPy, PyTorch, ...) to take every call's output "
        "end to end");
  const auto [address, count, ordinal] = read_written(out_, where);
  one_out_ = one_output{address, count, ordinal, 0};
}

void call_reader::check_every_call_read() const {
  if (one_out_ && one_out_->taken != one_out_->count)
    throw nb::value_error(("gpupool: out holds " + std::to_string(one_out_->count) +
                           " element(s); the calls write " + std::to_string(one_out_->taken))
                              .c_str());
}

void call_reader::read(std::size_t c, described_call& d) {
  try {
    describe(c, d);
  } catch (...) {
    rethrow_reworded(std::current_exception(),
                     [c](const std::string& message) { return numbered(message, c); });
  }
}

call_reader::array_reading call_reader::read_other(nb::handle a,
                                                   const std::function<std::string()>& where,
                                                   bool written) {
  std::optional<device_array_reading> r = read_device_array(a, where);
  if (!r)
    throw nb::type_error(("gpupool: " + where() +
                          " is not a device array; a map over device arrays takes device arrays "
                          "and numbers only (host arrays go in a map of their own)")
                             .c_str());
  if (written && r->read_only)
    throw nb::value_error(
        ("gpupool: " + where() + " is read-only (its CUDA Array Interface says so)").c_str());
  if (r->stream &&
      std::find(notes_.streams.begin(), notes_.streams.end(), *r->stream) == notes_.streams.end())
    notes_.streams.push_back(*r->stream);
  if (!r->read.is(a)) notes_.views.append(r->read);
  return {r->address, r->count, r->type, r->ordinal, std::move(r->shape)};
}

std::tuple<std::uintptr_t, std::size_t, int> call_reader::read_written(
    nb::handle o, const std::function<std::string()>& where) {
  std::uintptr_t address = 0;
  std::size_t count = 0;
  gpupool::dtype type{};
  int ordinal = -1;
  if (is_cupy(o)) {
    const cupy_array_view view = describe_cupy(o, where);
    std::tie(address, count, type, ordinal) =
        std::make_tuple(view.address, view.count, view.type, view.ordinal);
  } else {
    std::tie(address, count, type, ordinal, std::ignore) = read_other(o, where, true);
  }
  if (type != output_.type)
    throw nb::type_error(("gpupool: " + where() + " is " + gpupool::to_string(type) + "; kernel '" +
                          name_ + "' writes " + gpupool::to_string(output_.type))
                             .c_str());
  return {address, count, ordinal};
}

void call_reader::read_output(std::size_t c, described_call& d) {
  const auto where = [&] {
    return "call " + std::to_string(c) + (one_out_ ? "'s part of out" : "'s output");
  };
  std::uintptr_t address = 0;
  std::size_t count = 0;
  int ordinal = -1;
  nb::object o;
  if (one_out_) {
    // The calls' parts follow one another: this call's starts where the last one's ended.
    const std::size_t left = one_out_->count - one_out_->taken;
    if (d.work.count > left)
      throw nb::value_error(("gpupool: out holds " + std::to_string(one_out_->count) +
                             " element(s); call " + std::to_string(c) +
                             " and those before it write " +
                             std::to_string(one_out_->taken + d.work.count))
                                .c_str());
    address = one_out_->address + one_out_->taken * gpupool::size_of(output_.type);
    count = d.work.count;
    // An empty array says no GPU; its parts are all empty, which the check below lets pass.
    ordinal = one_out_->ordinal;
    // A call of empty arrays that do not say their GPU runs on out's (it writes nothing).
    if (d.ordinal < 0) d.ordinal = ordinal;
    one_out_->taken += count;
  } else {
    o = out_[c];
    std::tie(address, count, ordinal) = read_written(o, where);
  }
  if (count != d.work.count)
    throw nb::value_error(("gpupool: " + where() + " has " + std::to_string(count) +
                           " element(s), the call " + std::to_string(d.work.count))
                              .c_str());
  if (count != 0 && ordinal != d.ordinal)
    throw nb::value_error(("gpupool: " + where() + " is on GPU " + std::to_string(ordinal) +
                           ", the call's arrays on GPU " + std::to_string(d.ordinal))
                              .c_str());
  for (const gpupool::kernel_argument& in : d.work.inputs) {
    if (!in.is_array()) continue;
    const auto begin = reinterpret_cast<std::uintptr_t>(in.data());
    if (auto problem =
            hazards_.add_input(begin, begin + in.size() * gpupool::size_of(in.type()), c))
      throw nb::value_error(("gpupool: call " + std::to_string(c) + " " + *problem).c_str());
  }
  if (auto problem =
          hazards_.add_output(address, address + count * gpupool::size_of(output_.type), c))
    throw nb::value_error(("gpupool: call " + std::to_string(c) + " " + *problem).c_str());
  d.work.out = reinterpret_cast<void*>(address);
  d.output = std::move(o);
}

std::optional<call_reader::array_reading> call_reader::read_argument(std::size_t c, std::size_t i,
                                                                     nb::handle a,
                                                                     described_call& d) {
  // Named only in a refusal: thousands of arrays pass through here per map.
  const auto where = [&] { return "call " + std::to_string(c) + " argument " + std::to_string(i); };
  if (is_cupy(a)) {
    const cupy_array_view view = describe_cupy(a, where);
    // A 0-d array is a number (as_number below), as in a submit.
    if (view.ndim != 0)
      return array_reading{view.address, view.count, view.type, view.ordinal, view.shape};
  }
  if (last_number_[i].is(a)) {
    // A number broadcast to every call is the same object in each: checked and converted once.
    d.work.inputs.push_back(*last_number_argument_[i]);
    return std::nullopt;
  }
  if (auto number = as_number(a)) {
    d.work.inputs.push_back(scalar_argument(*number, inputs_[i].type,
                                            "argument[" + std::to_string(i) + "] ('" +
                                                inputs_[i].name + "') of kernel '" + name_ + "'"));
    last_number_[i] = nb::borrow(a);
    last_number_argument_[i] = d.work.inputs.back();
    return std::nullopt;
  }
  return read_other(a, where);
}

void call_reader::describe(std::size_t c, described_call& d) {
  const std::size_t arity = inputs_.size();
  nb::object args = calls_[c];
  const std::size_t given = nb::len(args);
  if (given != arity)
    throw nb::type_error(("gpupool: kernel '" + name_ + "' takes " + std::to_string(arity) +
                          " argument(s), " + std::to_string(given) + " given")
                             .c_str());
  d.work.inputs.reserve(arity);
  for (std::size_t i = 0; i < arity; ++i) {
    nb::object a = args[i];
    auto reading = read_argument(c, i, a, d);
    if (!reading) continue;
    auto& [address, count, type, ordinal, shape] = *reading;
    d.work.inputs.push_back(device_argument(address, count, type));
    if (!d.anchor.is_valid()) {
      d.anchor = a;
      d.ordinal = ordinal;
      d.shape = std::move(shape);
      d.work.count = count;
    } else if (count != 0 && ordinal != d.ordinal) {
      throw nb::value_error(("gpupool: call " + std::to_string(c) + " has arrays on GPUs " +
                             std::to_string(d.ordinal) + " and " + std::to_string(ordinal))
                                .c_str());
    }
  }
  if (!d.anchor.is_valid())
    throw nb::type_error(
        ("gpupool: call " + std::to_string(c) + " of kernel '" + name_ + "' has no array").c_str());
  if (given_outputs_) read_output(c, d);
  // One compiled kernel serves the whole map, as in map_on_device, across blocks too.
  if (c == 0) {
    for (const auto& in : d.work.inputs) first_pattern_.push_back(in.is_array());
    return;
  }
  for (std::size_t i = 0; i < arity; ++i)
    if (d.work.inputs[i].is_array() != first_pattern_[i])
      throw nb::value_error(("gpupool: kernel '" + name_ +
                             "': the call mixes arrays and scalars differently from the "
                             "first call; pass each pattern in its own map (call " +
                             std::to_string(c) + ")")
                                .c_str());
}

void bind_device_arrays(nb::module_& m) {
  using namespace nb::literals;
  m.def("is_device_array", &is_device_array, "obj"_a.none(),
        "Whether `obj` is an array on a GPU: it speaks the CUDA Array Interface, or its "
        "__dlpack_device__ names a CUDA device (a protocol that fails says it is not).");
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
