// Executor: the C++ executor behind gpupool.Executor (whose concurrent.futures semantics live in
// python/gpupool/_executor.py): Python calls on lanes, kernels over host and device arrays.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "common.hpp"
#include "device_map.hpp"
#include "errors.hpp"
#include "futures.hpp"
#include "gpupool/gpupool.hpp"
#include "kernel_map.hpp"
#include "kernels.hpp"
#include "lane.hpp"
#include "python_calls.hpp"
#include "reports.hpp"

namespace gpupool_python {
namespace {

// Executors whose last reference died inside one of their own tasks are stopped by a thread of
// their own (a lane cannot wait for itself). Those threads, and the lanes they stop, may still
// release Python objects; the interpreter's exit waits for them (join_orphaned_executors, called
// before finalization) so that none reaches for Python once it is finalizing. Leaked on purpose:
// a detached thread may outlive static destruction.
struct orphaned_executors {
  std::mutex mutex;
  std::condition_variable stopped;
  int stopping = 0;
};
orphaned_executors& orphans() {
  static auto* const state = new orphaned_executors;
  return *state;
}

class py_executor {
 public:
  explicit py_executor(const gpupool::executor_options& options) {
    {
      nb::gil_scoped_release nogil;
      executor_ = std::make_unique<gpupool::executor>(options);
    }
    python_calls_ = make_python_calls(executor_->devices().size());
  }
  py_executor(const py_executor&) = delete;
  py_executor& operator=(const py_executor&) = delete;
  ~py_executor() {
    if (executor_ && executor_->is_lane_thread()) {
      // The last reference died inside one of its own tasks: a lane cannot wait for itself,
      // so another thread drains and stops the executor.
      {
        std::lock_guard lock(orphans().mutex);
        ++orphans().stopping;
      }
      std::thread([e = std::move(executor_)]() mutable {
        e.reset();
        std::lock_guard lock(orphans().mutex);
        --orphans().stopping;
        orphans().stopped.notify_all();
      }).detach();
      return;
    }
    // Draining may need the GIL (queued Python tasks): let the lanes have it.
    nb::gil_scoped_release nogil;
    executor_.reset();
  }

  gpupool::executor& get() const {
    if (!executor_) throw std::runtime_error("gpupool: the executor is closed");
    return *executor_;
  }

  // Queues fn(*args, **kwargs) on a lane (of `device`, if given); `future`, a
  // concurrent.futures.Future, gets its outcome (see submit_python_call).
  void submit_call(nb::handle fn, nb::handle args, nb::handle kwargs, nb::handle future,
                   std::optional<int> device, std::optional<int> priority) {
    submit_python_call(get(), device, fn, args, kwargs, future, runner_, python_calls_,
                       gpupool::task_options{priority});
  }

  // Queues fn(*args) for each tuple of `calls` on any lane, in order, `futures[i]` getting the
  // outcome of call i: Executor.map's Python calls, many in one call from Python. Runs no Python
  // code (the futures are made by the caller, outside its lock). If one is refused, the error
  // is raised and the calls before it stay queued: the caller cancels them.
  void submit_calls(nb::handle fn, nb::list calls, nb::list futures, std::optional<int> priority) {
    gpupool::executor& exec = get();
    const gpupool::task_options options{priority};
    const std::size_t n = nb::len(calls);
    if (nb::len(futures) != n) throw nb::value_error("gpupool: one future per call");
    for (std::size_t i = 0; i < n; ++i) {
      PyObject* args = PyList_GET_ITEM(calls.ptr(), static_cast<Py_ssize_t>(i));
      if (!PyTuple_Check(args)) throw nb::type_error("gpupool: each call is a tuple");
      submit_python_call(exec, std::nullopt, fn, args, nb::handle(),
                         PyList_GET_ITEM(futures.ptr(), static_cast<Py_ssize_t>(i)), runner_,
                         python_calls_, options);
    }
  }

  // What CUDA lanes call as runner(fn, args, kwargs) instead of fn (None: fn itself).
  void set_runner(nb::object runner) { runner_ = std::move(runner); }

  // A built-in kernel over each host array (pair): one future (of `future_type`) per array,
  // whose result is a new NumPy array in pinned memory, or with `outs`, the array given for that
  // call, which the call writes. Every array is checked first.
  nb::list map_kernel(nb::pointer_and_handle<gpupool::builtin_kernel> kernel, nb::sequence xs,
                      std::optional<nb::sequence> ys, nb::handle future_type,
                      std::optional<int> priority, std::optional<nb::sequence> outs) {
    const gpupool::builtin_kernel& k = *kernel.p;
    const gpupool::task_options options{priority};
    std::vector<checked_kernel_call> calls = check_kernel_inputs(kernel.h, k, xs, ys);
    std::vector<host_array> given;     // per call, with `outs`: the output it writes
    std::vector<nb::object> given_as;  // and the object it came from, the call's result
    if (outs) {
      if (nb::len(*outs) != calls.size())
        throw nb::value_error(("gpupool: " + std::to_string(nb::len(*outs)) + " outputs for " +
                               std::to_string(calls.size()) + " calls")
                                  .c_str());
      given.reserve(calls.size());
      given_as.reserve(calls.size());
      for (std::size_t i = 0; i < calls.size(); ++i) {
        given_as.push_back((*outs)[i]);
        given.push_back(read_output_array(given_as.back(), calls[i], i));
      }
    }
    nb::list out;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      if (outs)
        out.append(queue_kernel_call(k, calls[i], future_type, options, &given[i],
                                     std::move(given_as[i])));
      else
        out.append(queue_kernel_call(k, calls[i], future_type, options));
    }
    return out;
  }

  // `Executor.submit(kernel, x[, y])` without `out=`: map_kernel's work for one call, with no
  // list in or out.
  nb::object submit_kernel(nb::pointer_and_handle<gpupool::builtin_kernel> kernel, nb::handle x,
                           nb::handle y, nb::handle future_type, std::optional<int> priority) {
    const gpupool::builtin_kernel& k = *kernel.p;
    if ((k.arity() == 2) != !y.is_none())
      throw nb::type_error(("gpupool: kernel '" + std::string(k.name()) + "' takes " +
                            std::to_string(k.arity()) + " array(s)")
                               .c_str());
    std::vector<gpupool::dtype> alpha_checked;
    checked_kernel_call call =
        check_kernel_call(kernel.h, k, x, y.is_none() ? nb::handle() : y, 0, alpha_checked);
    return queue_kernel_call(k, call, future_type, gpupool::task_options{priority});
  }

  // A built-in kernel over each host array (pair), for Executor.map: the results in order,
  // without a Python future per call, queued as far ahead as `window_calls` and `window_bytes`
  // allow (see kernel_map). With `lazy`, `xs` and `ys` are iterables read as the window has room.
  kernel_map* map_kernel_results(nb::pointer_and_handle<gpupool::builtin_kernel> kernel,
                                 nb::object xs, std::optional<nb::object> ys,
                                 std::optional<double> timeout, std::size_t window_calls,
                                 std::size_t window_bytes, bool lazy, std::optional<int> priority) {
    return new kernel_map(get(), kernel.h, *kernel.p, std::move(xs), std::move(ys), timeout,
                          map_window{window_calls, window_bytes}, lazy,
                          gpupool::task_options{priority});
  }

  // A compiled kernel (elementwise or raw) over host arrays and numbers: one future (of
  // `future_type`), whose result is a new array in pinned memory shaped like the first array
  // argument.
  template <class K>
  nb::object launch_compiled(const K& k, nb::sequence args, nb::handle future_type,
                             std::optional<int> priority) {
    const gpupool::task_options options{priority};
    const std::size_t n = nb::len(args);
    if (n != k.inputs().size())
      throw nb::type_error(("gpupool: kernel '" + k.name() + "' takes " +
                            std::to_string(k.inputs().size()) + " argument(s), " +
                            std::to_string(n) + " given")
                               .c_str());
    std::vector<gpupool::kernel_argument> arguments;
    std::vector<input_array> arrays;  // keeps the array views while the arguments point in
    arrays.reserve(n);
    const input_array* first = nullptr;
    for (std::size_t i = 0; i < n; ++i) {
      nb::handle a = args[i];
      const std::string& name = k.inputs()[i].name;
      if (auto number = as_number(a)) {
        arguments.push_back(scalar_argument(
            *number, k.inputs()[i].type,
            "argument[" + std::to_string(i) + "] ('" + name + "') of kernel '" + k.name() + "'"));
      } else {
        arrays.push_back(as_input(a, i, "argument", name));
        const input_array& view = arrays.back();
        if (first == nullptr) first = &view;
        arguments.push_back(argument_of(view, name));
      }
    }
    if (first == nullptr)
      throw nb::type_error(
          ("gpupool: pass at least one array to kernel '" + k.name() + "'").c_str());
    const std::size_t count = first->size();
    const auto out_type = k.output().type;
    auto result = std::make_unique<pinned_block>(count * gpupool::size_of(out_type));
    gpupool::future<void> f;
    {
      nb::gil_scoped_release nogil;  // compiling can take a while
      if constexpr (std::is_same_v<K, gpupool::raw_kernel>)
        f = get().launch_raw(k, arguments, out_type, result->data(), count, options);
      else
        f = get().launch_elementwise(k, arguments, out_type, result->data(), count, options);
    }
    std::vector<std::size_t> shape = shape_of(*first);
    std::vector<host_array> held;
    held.reserve(arrays.size());
    for (input_array& a : arrays) held.emplace_back(std::move(a));
    return adopt_kernel_task(
        std::move(f), future_type, std::move(held),
        pinned_result{std::move(result), dlpack_of(out_type), std::move(shape)});
  }

  // A compiled kernel over many calls whose arrays live on GPUs, as a run Python drives (see
  // device_map.hpp).
  template <class K>
  std::unique_ptr<device_map_run> map_device_calls(const K& k, nb::sequence calls,
                                                   nb::handle cupy_ndarray, nb::object out,
                                                   bool out_is_one_array, bool single,
                                                   std::optional<int> priority,
                                                   nb::object keep_alive, nb::handle future_type,
                                                   std::vector<std::uintptr_t> wait_streams) {
    return gpupool_python::map_device_calls(get(), k, std::move(calls), cupy_ndarray,
                                            std::move(out), out_is_one_array, single,
                                            gpupool::task_options{priority}, std::move(keep_alive),
                                            future_type, std::move(wait_streams));
  }

  // Runs a built-in kernel over arrays already on GPU `ordinal`, on a lane of that device:
  // out = k(x[, y]), `count` elements of `type`. No host copy is made.
  // One future (of `future_type`) whose result is `result`; `keep_alive` is held until the
  // task has ended.
  nb::object launch_device(nb::pointer_and_handle<gpupool::builtin_kernel> kernel, std::uintptr_t x,
                           std::uintptr_t y, std::uintptr_t out, std::size_t count,
                           const std::string& type, int ordinal, nb::object result,
                           nb::object keep_alive, nb::handle future_type,
                           std::optional<int> priority) {
    const int device = device_of_ordinal(get(), ordinal);
    const gpupool::builtin_kernel k = *kernel.p;  // copied into the task
    if (k.arity() == 2 && y == 0) throw nb::value_error("gpupool: this kernel takes two arrays");
    const gpupool::dtype t = dtype_from_name(type);
    check_alpha(kernel.h, k, t, "the device array");
    auto f = get().submit_to(device, gpupool::task_options{priority}, [=](gpupool::lane& l) {
      l.apply_bytes(k, t, reinterpret_cast<const void*>(x), reinterpret_cast<const void*>(y),
                    reinterpret_cast<void*>(out), count);
    });
    return adopt_kernel_task(std::move(f), future_type, {}, std::nullopt, std::move(result),
                             std::move(keep_alive));
  }

  void shutdown(bool cancel_pending) {
    if (executor_ && executor_->is_lane_thread())
      throw nb::value_error("gpupool: an executor cannot be shut down by its own tasks");
    if (cancel_pending && python_calls_) stop_running_python_calls(*python_calls_);
    nb::gil_scoped_release nogil;
    if (executor_) executor_->shutdown(cancel_pending);
  }

 private:
  // Queues one checked call of `k` (its arrays move into the future, which holds them until the
  // call ends) and returns its future: the result a new NumPy array in pinned memory, or with
  // `given`, that output array (`given_as`, the object it came from), which the call writes.
  nb::object queue_kernel_call(const gpupool::builtin_kernel& k, checked_kernel_call& in,
                               nb::handle future_type, const gpupool::task_options& options,
                               host_array* given = nullptr, nb::object given_as = {}) {
    const host_array& x = in.x;
    std::unique_ptr<pinned_block> result;
    void* destination;
    if (given != nullptr) {
      // Checked writable (read_output_array); held with the inputs until the call ends.
      destination = const_cast<void*>(given->data());
    } else {
      result = std::make_unique<pinned_block>(x.nbytes());
      destination = result->data();
    }
    const gpupool::transform_call call{x.data(), in.y ? in.y->data() : nullptr, destination,
                                       x.size()};
    const std::span<const gpupool::transform_call> one(&call, 1);
    // Queued with the GIL held when there is room in the in-flight budget now: letting the GIL
    // go for every submit would hand it to whichever lane is waiting to hand results over, and
    // take it back, once per task. Otherwise queueing may wait for room, which only completions
    // free, and handing those over takes the GIL: it is let go meanwhile.
    auto queued = get().try_transform_each(k, in.type, one, options);
    if (!queued) {
      nb::gil_scoped_release nogil;
      queued = get().transform_each(k, in.type, one, options);
    }
    gpupool::future<void> f = std::move(queued->front());
    const gpupool::future<void> task = f;  // a handle on the same task
    try {
      std::vector<host_array> held;
      held.push_back(std::move(in.x));
      if (in.y) held.push_back(std::move(*in.y));
      if (given != nullptr) {
        held.push_back(std::move(*given));
        return adopt_kernel_task(std::move(f), future_type, std::move(held), std::nullopt,
                                 std::move(given_as));
      }
      pinned_result pinned{std::move(result), held.front().dtype(), held.front().shape()};
      return adopt_kernel_task(std::move(f), future_type, std::move(held), std::move(pinned));
    } catch (...) {
      // Queued, but no future holds its arrays: it must not run on (or go on writing) once the
      // caller has the error and may let them go.
      gpupool::future<void> ending = task;
      (void)ending.cancel();
      nb::gil_scoped_release nogil;
      ending.wait();
      throw;
    }
  }

  std::unique_ptr<gpupool::executor> executor_;
  nb::object runner_;
  std::shared_ptr<python_calls> python_calls_;

 public:
  void wait_for_surplus_tasks() const { wait_for_surplus_python_tasks(*python_calls_); }
  // Tracing on: each Python call's task runs that call alone, so that its record is the call's.
  void set_tracing(bool on) {
    get().set_tracing(on);
    chain_python_calls(*python_calls_, !on);
  }
};

}  // namespace

void bind_executor(nb::module_& m) {
  using namespace nb::literals;
  // The options are bound once, as the C++ struct: a default ExecutorOptions() carries the
  // defaults of include/gpupool/options.hpp, which gpupool.Executor's signature reads.
  nb::class_<gpupool::executor_options>(
      m, "ExecutorOptions",
      "gpupool::executor_options (include/gpupool/options.hpp); a new one holds the defaults.")
      .def(nb::init<>())
      .def_prop_rw(
          "backend",
          [](const gpupool::executor_options& o) -> std::optional<std::string> {
            if (!o.backend) return std::nullopt;
            return std::string(gpupool::to_string(*o.backend));
          },
          [](gpupool::executor_options& o, std::optional<std::string> backend) {
            if (!backend) {
              o.backend.reset();
              return;
            }
            o.backend = gpupool::backend_from_name(*backend);
            if (o.backend) return;
            std::string known;
            for (const auto& b : gpupool::backend_names)
              known += std::string(known.empty() ? "'" : ", '") + b.name + "'";
            throw nb::value_error(
                ("gpupool: backend must be one of " + known + ", not '" + *backend + "'").c_str());
          },
          nb::arg("backend").none())
      .def_rw("devices", &gpupool::executor_options::devices)
      .def_rw("lanes_per_device", &gpupool::executor_options::lanes_per_device)
      .def_rw("slots_per_lane", &gpupool::executor_options::slots_per_lane)
      .def_rw("chunk_bytes", &gpupool::executor_options::chunk_bytes)
      .def_rw("device_memory_budget", &gpupool::executor_options::device_memory_budget)
      .def_rw("in_flight_budget", &gpupool::executor_options::in_flight_budget)
      .def_prop_rw(
          "when_full",
          [](const gpupool::executor_options& o) -> std::string {
            return gpupool::to_string(o.when_full);
          },
          [](gpupool::executor_options& o, const std::string& mode) {
            if (auto w = gpupool::when_full_from_name(mode))
              o.when_full = *w;
            else
              throw nb::value_error(
                  ("gpupool: when_full must be 'block' or 'raise', not '" + mode + "'").c_str());
          })
      .def_prop_rw(
          "tuning",
          [](const gpupool::executor_options& o) -> std::string {
            return gpupool::to_string(o.tuning);
          },
          [](gpupool::executor_options& o, const std::string& mode) {
            if (auto t = gpupool::tuning_from_name(mode)) {
              o.tuning = *t;
              return;
            }
            throw nb::value_error(("gpupool: tuning must be 'auto', 'measured', 'remeasure' or "
                                   "'fixed', not '" +
                                   mode.substr(0, 64) + "'")
                                      .c_str());
          })
      .def_rw("cpu_devices", &gpupool::executor_options::cpu_devices)
      .def_rw("cpu_copy_rate", &gpupool::executor_options::cpu_copy_rate)
      .def_rw("priority", &gpupool::executor_options::priority)
      .def_rw("host_lanes", &gpupool::executor_options::host_lanes)
      .def_rw("quiet", &gpupool::executor_options::quiet);

  bind_device_map(m);  // DeviceMapRun, which map_device_calls returns
  nb::class_<py_executor>(m, "Executor")
      .def(nb::init<const gpupool::executor_options&>(), "options"_a)
      .def("submit_call", &py_executor::submit_call, "fn"_a, "args"_a, "kwargs"_a.none(),
           "future"_a, "device"_a.none(), "priority"_a = nb::none())
      .def("submit_calls", &py_executor::submit_calls, "fn"_a, "calls"_a, "futures"_a,
           "priority"_a = nb::none())
      .def("set_runner", &py_executor::set_runner, "runner"_a.none())
      .def("map_kernel", &py_executor::map_kernel, "kernel"_a, "xs"_a, "ys"_a.none(),
           "future_type"_a, "priority"_a = nb::none(), "outs"_a = nb::none())
      .def("submit_kernel", &py_executor::submit_kernel, "kernel"_a, "x"_a, "y"_a.none(),
           "future_type"_a, "priority"_a = nb::none())
      .def("map_kernel_results", &py_executor::map_kernel_results, "kernel"_a, "xs"_a,
           "ys"_a.none(), "timeout"_a.none(), "window_calls"_a, "window_bytes"_a, "lazy"_a,
           "priority"_a = nb::none(), nb::rv_policy::take_ownership)
      .def("launch_compiled", &py_executor::launch_compiled<gpupool::elementwise_kernel>,
           "kernel"_a, "args"_a, "future_type"_a, "priority"_a = nb::none())
      .def("launch_compiled", &py_executor::launch_compiled<gpupool::raw_kernel>, "kernel"_a,
           "args"_a, "future_type"_a, "priority"_a = nb::none())
      // The run refers to the executor and the kernel: they live as long as it does.
      .def("map_device_calls", &py_executor::map_device_calls<gpupool::elementwise_kernel>,
           "kernel"_a, "calls"_a, "cupy_ndarray"_a.none(), "out"_a.none(), "out_is_one_array"_a,
           "single"_a, "priority"_a.none(), "keep_alive"_a, "future_type"_a, "wait_streams"_a,
           nb::keep_alive<0, 1>(), nb::keep_alive<0, 2>())
      .def("map_device_calls", &py_executor::map_device_calls<gpupool::raw_kernel>, "kernel"_a,
           "calls"_a, "cupy_ndarray"_a.none(), "out"_a.none(), "out_is_one_array"_a, "single"_a,
           "priority"_a.none(), "keep_alive"_a, "future_type"_a, "wait_streams"_a,
           nb::keep_alive<0, 1>(), nb::keep_alive<0, 2>())
      .def("launch_device", &py_executor::launch_device, "kernel"_a, "x"_a, "y"_a, "out"_a,
           "count"_a, "dtype"_a, "ordinal"_a, "result"_a, "keep_alive"_a, "future_type"_a,
           "priority"_a = nb::none())
      .def("shutdown", &py_executor::shutdown, "cancel_pending"_a = false)
      .def("set_tracing", &py_executor::set_tracing, "on"_a)
      .def("clear_trace", [](py_executor& e) { e.get().clear_trace(); })
      .def(
          "trace_snapshot",
          [](py_executor& e, std::uint64_t first_task) {
            gpupool::trace t;
            {
              nb::gil_scoped_release nogil;
              t = e.get().trace(first_task);
            }
            return t;
          },
          "first_task"_a = 0)
      .def("wait_for_surplus_tasks", &py_executor::wait_for_surplus_tasks,
           nb::call_guard<nb::gil_scoped_release>(),
           "Waits until every Python call's task has ended (tasks whose call another lane ran "
           "end soon after), so that a trace taken next holds a record for every call done.")
      .def("set_trace_capacity",
           [](py_executor& e, std::size_t records) { e.get().set_trace_capacity(records); })
      .def_prop_ro("trace_capacity", [](py_executor& e) { return e.get().trace_capacity(); })
      .def_prop_ro("trace_dropped", [](py_executor& e) { return e.get().trace_dropped(); })
      .def_prop_ro("next_task_id", [](py_executor& e) { return e.get().next_task_id(); })
      .def_prop_ro(
          "backend",
          [](const py_executor& e) { return std::string(gpupool::to_string(e.get().backend())); })
      .def_prop_ro(
          "takes_cuda_arrays",
          [](const py_executor& e) { return gpupool::takes_cuda_arrays(e.get().backend()); })
      .def_prop_ro("threads_per_gpu",
                   [](const py_executor& e) { return e.get().lanes_per_device(); })
      .def_prop_ro("lane_count", [](const py_executor& e) { return e.get().lane_count(); })
      .def_prop_ro("slots_per_lane", [](const py_executor& e) { return e.get().slots_per_lane(); })
      .def_prop_ro("chunk_bytes", [](const py_executor& e) { return e.get().chunk_bytes(); })
      .def_prop_ro("settings",
                   [](const py_executor& e) { return settings_dict(e.get().settings()); })
      .def_prop_ro("queued", [](const py_executor& e) { return e.get().queued(); })
      .def_prop_ro("priority", [](const py_executor& e) { return e.get().priority(); })
      .def_prop_ro("host_lanes", [](const py_executor& e) { return e.get().host_lanes(); })
      .def("placement", [](const py_executor& e) { return placement_dict(e.get().placement()); })
      .def_prop_ro("is_lane_thread", [](const py_executor& e) { return e.get().is_lane_thread(); })
      .def_prop_ro("devices",
                   [](const py_executor& e) {
                     nb::list out;
                     for (const auto& d : e.get().devices())
                       out.append(device_dict(d, e.get().lanes_per_device()));
                     return out;
                   })
      .def("memory_stats", [](const py_executor& e) {
        nb::list out;
        for (const auto& s : e.get().memory_stats()) {
          nb::dict d;
          d["in_use"] = s.in_use;
          d["peak"] = s.peak;
          d["budget"] = s.budget;
          out.append(d);
        }
        return out;
      });

  m.def(
      "join_orphaned_executors",
      []() {
        std::unique_lock lock(orphans().mutex);
        orphans().stopped.wait(lock, [] { return orphans().stopping == 0; });
      },
      nb::call_guard<nb::gil_scoped_release>(),
      "Waits until every executor dropped by one of its own tasks has stopped (called at exit).");
}

}  // namespace gpupool_python
