#include "core/kernels/user_call.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace gpupool::detail {
namespace {

[[noreturn]] void bad_call(const std::string& kernel, const std::string& what) {
  throw std::invalid_argument("gpupool: kernel '" + kernel + "': " + what);
}

std::string shown(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Writes scalar `arg` into `out` as parameter `p`'s type, by NumPy's "same_kind" rule: integers
// go to any type (integer parameters must hold the value), floating-point values only to
// floating-point parameters (float32 must hold the magnitude; NaN and infinities pass). Never
// converts out of range (which C++ leaves undefined).
void store_scalar(const std::string& kernel, const kernel_argument& arg, const kernel_parameter& p,
                  unsigned char* out) {
  auto store = [&](auto value) { std::memcpy(out, &value, sizeof value); };
  // Spelled out only for a refusal: a map over device arrays stores thousands of scalars.
  const auto what = [&] { return "gpupool: kernel '" + kernel + "': argument '" + p.name + "' "; };
  const auto given = [&] {
    return arg.is_integer() ? std::to_string(arg.integer()) : shown(arg.value());
  };
  visit_dtype(p.type, [&]<class T>() {
    if constexpr (std::is_integral_v<T>) {
      if (!arg.is_integer())
        throw argument_kind_error(what() + "is a floating-point number (" + given() +
                                  "), but the kernel declares " + to_string(p.type) +
                                  " (NumPy's same_kind rule casts no float to an integer type)");
      using limits = std::numeric_limits<T>;
      if (sizeof(T) < sizeof(arg.integer()) &&
          (arg.integer() < limits::min() || arg.integer() > limits::max()))
        throw argument_range_error(what() + "= " + given() + " is out of the range of " +
                                   to_string(p.type) + " [" + std::to_string(limits::min()) + ", " +
                                   std::to_string(limits::max()) + "]");
      store(static_cast<T>(arg.integer()));
    } else {
      if (!arg.is_integer() && std::isfinite(arg.value()) &&
          std::fabs(arg.value()) > std::numeric_limits<T>::max())
        throw argument_range_error(what() + "= " + given() + " is out of the range of " +
                                   to_string(p.type) + " (" + shown(std::numeric_limits<T>::max()) +
                                   " at most)");
      store(arg.is_integer() ? static_cast<T>(arg.integer()) : static_cast<T>(arg.value()));
    }
  });
}

// Checks one argument against its parameter and makes it ready for the lanes.
user_operand operand_for(const std::string& kernel, const kernel_argument& arg,
                         const kernel_parameter& p, bool declared_arrays, std::size_t count) {
  user_operand op;
  op.element_size = size_of(p.type);
  if (declared_arrays && arg.is_array() != p.array)
    bad_call(
        kernel,
        "argument '" + p.name + "' must be " +
            (p.array
                 ? "an array (declared '" + std::string(to_string(p.type)) + "* " + p.name + "')"
                 : "a number (declared '" + std::string(to_string(p.type)) + " " + p.name + "')"));
  if (arg.is_array()) {
    if (arg.type() != p.type)
      bad_call(kernel, "argument '" + p.name + "' is a " + to_string(arg.type()) +
                           " array, but the kernel declares " + to_string(p.type));
    if (arg.size() != count)
      bad_call(kernel, "argument '" + p.name + "' has " + std::to_string(arg.size()) +
                           " elements, the output " + std::to_string(count));
    op.is_array = true;
    op.data = static_cast<const char*>(arg.data());
    return op;
  }
  store_scalar(kernel, arg, p, op.scalar);
  return op;
}

void prepare(prepared_call& call, const std::string& kernel,
             const std::vector<kernel_parameter>& params, const kernel_parameter& output,
             bool declared_arrays, const std::vector<kernel_argument>& inputs, dtype out_type,
             std::size_t count) {
  if (inputs.size() != params.size())
    bad_call(kernel, "takes " + std::to_string(params.size()) + " input(s), but " +
                         std::to_string(inputs.size()) + " were given");
  if (out_type != output.type)
    bad_call(kernel, "the output is " + std::string(to_string(out_type)) +
                         ", but the kernel declares " + to_string(output.type));
  call.operands.clear();
  call.is_array.clear();
  call.operands.reserve(inputs.size());
  call.is_array.reserve(inputs.size());
  call.widest = size_of(out_type);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    call.operands.push_back(operand_for(kernel, inputs[i], params[i], declared_arrays, count));
    call.is_array.push_back(call.operands.back().is_array);
    if (call.operands.back().is_array)
      call.widest = std::max(call.widest, call.operands.back().element_size);
  }
}

// What compiling depends on, as one string: the kind of kernel, its text and signature, the
// call's pattern of arrays and scalars (elementwise kernels) and the device.
void append_signature(std::string& key, const std::vector<kernel_parameter>& inputs,
                      const kernel_parameter& output) {
  const auto append = [&](const kernel_parameter& p) {
    key += p.name;
    key += ':';
    key += to_string(p.type);
    key += p.array ? "*," : ",";
  };
  for (const auto& p : inputs) append(p);
  key += "->";
  append(output);
}

std::string memo_key(const elementwise_kernel& k, const std::vector<bool>& is_array, int ordinal) {
  std::string key = "elementwise\n" + k.name() + '\n' + k.body() + '\n';
  append_signature(key, k.inputs(), k.output());
  for (bool array : is_array) key += array ? 'a' : 's';
  return key + '@' + std::to_string(ordinal);
}

std::string memo_key(const raw_kernel& k, int ordinal) {
  std::string key = "raw\n" + k.entry() + '\n' + k.source() + '\n';
  append_signature(key, k.inputs(), k.output());
  key += std::to_string(k.shape().block) + 'x' + std::to_string(k.shape().grid);
  return key + '@' + std::to_string(ordinal);
}

}  // namespace

std::vector<void*> prepared_call::launch_args(void* out, std::size_t offset) const {
  std::vector<void*> args(operands.size() + 1);
  for (std::size_t i = 0; i < operands.size(); ++i) {
    const user_operand& in = operands[i];
    // Backends only read through these pointers.
    args[i] = in.is_array
                  ? static_cast<void*>(const_cast<char*>(in.data) + offset * in.element_size)
                  : static_cast<void*>(const_cast<unsigned char*>(in.scalar));
  }
  args[operands.size()] = out;
  return args;
}

void prepared_call::append_row(std::vector<std::uint64_t>& table, void* out,
                               std::size_t count) const {
  for (const user_operand& in : operands) {
    std::uint64_t slot = 0;
    if (in.is_array)
      slot = reinterpret_cast<std::uintptr_t>(in.data);
    else
      std::memcpy(&slot, in.scalar, sizeof slot);
    table.push_back(slot);
  }
  table.push_back(reinterpret_cast<std::uintptr_t>(out));
  table.push_back(count);
}

void backend_stream::launch_compiled_batch(const compiled_kernel& k, const std::uint64_t* table,
                                           std::size_t rows) {
  const std::vector<bool>& is_array = k.is_array();
  const std::size_t stride = is_array.size() + 2;
  std::vector<void*> args(is_array.size() + 1);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::uint64_t* row = table + r * stride;
    for (std::size_t i = 0; i < is_array.size(); ++i)
      args[i] = is_array[i] ? reinterpret_cast<void*>(static_cast<std::uintptr_t>(row[i]))
                            : const_cast<std::uint64_t*>(row + i);
    args[is_array.size()] =
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(row[is_array.size()]));
    const std::uint64_t count = row[is_array.size() + 1];
    if (count > 0) launch_compiled(k, args.data(), static_cast<std::size_t>(count));
  }
}

void prepare_call_into(prepared_call& call, const elementwise_kernel& k,
                       const std::vector<kernel_argument>& inputs, dtype out_type,
                       std::size_t count) {
  prepare(call, k.name(), k.inputs(), k.output(), false, inputs, out_type, count);
}

void prepare_call_into(prepared_call& call, const raw_kernel& k,
                       const std::vector<kernel_argument>& inputs, dtype out_type,
                       std::size_t count) {
  prepare(call, k.name(), k.inputs(), k.output(), true, inputs, out_type, count);
}

prepared_call prepare_call(const elementwise_kernel& k, const std::vector<kernel_argument>& inputs,
                           dtype out_type, std::size_t count) {
  prepared_call call;
  prepare_call_into(call, k, inputs, out_type, count);
  return call;
}

prepared_call prepare_call(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                           dtype out_type, std::size_t count) {
  prepared_call call;
  prepare_call_into(call, k, inputs, out_type, count);
  return call;
}

std::shared_ptr<const compiled_kernel> compile_for(backend& b, const elementwise_kernel& k,
                                                   const prepared_call& call, int ordinal) {
  return b.compiled().get(memo_key(k, call.is_array, ordinal),
                          [&] { return b.compile(k, call.is_array, ordinal); });
}

std::shared_ptr<const compiled_kernel> compile_for(backend& b, const raw_kernel& k,
                                                   const prepared_call& /*call*/, int ordinal) {
  return b.compiled().get(memo_key(k, ordinal), [&] { return b.compile(k, ordinal); });
}

}  // namespace gpupool::detail
