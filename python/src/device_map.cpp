// A compiled kernel over many calls whose arrays live on GPUs (see device_map.hpp).
#include "device_map.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "cupy_arrays.hpp"
#include "errors.hpp"
#include "futures.hpp"
#include "write_hazards.hpp"

namespace gpupool_python {
namespace {

// The first block of a map's calls; each next block twice as many, up to the largest.
constexpr std::size_t first_device_block = 64;
// Blocks that kept doubling left half of a map's calls to the last block, queued only once
// every call had been read: with `out`, where reading is all the host does, that left the GPU
// waiting for the host through the first half and the host for the GPU through the second.
// At 256 calls, the GPU runs the calls read so far while the next block is read, and the
// extra blocks (a stream check and a buffer each) cost microseconds.
constexpr std::size_t largest_device_block = 256;

// `message` with " (call c)" after it, unless it already names call c.
std::string numbered(const std::string& message, std::size_t c) {
  const std::string name = "call " + std::to_string(c);
  const auto at = message.find(name);
  const bool names_it = at != std::string::npos &&
                        (at + name.size() == message.size() ||
                         !std::isdigit(static_cast<unsigned char>(message[at + name.size()])));
  return names_it ? message : message + " (" + name + ")";
}

// `failure` again, of the same kind (TypeError, ValueError, OverflowError, ...), with
// `message_for(its message)` as its message; a failure of any other kind as it came.
template <class Message>
[[noreturn]] void rethrow_reworded(const std::exception_ptr& failure, const Message& message_for) {
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

gpupool::kernel_argument device_argument(std::uintptr_t address, std::size_t count,
                                         gpupool::dtype t) {
  return gpupool::visit_dtype(t, [&]<class T>() {
    return gpupool::kernel_argument(std::span<const T>(reinterpret_cast<const T*>(address), count));
  });
}

// One call as read: the work queued for it, and what its output is made from.
struct described_call {
  gpupool::device_call work;
  nb::object anchor;  // the call's first array
  int ordinal = -1;
  nb::object shape;
  nb::object output;  // the array given for it in `out`
};

// One device array as read: address, element count, type, ordinal, shape (invalid where the
// reading does not say: one dimension).
using array_reading = std::tuple<std::uintptr_t, std::size_t, gpupool::dtype, int, nb::object>;

// Reads a map's calls one at a time into described_calls, checking each against the kernel,
// against the first call's pattern of arrays and numbers and, with `out`, against what the
// other calls read and write.
template <class K>
class call_reader {
 public:
  call_reader(const K& k, nb::sequence calls, nb::handle cupy_ndarray, nb::callable describe_other,
              nb::object out)
      : k_(k),
        calls_(std::move(calls)),
        cupy_ndarray_(cupy_ndarray.is_valid() && !cupy_ndarray.is_none() ? cupy_ndarray
                                                                         : nb::handle()),
        describe_other_(std::move(describe_other)),
        out_(std::move(out)),
        given_outputs_(out_.is_valid() && !out_.is_none()),
        last_number_(k.inputs().size()),
        last_number_argument_(k.inputs().size()) {}

  [[nodiscard]] bool given_outputs() const { return given_outputs_; }

  // Reads call `c` into `d`. Its refusals all name the call (some say only which argument was
  // wrong): by the time a later block is read, earlier ones run, so the number is what tells.
  void read(std::size_t c, described_call& d) {
    try {
      describe(c, d);
    } catch (...) {
      rethrow_reworded(std::current_exception(),
                       [c](const std::string& message) { return numbered(message, c); });
    }
  }

 private:
  // CuPy arrays, the common case, are read through CuPy's own attributes (describe_cupy).
  bool is_cupy(nb::handle a) const {
    return cupy_ndarray_.is_valid() && a.type().is(cupy_ndarray_);
  }

  // A device array other than a CuPy array, through describe_other.
  array_reading read_other(nb::handle a, const std::string& where) const {
    auto [address, count, name, ordinal, shape] =
        nb::cast<std::tuple<std::uintptr_t, std::size_t, std::string, int, nb::object>>(
            describe_other_(a, where));
    return {address, count, dtype_from_name(name), ordinal, std::move(shape)};
  }

  // Call `c`'s array in `out`, checked against the call (whose inputs `d` holds) and against
  // what the map's other calls read and write.
  void read_output(std::size_t c, described_call& d) {
    const auto where = [&] { return "call " + std::to_string(c) + "'s output"; };
    nb::object o = out_[c];
    std::uintptr_t address = 0;
    std::size_t count = 0;
    gpupool::dtype type{};
    int ordinal = -1;
    if (is_cupy(o)) {
      const cupy_array_view view = describe_cupy(o, where);
      std::tie(address, count, type, ordinal) =
          std::make_tuple(view.address, view.count, view.type, view.ordinal);
    } else {
      std::tie(address, count, type, ordinal, std::ignore) = read_other(o, where());
    }
    if (type != k_.output().type)
      throw nb::type_error(("gpupool: " + where() + " is " + gpupool::to_string(type) +
                            "; kernel '" + k_.name() + "' writes " +
                            gpupool::to_string(k_.output().type))
                               .c_str());
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
    if (auto problem = hazards_.add_output(address, address + count * gpupool::size_of(type), c))
      throw nb::value_error(("gpupool: call " + std::to_string(c) + " " + *problem).c_str());
    d.work.out = reinterpret_cast<void*>(address);
    d.output = std::move(o);
  }

  // Argument `i` of call `c`: a number (pushed to `d`'s inputs; nothing returned) or a device
  // array (its reading).
  std::optional<array_reading> read_argument(std::size_t c, std::size_t i, nb::handle a,
                                             described_call& d) {
    // Named only in a refusal: thousands of arrays pass through here per map.
    const auto where = [&] {
      return "call " + std::to_string(c) + " argument " + std::to_string(i);
    };
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
      d.work.inputs.push_back(scalar_argument(*number, k_.inputs()[i].type,
                                              "argument[" + std::to_string(i) + "] ('" +
                                                  k_.inputs()[i].name + "') of kernel '" +
                                                  k_.name() + "'"));
      last_number_[i] = nb::borrow(a);
      last_number_argument_[i] = d.work.inputs.back();
      return std::nullopt;
    }
    return read_other(a, where());
  }

  void describe(std::size_t c, described_call& d) {
    const std::size_t arity = k_.inputs().size();
    nb::object args = calls_[c];
    const std::size_t given = nb::len(args);
    if (given != arity)
      throw nb::type_error(("gpupool: kernel '" + k_.name() + "' takes " + std::to_string(arity) +
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
          ("gpupool: call " + std::to_string(c) + " of kernel '" + k_.name() + "' has no array")
              .c_str());
    if (given_outputs_) read_output(c, d);
    // One compiled kernel serves the whole map, as in map_on_device, across blocks too.
    if (c == 0) {
      for (const auto& in : d.work.inputs) first_pattern_.push_back(in.is_array());
      return;
    }
    for (std::size_t i = 0; i < arity; ++i)
      if (d.work.inputs[i].is_array() != first_pattern_[i])
        throw nb::value_error(("gpupool: kernel '" + k_.name() +
                               "': the call mixes arrays and scalars differently from the "
                               "first call; pass each pattern in its own map (call " +
                               std::to_string(c) + ")")
                                  .c_str());
  }

  const K& k_;
  nb::sequence calls_;
  nb::handle cupy_ndarray_;  // invalid where CuPy is not imported
  nb::callable describe_other_;
  nb::object out_;
  bool given_outputs_;
  write_hazards hazards_;  // with `out`: what the calls read and write so far
  std::vector<nb::object> last_number_;
  std::vector<std::optional<gpupool::kernel_argument>> last_number_argument_;
  std::vector<bool> first_pattern_;  // which of call 0's arguments are arrays
};

// One device's calls of one block: their outputs are consecutive in one flat buffer.
struct group {
  int ordinal = 0;
  std::vector<std::size_t> members;  // call indices, in call order
  nb::object flat;
  std::vector<std::size_t> ends;  // each member's end in `flat`, in elements
};

// The views of group `g`'s calls, in member order, made by one call of `split_flat` (CuPy's
// array_split makes each in a fraction of what a slice through __getitem__ takes).
std::vector<nb::object> views_of(const group& g, const std::vector<described_call>& described,
                                 const nb::callable& split_flat) {
  nb::list ends;
  for (std::size_t end : g.ends) ends.append(end);
  nb::object pieces = split_flat(g.flat, ends);
  if (nb::len(pieces) < g.members.size())
    throw std::runtime_error("gpupool: split_flat gave fewer views than calls");
  std::vector<nb::object> views(g.members.size());
  for (std::size_t m = 0; m < views.size(); ++m) {
    views[m] = pieces[m];
    const nb::object& shape = described[g.members[m]].shape;  // invalid: one dimension
    if (shape.is_valid() && nb::len(shape) > 1) views[m] = views[m].attr("reshape")(shape);
  }
  return views;
}

// Adds calls [begin, end) to new groups by device (empty arrays may not know theirs: they join
// GPU 0), in first-seen order.
void group_by_device(std::size_t begin, std::size_t end,
                     const std::vector<described_call>& described, std::vector<group>& groups) {
  const auto first_group = static_cast<std::ptrdiff_t>(groups.size());
  for (std::size_t c = begin; c < end; ++c) {
    const int ordinal = std::max(described[c].ordinal, 0);
    auto it = std::find_if(groups.begin() + first_group, groups.end(),
                           [&](const group& g) { return g.ordinal == ordinal; });
    if (it == groups.end()) {
      groups.push_back({ordinal, {}, {}, {}});
      it = std::prev(groups.end());
    }
    it->members.push_back(c);
  }
}

}  // namespace

int device_of_ordinal(const gpupool::executor& ex, int ordinal) {
  // Devices of one GPU (its ordinal listed more than once) take turns, one per block of calls,
  // so that work over its arrays spreads over all of them; any of them is correct. Those still
  // in service are preferred: a device taken out of service refuses work its twins could run.
  static std::atomic<unsigned> turn{0};
  const auto& devices = ex.devices();
  int first = -1;
  unsigned serving = 0;
  for (const auto& d : devices)
    if (d.ordinal == ordinal) {
      if (first < 0) first = d.id;
      if (ex.in_service(d.id)) ++serving;
    }
  if (serving > 0) {
    unsigned skip = serving == 1 ? 0 : turn.fetch_add(1, std::memory_order_relaxed) % serving;
    for (const auto& d : devices)
      if (d.ordinal == ordinal && ex.in_service(d.id) && skip-- == 0) return d.id;
  }
  // None in service (or the last one left meanwhile): its refusal names the fault.
  if (first >= 0) return first;
  throw nb::value_error(("gpupool: the array lives on GPU " + std::to_string(ordinal) +
                         ", which this executor does not use")
                            .c_str());
}

template <class K>
nb::tuple map_device_calls(gpupool::executor& ex, const K& k, nb::sequence calls,
                           nb::handle cupy_ndarray, nb::callable describe_other,
                           nb::callable allocate_flat, nb::callable split_flat,
                           nb::callable before_launch, nb::object keep_alive,
                           nb::handle future_type, bool single, nb::object out,
                           const gpupool::task_options& options) {
  const std::size_t n = nb::len(calls);
  if (single && n != 1) throw nb::value_error("gpupool: single needs exactly one call");
  const bool given_outputs = out.is_valid() && !out.is_none();
  if (given_outputs && single) throw nb::value_error("gpupool: out is for maps, not single");
  if (given_outputs && nb::len(out) != n)
    throw nb::value_error(("gpupool: out has " + std::to_string(nb::len(out)) + " array(s) for " +
                           std::to_string(n) + " call(s)")
                              .c_str());
  call_reader<K> reader(k, calls, cupy_ndarray, std::move(describe_other), out);
  std::vector<described_call> described(n);

  const auto out_type = k.output().type;
  const std::string out_name = gpupool::to_string(out_type);
  const std::size_t itemsize = gpupool::size_of(out_type);
  std::vector<group> groups;
  nb::list held_flats;  // kept with `keep_alive` until the batches end
  nb::object held = nb::make_tuple(keep_alive, held_flats, out);
  std::vector<gpupool::future<void>> queued;  // one per group
  std::vector<nb::object> outputs(n);
  // Group `gr`'s calls, given their outputs: the arrays of `out`, or consecutive pieces of one
  // new buffer.
  const auto work_of = [&](group& gr) {
    std::vector<gpupool::device_call> work;
    work.reserve(gr.members.size());
    if (given_outputs) {
      for (std::size_t c : gr.members) {
        outputs[c] = std::move(described[c].output);
        work.push_back(std::move(described[c].work));
      }
      return work;
    }
    std::size_t total = 0;
    for (std::size_t c : gr.members) total += described[c].work.count;
    auto [flat, base] = nb::cast<std::tuple<nb::object, std::uintptr_t>>(
        allocate_flat(described[gr.members.front()].anchor, gr.ordinal,
                      std::max<std::size_t>(total, 1), out_name));
    held_flats.append(flat);
    gr.flat = std::move(flat);
    gr.ends.reserve(gr.members.size());
    std::size_t offset = 0;
    for (std::size_t c : gr.members) {
      auto& d = described[c];
      d.work.out = reinterpret_cast<void*>(base + offset * itemsize);
      offset += d.work.count;
      gr.ends.push_back(offset);
      work.push_back(std::move(d.work));
    }
    return work;
  };
  // Queues group `g`'s work on its device; a refusal names the call by its place among all.
  const auto queue_group = [&](const group& g, const std::vector<gpupool::device_call>& work) {
    const int device = device_of_ordinal(ex, g.ordinal);
    try {
      nb::gil_scoped_release nogil;
      queued.push_back(ex.map_on_device(device, k, work, options));
    } catch (const gpupool::call_error& e) {
      // Numbered within its group: named here by its place among all the calls, as the error
      // the check made (a number out of range stays an OverflowError, say).
      const std::string message =
          e.reason() + " (call " + std::to_string(g.members.at(e.call())) + ")";
      const auto* nested = dynamic_cast<const std::nested_exception*>(&e);
      rethrow_reworded(nested != nullptr && nested->nested_ptr() ? nested->nested_ptr()
                                                                 : std::current_exception(),
                       [&](const std::string&) { return message; });
    }
  };

  try {
    for (std::size_t begin = 0, size = first_device_block; begin < n;
         begin += size, size = std::min(size * 2, largest_device_block)) {
      const std::size_t end = std::min(n, begin + size);
      for (std::size_t c = begin; c < end; ++c) reader.read(c, described[c]);
      const std::size_t first_group = groups.size();
      group_by_device(begin, end, described, groups);
      std::vector<std::vector<gpupool::device_call>> work;
      work.reserve(groups.size() - first_group);
      for (std::size_t g = first_group; g < groups.size(); ++g) work.push_back(work_of(groups[g]));
      if (single)
        outputs.front() =
            views_of(groups.front(), described, split_flat).front();  // before it ends
      before_launch();
      queued.reserve(queued.size() + (groups.size() - first_group));  // no throw once queued
      for (std::size_t g = first_group; g < groups.size(); ++g)
        queue_group(groups[g], work[g - first_group]);
    }
    // Everything is queued before the output views are made (CuPy takes microseconds for
    // each), so that the GPUs compute meanwhile.
    if (!single && !given_outputs)
      for (const group& g : groups) {
        std::vector<nb::object> views = views_of(g, described, split_flat);
        for (std::size_t m = 0; m < views.size(); ++m) outputs[g.members[m]] = std::move(views[m]);
      }
    nb::list all;
    for (auto& o : outputs) all.append(o);
    nb::object result = single ? outputs.front() : nb::object(all);
    nb::list futures;
    futures.append(adopt_kernel_tasks(queued, future_type, std::move(result), held));
    return nb::make_tuple(all, futures);
  } catch (...) {
    // Nothing of this map runs on once it has raised: what was queued is cancelled where it
    // has not started, and what started is waited for here (it writes into `held`'s
    // buffers). Only the error path waits.
    for (auto& f : queued) (void)f.cancel();
    {
      nb::gil_scoped_release nogil;
      for (auto& f : queued) f.wait();
    }
    throw;
  }
}

template nb::tuple map_device_calls<gpupool::elementwise_kernel>(
    gpupool::executor&, const gpupool::elementwise_kernel&, nb::sequence, nb::handle, nb::callable,
    nb::callable, nb::callable, nb::callable, nb::object, nb::handle, bool, nb::object,
    const gpupool::task_options&);
template nb::tuple map_device_calls<gpupool::raw_kernel>(gpupool::executor&,
                                                         const gpupool::raw_kernel&, nb::sequence,
                                                         nb::handle, nb::callable, nb::callable,
                                                         nb::callable, nb::callable, nb::object,
                                                         nb::handle, bool, nb::object,
                                                         const gpupool::task_options&);

}  // namespace gpupool_python
