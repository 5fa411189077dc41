// gpupool.current_lane() and Lane: a task's view of the lane it runs on.
#include "lane.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "cupy_arrays.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool_python {

// The lane whose task this thread is running, for gpupool.current_lane().
thread_local gpupool::lane* current_lane = nullptr;

lane_scope::lane_scope(gpupool::lane* l) : previous_(current_lane) {
  current_lane = l;
}
lane_scope::~lane_scope() {
  current_lane = previous_;
}

namespace {

// Python's view of a lane: valid only inside its task, on its thread.
class py_lane {
 public:
  explicit py_lane(gpupool::lane* l) : lane_(l) {}
  gpupool::lane& get() const {
    if (current_lane != lane_)
      throw std::runtime_error("gpupool: a Lane is usable only inside the task it was given to");
    return *lane_;
  }

 private:
  gpupool::lane* lane_;
};

// Uploads up to this size from pageable memory are staged with the GIL held.
constexpr std::size_t small_copy_bytes = std::size_t{64} << 10;

// See gil_hold_us. Chosen by measurement (docs/performance.md): holding for this long makes
// small Python tasks with copies much faster than letting the GIL go at once, and with a long
// kernel before each copy loses nothing (the back-off below); a hold long enough to outlast such
// a kernel loses much.
constexpr int gil_hold_default_us = 200;
// A wait that outlasts the hold is a lane whose work takes longer than a copy (a long kernel
// before the download): holding the GIL through such waits would keep every other lane from
// starting its own work. The lane then lets the GIL go at once for its next this many small
// waits before it holds again.
constexpr int gil_hold_backoff_waits = 64;

// How long a Python task waits for a small copy of its lane holding the GIL before it lets the
// GIL go (microseconds; 0: at once). With many lanes running Python, a task that lets the GIL go
// takes it back only behind the others, each hand-over a thread woken in the kernel, while a
// small copy ends within tens of microseconds; but a task that keeps the GIL keeps every other
// lane out of Python meanwhile. _lane_gil_hold_us sets it, so that both can be measured.
std::atomic<int> gil_hold_us{gil_hold_default_us};
// Bumped at every setting of gil_hold_us: a lane's back-off from an earlier setting ends there.
std::atomic<unsigned> gil_hold_setting{0};

// Waits until everything enqueued on the lane's stream has finished, with the GIL held on entry:
// after a copy of `bytes` of at most small_copy_bytes it polls the stream holding the GIL for up
// to gil_hold_us, then (or at once, after a larger copy, or while the lane backs off after a
// hold that ran out) it lets the GIL go and waits.
void wait_for_lane(gpupool::lane& lane, std::size_t bytes) {
  // A lane is one thread: counted per lane, for the setting it was counted under.
  thread_local int waits_without_hold = 0;
  thread_local unsigned counted_under = 0;
  if (const unsigned setting = gil_hold_setting.load(std::memory_order_relaxed);
      setting != counted_under) {
    counted_under = setting;
    waits_without_hold = 0;
  }
  int hold = bytes <= small_copy_bytes ? gil_hold_us.load(std::memory_order_relaxed) : 0;
  if (hold > 0 && waits_without_hold > 0) {
    --waits_without_hold;
    hold = 0;
  }
  if (hold > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(hold);
    do {
      if (lane.stream_idle()) {
        lane.synchronize();  // at once now; it also ends the lane's hold on its staging buffers
        return;
      }
    } while (std::chrono::steady_clock::now() < deadline);
    waits_without_hold = gil_hold_backoff_waits;
  }
  nb::gil_scoped_release nogil;
  lane.synchronize();
}

// Lane.download of a C-contiguous CuPy array of one of gpupool's dtypes into a new NumPy array in
// pinned memory, read and allocated here rather than in Python (it runs once per task of code
// written like the motivating program); nothing for anything else, which the Python helper
// takes.
std::optional<nb::object> download_cupy(gpupool::lane& lane, nb::handle device_array) {
  if (!gpupool::takes_cuda_arrays(lane.backend())) return std::nullopt;
  nb::handle cupy_ndarray = cupy_ndarray_type();
  if (!cupy_ndarray.is_valid() || !device_array.type().is(cupy_ndarray)) return std::nullopt;
  cupy_reading r = read_cupy(device_array);
  if (r.trouble != cupy_reading::problem::none) return std::nullopt;
  const std::size_t bytes = r.view.count * gpupool::size_of(r.view.type);
  std::vector<std::size_t> shape = sizes_of(r.view);
  auto block = std::make_unique<pinned_block>(std::max<std::size_t>(bytes, 1));
  lane.download_bytes(block->data(), reinterpret_cast<const void*>(r.view.address), bytes);
  wait_for_lane(lane, bytes);
  return pinned_array(std::move(block), shape, dlpack_of(r.view.type));
}

// Copies `src` to `dst` on the lane's stream. Returns once `src` may be changed or freed:
// pageable data is in the staging slot by then; a copy straight from pinned memory is waited
// for (the caller may free the block at once, and gpupool's cache would hand it out again while
// the copy still reads it).
void upload_to(gpupool::lane& lane, std::uintptr_t device_dst, const input_array& src) {
  auto* dst = reinterpret_cast<void*>(device_dst);
  const bool pinned = src.nbytes() != 0 && gpupool::is_pinned(src.data());
  if (!pinned && src.nbytes() <= std::min(small_copy_bytes, lane.staging_bytes()) &&
      lane.stream_idle()) {
    // One piece, staged in microseconds, nothing to wait for: letting the GIL go would cost
    // more (with many lanes running Python, it is taken back behind the others).
    lane.upload_bytes(dst, src.data(), src.nbytes());
    return;
  }
  if (pinned) {
    lane.upload_bytes(dst, src.data(), src.nbytes());  // enqueues the copy only
    wait_for_lane(lane, src.nbytes());
    return;
  }
  nb::gil_scoped_release nogil;
  lane.upload_bytes(dst, src.data(), src.nbytes());
}

// Copies `dst.nbytes()` from the device and waits for the copy: into pinned memory as
// wait_for_lane does, into pageable memory (staged piece by piece) in one release of the GIL.
void download_into(gpupool::lane& lane, const nb::ndarray<>& dst, std::uintptr_t device_src) {
  const auto* src = reinterpret_cast<const void*>(device_src);
  if (gpupool::is_pinned(dst.data())) {
    lane.download_bytes(dst.data(), src, dst.nbytes());
    wait_for_lane(lane, dst.nbytes());
    return;
  }
  nb::gil_scoped_release nogil;
  lane.download_bytes(dst.data(), src, dst.nbytes());
  lane.synchronize();
}

// CuPy, which Lane.upload/download make and read arrays with: only where the task's code has
// imported it (it is never imported here), on a backend whose devices take CUDA arrays.
nb::object require_cupy(gpupool::lane& lane) {
  if (gpupool::takes_cuda_arrays(lane.backend())) {
    if (PyObject* cupy = PyImport_GetModule(nb::str("cupy").ptr())) return nb::steal(cupy);
    if (PyErr_Occurred()) throw nb::python_error();
  }
  throw std::runtime_error(
      "gpupool: Lane.upload/download need the CUDA backend and CuPy (import cupy first)");
}

// `make()` with CuPy's work ordered on the lane's stream: as it is when that stream is CuPy's
// current one already (the task's own, the usual case), else with it made current meanwhile.
template <class Make>
nb::object on_lane_stream(nb::handle cupy, nb::handle lane_object, gpupool::lane& lane,
                          Make&& make) {
  const auto stream = reinterpret_cast<std::uintptr_t>(lane.native_stream());
  nb::object cuda = cupy.attr("cuda");
  if (nb::cast<std::uintptr_t>(cuda.attr("get_current_stream")().attr("ptr")) == stream)
    return make();
  // CuPy 14+ takes any object of the CUDA stream protocol (the Lane is one); ExternalStream,
  // which it deprecates, before.
  nb::object from_external = nb::getattr(cuda.attr("Stream"), "from_external", nb::none());
  nb::object scope = from_external.is_none()
                         ? cuda.attr("ExternalStream")(stream, cuda.attr("Device")().attr("id"))
                         : from_external(lane_object);
  scope.attr("__enter__")();
  nb::object made;
  try {
    made = make();
  } catch (...) {
    scope.attr("__exit__")(nb::none(), nb::none(), nb::none());
    throw;
  }
  scope.attr("__exit__")(nb::none(), nb::none(), nb::none());
  return made;
}

// A new NumPy array in pinned memory from gpupool's cache with `like`'s shape and dtype.
nb::object empty_pinned_like(nb::handle like) {
  const auto bytes = nb::cast<std::size_t>(like.attr("nbytes"));
  // Bytes, viewed as `like`'s dtype after: it may be one gpupool does not compute with.
  nb::object raw = pinned_array(std::make_unique<pinned_block>(std::max<std::size_t>(bytes, 1)),
                                {bytes}, nb::dtype<std::uint8_t>());
  return raw.attr("view")(like.attr("dtype")).attr("reshape")(like.attr("shape"));
}

// Lane.upload: a host array copied to a new CuPy array on the lane's device.
nb::object upload(nb::handle self, nb::handle array) {
  gpupool::lane& lane = nb::cast<const py_lane&>(self).get();
  nb::object cupy = require_cupy(lane);
  nb::object host = nb::module_::import_("numpy").attr("ascontiguousarray")(array);
  nb::object device = on_lane_stream(
      cupy, self, lane, [&] { return cupy.attr("empty")(host.attr("shape"), host.attr("dtype")); });
  upload_to(lane, nb::cast<std::uintptr_t>(device.attr("data").attr("ptr")),
            nb::cast<input_array>(host));
  return device;
}

// Lane.download: a CuPy array copied into `out` or a new pinned NumPy array.
nb::object download(nb::handle self, nb::handle device_array, nb::handle out) {
  gpupool::lane& lane = nb::cast<const py_lane&>(self).get();
  if (out.is_none())
    if (auto result = download_cupy(lane, device_array)) return std::move(*result);
  nb::object cupy = require_cupy(lane);
  nb::object source = nb::borrow(device_array);
  if (!nb::cast<bool>(source.attr("flags").attr("c_contiguous"))) {
    // A strided view is copied into a contiguous array first, on the lane's stream, as CuPy's
    // own get() does; its bytes as they lie would be other elements.
    source =
        on_lane_stream(cupy, self, lane, [&] { return cupy.attr("ascontiguousarray")(source); });
  }
  nb::object target = out.is_none() ? empty_pinned_like(source) : nb::borrow(out);
  if (nb::cast<std::size_t>(target.attr("nbytes")) !=
          nb::cast<std::size_t>(source.attr("nbytes")) ||
      !nb::cast<bool>(target.attr("flags").attr("c_contiguous")))
    throw nb::value_error("gpupool: out must be C-contiguous and the size of the device array");
  download_into(lane, nb::cast<nb::ndarray<>>(target),
                nb::cast<std::uintptr_t>(source.attr("data").attr("ptr")));
  return target;
}

}  // namespace

void bind_lane(nb::module_& m) {
  using namespace nb::literals;
  prepare_cupy_reading();  // before any lane can read a CuPy array (see its comment)
  nb::class_<py_lane>(m, "Lane", "The lane a task runs on; valid only inside that task.")
      .def_prop_ro("device", [](const py_lane& l) { return l.get().device(); })
      .def_prop_ro("index", [](const py_lane& l) { return l.get().index(); })
      .def_prop_ro("index_on_device", [](const py_lane& l) { return l.get().index_on_device(); })
      .def_prop_ro(
          "backend",
          [](const py_lane& l) { return std::string(gpupool::to_string(l.get().backend())); })
      .def_prop_ro("stream",
                   [](const py_lane& l) {
                     return reinterpret_cast<std::uintptr_t>(l.get().native_stream());
                   })
      .def("__cuda_stream__",
           [](const py_lane& l) {
             // The CUDA stream protocol: (version, handle).
             return nb::make_tuple(0, reinterpret_cast<std::uintptr_t>(l.get().native_stream()));
           })
      .def("synchronize",
           [](const py_lane& l) {
             auto& lane = l.get();
             nb::gil_scoped_release nogil;
             lane.synchronize();
           })
      .def("upload", &upload, "array"_a,
           "Copies a host array to a new CuPy array on this lane's device, ordered on the lane's\n"
           "stream (through the lane's pinned staging slot, or directly when the array is\n"
           "pinned). Returns once the array may be changed or freed.")
      .def("download", &download, "device_array"_a, "out"_a = nb::none(),
           "Copies a CuPy array on this lane's device into `out` (or a new NumPy array in pinned\n"
           "memory from gpupool's cache); returns once the data is on the host.")
      .def("_upload", [](const py_lane& l, std::uintptr_t device_dst,
                         const input_array& src) { upload_to(l.get(), device_dst, src); })
      .def("_download", [](const py_lane& l, const nb::ndarray<>& dst, std::uintptr_t device_src) {
        download_into(l.get(), dst, device_src);
      });

  m.def(
      "_lane_gil_hold_us",
      [](std::optional<int> us) {
        const int before = gil_hold_us.load();
        if (us) {
          if (*us < 0 || *us > 1'000'000)
            throw nb::value_error("gpupool: the GIL hold is 0 to 1,000,000 microseconds");
          gil_hold_us.store(*us);
          gil_hold_setting.fetch_add(1);
        }
        return before;
      },
      "us"_a = nb::none(),
      "How long a task waits for its lane's copies holding the GIL, in microseconds (set when\n"
      "given; lanes backing off from holding start afresh); returns the value before.");

  m.def("current_lane", []() -> std::optional<py_lane> {
    if (current_lane == nullptr) return std::nullopt;
    return py_lane(current_lane);
  });
}

}  // namespace gpupool_python
