// gpupool.current_lane() and Lane: a task's view of the lane it runs on.
#include "lane.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "arrays.hpp"
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

// Lane.upload and Lane.download, which allocate with CuPy, are written in Python; the package
// hands them in at import (set_lane_helpers), so this binding needs nothing of its internals.
struct lane_helpers {
  PyObject* upload = nullptr;
  PyObject* download = nullptr;
};
lane_helpers& helpers() {
  static auto* const h = new lane_helpers;  // leaked: the functions live as long as the package
  return *h;
}

// Uploads up to this size from pageable memory are staged with the GIL held.
constexpr std::size_t small_copy_bytes = std::size_t{64} << 10;

nb::handle helper(PyObject* function) {
  if (function == nullptr)
    throw std::runtime_error("gpupool: Lane.upload/download need the gpupool package imported");
  return function;
}

}  // namespace

void bind_lane(nb::module_& m) {
  using namespace nb::literals;
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
      .def(
          "upload",
          [](nb::handle self, nb::handle array) { return helper(helpers().upload)(self, array); },
          "array"_a,
          "Copies a host array to a new CuPy array on this lane's device, ordered on the lane's\n"
          "stream (through the lane's pinned staging slot, or directly when the array is pinned).")
      .def(
          "download",
          [](nb::handle self, nb::handle device_array, nb::handle out) {
            return helper(helpers().download)(self, device_array, out);
          },
          "device_array"_a, "out"_a = nb::none(),
          "Copies a CuPy array on this lane's device into `out` (or a new NumPy array in pinned\n"
          "memory from gpupool's cache); returns once the data is on the host.")
      .def("_upload",
           [](const py_lane& l, std::uintptr_t device_dst, input_array src) {
             auto& lane = l.get();
             auto* dst = reinterpret_cast<void*>(device_dst);
             // A copy straight from pinned memory is waited for: the caller may free the block
             // at once, and gpupool's cache would hand it out again while the copy reads it.
             const bool pinned = src.nbytes() != 0 && gpupool::is_pinned(src.data());
             if (!pinned && src.nbytes() <= std::min(small_copy_bytes, lane.staging_bytes()) &&
                 lane.stream_idle()) {
               // One piece, staged in microseconds, nothing to wait for: letting the GIL go would
               // cost more (with many lanes running Python, it is taken back behind the others).
               lane.upload_bytes(dst, src.data(), src.nbytes());
               return;
             }
             nb::gil_scoped_release nogil;
             lane.upload_bytes(dst, src.data(), src.nbytes());
             if (pinned) lane.synchronize();
           })
      .def("_download", [](const py_lane& l, nb::ndarray<> dst, std::uintptr_t device_src) {
        // Copies and waits for the copy in one release of the GIL.
        auto& lane = l.get();
        nb::gil_scoped_release nogil;
        lane.download_bytes(dst.data(), reinterpret_cast<const void*>(device_src), dst.nbytes());
        lane.synchronize();
      });

  m.def(
      "set_lane_helpers",
      [](nb::object upload, nb::object download) {
        Py_CLEAR(helpers().upload);
        Py_CLEAR(helpers().download);
        if (!upload.is_none()) helpers().upload = upload.release().ptr();
        if (!download.is_none()) helpers().download = download.release().ptr();
      },
      "upload"_a.none(), "download"_a.none(),
      "What Lane.upload and Lane.download call (set by the package; None, None at exit).");

  m.def("current_lane", []() -> std::optional<py_lane> {
    if (current_lane == nullptr) return std::nullopt;
    return py_lane(current_lane);
  });
}

}  // namespace gpupool_python
