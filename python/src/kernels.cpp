// Built-in kernels (gpupool.kernels) and kernels compiled at run time (gpupool.elementwise,
// gpupool.raw_kernel), with the checks of their arguments.
#include "kernels.hpp"

#include <cstdint>
#include <deque>
#include <limits>
#include <string>

#include "arrays.hpp"

namespace gpupool_python {
namespace {

// The alpha of scale/axpy as the caller gave it (a Python bool, int or float), kept on the
// BuiltinKernel object: the C++ kernel carries a double, which tells neither 2 from 2.0 nor every
// int64 apart.
constexpr const char* alpha_attribute = "_alpha_value";

nb::object alpha_kernel(gpupool::op operation, const char* op_name, nb::handle alpha) {
  const std::string where = std::string("alpha of gpupool.kernels.") + op_name;
  const auto n = as_number(alpha);
  if (!n || n->kind == number_kind::complex)
    throw_python(PyExc_TypeError, "gpupool: " + where + " is " + describe_value(alpha) + ", a " +
                                      (n ? std::string("complex")
                                         : std::string(nb::type_name(alpha.type()).c_str())) +
                                      "; expected a real number (bool, int or float)");
  double value = 0.0;
  if (n->kind == number_kind::boolean) {
    value = n->value.ptr() == Py_True ? 1.0 : 0.0;
  } else if (n->kind == number_kind::integer) {
    value = PyLong_AsDouble(n->value.ptr());
    if (value == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      throw_python(PyExc_OverflowError, "gpupool: " + where + " is " + describe_value(alpha) +
                                            ", too large for any dtype gpupool supports");
    }
  } else {
    value = PyFloat_AsDouble(n->value.ptr());
  }
  nb::object kernel = nb::cast(gpupool::builtin_kernel::of(operation, value));
  kernel.attr(alpha_attribute) = n->value;
  return kernel;
}

}  // namespace

void check_alpha(nb::handle kernel_object, const gpupool::builtin_kernel& k, gpupool::dtype type,
                 const std::string& arrays) {
  if (!k.takes_alpha()) return;
  nb::object given = nb::getattr(kernel_object, alpha_attribute, nb::none());
  const auto kind = python_number_kind(given.ptr());
  const number n = kind ? number{*kind, given} : number{number_kind::real, nb::float_(k.alpha())};
  const std::string where = std::string("alpha of gpupool.kernels.") + k.name() + " (for " +
                            arrays + " of " + gpupool::to_string(type) + ")";
  const auto argument = scalar_argument(n, type, where);
  if (n.kind != number_kind::integer || !gpupool::info_of(type).is_integer) return;
  // The kernel computes with static_cast<T>(alpha): the double must be that int exactly.
  const double a = k.alpha();
  constexpr double two_to_63 = 9223372036854775808.0;
  if (!(a >= -two_to_63 && a < two_to_63) || static_cast<std::int64_t>(a) != argument.integer())
    throw_python(PyExc_OverflowError,
                 "gpupool: " + where + " is " + describe_value(given) +
                     ", which a built-in kernel cannot carry exactly (it holds alpha as a "
                     "float64); use gpupool.elementwise for such integers");
}

namespace {

// A str argument of `function` (a kernel's declaration or source), refused clearly otherwise.
std::string text_argument(nb::handle value, const char* function, const char* parameter) {
  if (!PyUnicode_Check(value.ptr()))
    throw_python(PyExc_TypeError, std::string("gpupool: ") + function + ": " + parameter +
                                      " must be a str, not " + nb::type_name(value.type()).c_str());
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(value.ptr(), &size);  // lone surrogates: an error
  if (text == nullptr) throw nb::python_error();
  return std::string(text, static_cast<std::size_t>(size));
}

// An int argument (anything with __index__, not a bool) from `low` to `high`.
unsigned count_argument(nb::handle value, const char* function, const char* parameter, unsigned low,
                        unsigned high) {
  const std::string where = std::string("gpupool: ") + function + ": " + parameter;
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    throw_python(PyExc_TypeError,
                 where + " must be an int, not " + nb::type_name(value.type()).c_str());
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (n == -1 && PyErr_Occurred()) throw nb::python_error();
  if (overflow != 0 || n < static_cast<long long>(low) || n > static_cast<long long>(high))
    throw_python(PyExc_ValueError, where + " must be from " + std::to_string(low) + " to " +
                                       std::to_string(high) + ", not " + describe_value(value));
  return static_cast<unsigned>(n);
}

}  // namespace

void bind_kernels(nb::module_& m) {
  using namespace nb::literals;
  // A factory per built-in, from gpupool's table of them (gpupool.kernels builds on these).
  auto builtin_class =
      nb::class_<gpupool::builtin_kernel>(m, "BuiltinKernel",
                                          "A built-in elementwise kernel (gpupool.kernels) with "
                                          "its alpha.",
                                          nb::dynamic_attr())
          .def_prop_ro("name",
                       [](const gpupool::builtin_kernel& k) { return std::string(k.name()); })
          .def_prop_ro("arity", &gpupool::builtin_kernel::arity)
          .def_prop_ro("alpha", &gpupool::builtin_kernel::alpha)
          .def("__repr__", [](const gpupool::builtin_kernel& k) {
            std::string s = std::string("gpupool.kernels.") + k.name();
            if (k.takes_alpha()) s += "(" + std::to_string(k.alpha()) + ")";
            return s;
          });
  // The class's old name, kept so that code written against it (isinstance checks, annotations)
  // still runs; the stubs declare it as an alias.
  m.attr("Kernel") = builtin_class;
  static std::deque<std::string> formulas;  // docstrings, alive as long as the module
  for (const gpupool::builtin_kernel_info& info : gpupool::builtin_kernels()) {
    const char* doc = formulas.emplace_back(std::string("out = ") + info.formula).c_str();
    const gpupool::op operation = info.operation;
    const char* name = info.name;
    if (info.takes_alpha)
      builtin_class.def_static(
          name, [=](nb::handle alpha) { return alpha_kernel(operation, name, alpha); },
          "alpha"_a.none(), doc);
    else
      builtin_class.def_static(
          name, [=]() { return gpupool::builtin_kernel::of(operation); }, doc);
  }
  m.def(
      "builtin_kernels",
      [] {
        nb::list out;
        for (const gpupool::builtin_kernel_info& info : gpupool::builtin_kernels()) {
          nb::dict d;
          d["name"] = info.name;
          d["arity"] = info.arity;
          d["takes_alpha"] = info.takes_alpha;
          d["formula"] = info.formula;
          out.append(d);
        }
        return out;
      },
      "The built-in kernels, as the C++ library declares them: name, arity (input arrays),\n"
      "takes_alpha, formula.");
  m.def(
      "dtypes",
      [] {
        nb::list out;
        for (const gpupool::dtype_info& t : gpupool::dtypes) out.append(t.name);
        return out;
      },
      "The element types gpupool computes with, by NumPy's names.");

  nb::class_<gpupool::elementwise_kernel>(
      m, "ElementwiseKernel",
      "An elementwise kernel compiled at run time from typed parameters and a C++ body.")
      .def(
          "__init__",
          [](gpupool::elementwise_kernel* self, nb::handle inputs, nb::handle output,
             nb::handle body, nb::handle name) {
            new (self) gpupool::elementwise_kernel(text_argument(inputs, "elementwise", "inputs"),
                                                   text_argument(output, "elementwise", "output"),
                                                   text_argument(body, "elementwise", "body"),
                                                   text_argument(name, "elementwise", "name"));
          },
          "inputs"_a.none(), "output"_a.none(), "body"_a.none(), "name"_a.none() = "elementwise")
      .def_prop_ro("name", &gpupool::elementwise_kernel::name)
      .def_prop_ro("body", &gpupool::elementwise_kernel::body)
      .def_prop_ro("inputs",
                   [](const gpupool::elementwise_kernel& k) {
                     nb::list out;
                     for (const auto& p : k.inputs())
                       out.append(nb::make_tuple(gpupool::to_string(p.type), p.name));
                     return out;
                   })
      .def_prop_ro("output",
                   [](const gpupool::elementwise_kernel& k) {
                     return nb::make_tuple(gpupool::to_string(k.output().type), k.output().name);
                   })
      .def("__repr__", [](const gpupool::elementwise_kernel& k) {
        return "gpupool.elementwise('" + k.name() + "')";
      });

  nb::class_<gpupool::launch_shape>(m, "LaunchShape", "How a raw kernel is launched.")
      .def_ro("block", &gpupool::launch_shape::block)
      .def_ro("grid", &gpupool::launch_shape::grid);

  nb::class_<gpupool::raw_kernel>(m, "RawKernel",
                                  "A kernel from CUDA source with a named entry point.")
      .def(
          "__init__",
          [](gpupool::raw_kernel* self, nb::handle source, nb::handle entry, nb::handle inputs,
             nb::handle output, nb::handle block, nb::handle grid) {
            new (self) gpupool::raw_kernel(
                text_argument(source, "raw_kernel", "source"),
                text_argument(entry, "raw_kernel", "entry"),
                text_argument(inputs, "raw_kernel", "inputs"),
                text_argument(output, "raw_kernel", "output"),
                gpupool::launch_shape{count_argument(block, "raw_kernel", "block", 1, 1024),
                                      count_argument(grid, "raw_kernel", "grid", 0,
                                                     std::numeric_limits<unsigned>::max())});
          },
          "source"_a.none(), "entry"_a.none(), "inputs"_a.none(), "output"_a.none(),
          "block"_a.none() = 256u, "grid"_a.none() = 0u)
      .def_prop_ro("name", &gpupool::raw_kernel::name)
      .def_prop_ro("source", &gpupool::raw_kernel::source)
      .def_prop_ro("shape", &gpupool::raw_kernel::shape)
      .def_prop_ro("inputs",
                   [](const gpupool::raw_kernel& k) {
                     nb::list out;
                     for (const auto& p : k.inputs())
                       out.append(nb::make_tuple(gpupool::to_string(p.type), p.name, p.array));
                     return out;
                   })
      .def_prop_ro("output",
                   [](const gpupool::raw_kernel& k) {
                     return nb::make_tuple(gpupool::to_string(k.output().type), k.output().name);
                   })
      .def("__repr__",
           [](const gpupool::raw_kernel& k) { return "gpupool.raw_kernel('" + k.name() + "')"; });

  m.def("kernels_compiled", &gpupool::kernels_compiled,
        "How many kernels this process compiled (rather than found in a cache).");
  m.def("kernel_cache_directory", &gpupool::kernel_cache_directory);
}

}  // namespace gpupool_python
