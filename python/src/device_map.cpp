// A compiled kernel over many calls whose arrays live on GPUs (see device_map.hpp).
#include "device_map.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "device_arrays.hpp"
#include "futures.hpp"

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

// One device's calls of one block: their outputs are consecutive in one buffer.
struct group {
  int ordinal = 0;
  std::vector<std::size_t> members;  // call indices, in call order
  nb::object flat;
  std::vector<std::size_t> ends;  // each member's end in `flat`, in elements
};

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

// A run's steps, in the order Python takes them (see device_map.hpp).
enum class stage {
  between_blocks,  // the next block may be read
  block_read,      // its groups wait for their buffers (with `out`: for queueing)
  buffers_given,   // it waits for queueing
  all_queued,      // every call is read and queued: the outputs wait for finish()
  ended,           // finished, abandoned, or failed (abandon() is all that is left)
};

template <class K>
class device_map_run_of final : public device_map_run {
 public:
  device_map_run_of(gpupool::executor& ex, const K& k, nb::sequence calls, nb::handle cupy_ndarray,
                    nb::object out, bool out_is_one_array, bool single,
                    const gpupool::task_options& options, nb::object keep_alive,
                    nb::handle future_type, std::vector<std::uintptr_t> wait_streams)
      : ex_(ex),
        k_(k),
        n_(nb::len(calls)),
        single_(single),
        given_outputs_(out.is_valid() && !out.is_none()),
        options_(options),
        future_type_(nb::borrow(future_type)),
        notes_{std::move(wait_streams), {}},
        reader_(k.name(), k.inputs(), k.output(), calls, cupy_ndarray, out, out_is_one_array,
                notes_),
        described_(n_),
        outputs_(n_),
        held_(nb::make_tuple(std::move(keep_alive), held_flats_, out, notes_.views)) {
    if (single && n_ != 1) throw nb::value_error("gpupool: single needs exactly one call");
    if (given_outputs_ && single) throw nb::value_error("gpupool: out is for maps, not single");
    if (out_is_one_array) one_out_ = out;
    if (given_outputs_ && !out_is_one_array && nb::len(out) != n_)
      throw nb::value_error(("gpupool: out has " + std::to_string(nb::len(out)) + " array(s) for " +
                             std::to_string(n_) + " call(s)")
                                .c_str());
  }

  // Nothing of a run that Python let go of unfinished runs on: its buffers go with it.
  ~device_map_run_of() override { stop(); }

  nb::object read_block() override {
    return step({stage::between_blocks, stage::all_queued}, [&]() -> nb::object {
      if (begin_ >= n_) {
        reader_.check_every_call_read();
        stage_ = stage::all_queued;
        return nb::none();
      }
      end_ = std::min(n_, begin_ + size_);
      for (std::size_t c = begin_; c < end_; ++c) reader_.read(c, described_[c]);
      // One array as `out` that holds more than the calls write is refused before the last
      // block runs.
      if (end_ == n_) reader_.check_every_call_read();
      first_group_ = groups_.size();
      group_by_device(begin_, end_, described_, groups_);
      work_.clear();
      nb::list needs;
      for (std::size_t g = first_group_; g < groups_.size(); ++g) {
        const group& gr = groups_[g];
        std::size_t total = 0;
        for (std::size_t c : gr.members) total += described_[c].work.count;
        if (given_outputs_) {
          work_.push_back(given_work(gr));
        } else {
          needs.append(nb::make_tuple(described_[gr.members.front()].anchor, gr.ordinal,
                                      std::max<std::size_t>(total, 1),
                                      gpupool::to_string(k_.output().type)));
        }
      }
      stage_ = given_outputs_ ? stage::buffers_given : stage::block_read;
      return needs;
    });
  }

  void give_buffers(nb::sequence buffers) override {
    step({stage::block_read}, [&] {
      const std::size_t fresh = groups_.size() - first_group_;
      if (nb::len(buffers) != fresh)
        throw nb::value_error(("gpupool: the block's " + std::to_string(fresh) +
                               " group(s) need a buffer each; " + std::to_string(nb::len(buffers)) +
                               " given")
                                  .c_str());
      for (std::size_t g = first_group_; g < groups_.size(); ++g) {
        auto [flat, base] =
            nb::cast<std::tuple<nb::object, std::uintptr_t>>(buffers[g - first_group_]);
        work_.push_back(placed_work(groups_[g], std::move(flat), base));
      }
      stage_ = stage::buffers_given;
    });
  }

  void queue_block() override {
    step({stage::buffers_given}, [&] {
      {
        nb::gil_scoped_release nogil;
        for (std::uintptr_t s : notes_.streams) gpupool::wait_for_stream(s);
      }
      queued_.reserve(queued_.size() + work_.size());  // no throw once queued
      for (std::size_t g = first_group_; g < groups_.size(); ++g)
        queue_group(groups_[g], work_[g - first_group_]);
      work_.clear();
      begin_ = end_;
      size_ = std::min(size_ * 2, largest_device_block);
      stage_ = stage::between_blocks;
    });
  }

  nb::list cuts() override {
    return step({stage::between_blocks, stage::block_read, stage::buffers_given, stage::all_queued},
                [&] {
                  nb::list out;
                  for (; cut_ < groups_.size() && groups_[cut_].flat.is_valid(); ++cut_) {
                    nb::list ends;
                    for (std::size_t end : groups_[cut_].ends) ends.append(end);
                    out.append(nb::make_tuple(groups_[cut_].flat, ends));
                  }
                  return out;
                });
  }

  nb::tuple finish(nb::sequence pieces) override {
    return step({stage::all_queued}, [&] {
      if (!given_outputs_) place_views(pieces);
      nb::list all;
      if (!one_out_.is_valid())
        for (auto& o : outputs_) all.append(o);
      nb::object result = single_               ? outputs_.front()
                          : one_out_.is_valid() ? one_out_
                                                : nb::object(all);
      nb::list futures;
      futures.append(adopt_kernel_tasks(queued_, future_type_, std::move(result), held_));
      queued_.clear();  // the future's from now on
      stage_ = stage::ended;
      return nb::make_tuple(all, futures);
    });
  }

  void abandon() override {
    if (busy_) throw std::runtime_error("gpupool: this device map is in use by another thread");
    stop();
    stage_ = stage::ended;
  }

 private:
  // Runs `body` if the run is at one of `allowed`; a failure ends the run (the caller abandons
  // it).
  template <class Body>
  auto step(std::initializer_list<stage> allowed, const Body& body) {
    if (busy_) throw std::runtime_error("gpupool: this device map is in use by another thread");
    if (std::find(allowed.begin(), allowed.end(), stage_) == allowed.end())
      throw std::runtime_error(stage_ == stage::ended
                                   ? "gpupool: this device map has ended"
                                   : "gpupool: device map steps taken out of order");
    struct busy_while {
      bool& busy;
      explicit busy_while(bool& b) : busy(b) { busy = true; }
      busy_while(const busy_while&) = delete;
      busy_while& operator=(const busy_while&) = delete;
      ~busy_while() { busy = false; }
    } hold(busy_);
    try {
      return body();
    } catch (...) {
      stage_ = stage::ended;
      throw;
    }
  }

  // Group `gr`'s calls writing into the arrays of `out` (or their parts of the one array).
  std::vector<gpupool::device_call> given_work(const group& gr) {
    std::vector<gpupool::device_call> work;
    work.reserve(gr.members.size());
    for (std::size_t c : gr.members) {
      if (!one_out_.is_valid()) outputs_[c] = std::move(described_[c].output);
      work.push_back(std::move(described_[c].work));
    }
    return work;
  }

  // Group `gr`'s calls writing consecutive pieces of `flat` (at `base`).
  std::vector<gpupool::device_call> placed_work(group& gr, nb::object flat, std::uintptr_t base) {
    const std::size_t itemsize = gpupool::size_of(k_.output().type);
    held_flats_.append(flat);
    gr.flat = std::move(flat);
    gr.ends.reserve(gr.members.size());
    std::vector<gpupool::device_call> work;
    work.reserve(gr.members.size());
    std::size_t offset = 0;
    for (std::size_t c : gr.members) {
      auto& d = described_[c];
      d.work.out = reinterpret_cast<void*>(base + offset * itemsize);
      offset += d.work.count;
      gr.ends.push_back(offset);
      work.push_back(std::move(d.work));
    }
    return work;
  }

  // Queues group `g`'s work on its device; a refusal names the call by its place among all.
  void queue_group(const group& g, const std::vector<gpupool::device_call>& work) {
    const int device = device_of_ordinal(ex_, g.ordinal);
    try {
      nb::gil_scoped_release nogil;
      queued_.push_back(ex_.map_on_device(device, k_, work, options_));
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
  }

  // The outputs: `pieces[g]` holds group g's views (and maybe the rest of its buffer after
  // them), each reshaped to its call's shape.
  void place_views(nb::sequence pieces) {
    if (cut_ != groups_.size() || nb::len(pieces) != groups_.size())
      throw nb::value_error(("gpupool: finish takes the views of " +
                             std::to_string(groups_.size()) + " buffer(s); " +
                             std::to_string(nb::len(pieces)) + " given")
                                .c_str());
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const group& gr = groups_[g];
      nb::object views = pieces[g];
      if (nb::len(views) < gr.members.size())
        throw std::runtime_error("gpupool: a buffer was cut into fewer views than calls");
      for (std::size_t m = 0; m < gr.members.size(); ++m) {
        nb::object view = views[m];
        const nb::object& shape = described_[gr.members[m]].shape;  // invalid: one dimension
        if (shape.is_valid() && nb::len(shape) > 1) view = view.attr("reshape")(shape);
        outputs_[gr.members[m]] = std::move(view);
      }
    }
  }

  // Cancels what was queued and has not started, and waits for what started (it writes into
  // the buffers this run holds).
  void stop() noexcept {
    for (auto& f : queued_) (void)f.cancel();
    if (!interpreter_alive()) {
      // At exit a lane may be waiting for the GIL this thread holds, so waiting could hang the
      // exit: what started writes on into the buffers, which are therefore never let go of.
      if (!std::all_of(queued_.begin(), queued_.end(), [](auto& f) { return f.ready(); }))
        (void)held_.release();  // the buffers, in held_flats_, with it
      queued_.clear();
      return;
    }
    if (PyGILState_Check() != 0) {
      nb::gil_scoped_release nogil;
      for (auto& f : queued_) f.wait();
    } else {
      for (auto& f : queued_) f.wait();
    }
    queued_.clear();
  }

  gpupool::executor& ex_;
  const K& k_;
  std::size_t n_;
  bool single_;
  bool given_outputs_;
  // With one array as `out` (taking every call's output end to end): that array, the map's
  // result; invalid otherwise.
  nb::object one_out_;
  gpupool::task_options options_;
  nb::object future_type_;
  reading_notes notes_;
  call_reader reader_;
  std::vector<described_call> described_;
  std::vector<nb::object> outputs_;
  nb::list held_flats_;  // held with `keep_alive`, `out` and notes_.views until the map ends
  nb::object held_;
  std::vector<group> groups_;
  std::vector<std::vector<gpupool::device_call>> work_;  // the block's, one per new group
  std::vector<gpupool::future<void>> queued_;            // one per group, until finish()
  stage stage_ = stage::between_blocks;
  bool busy_ = false;  // a step is under way (it may have let the GIL go)
  std::size_t begin_ = 0, end_ = 0, size_ = first_device_block;
  std::size_t first_group_ = 0;  // the block's first group
  std::size_t cut_ = 0;          // groups given to cuts() so far
};

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
std::unique_ptr<device_map_run> map_device_calls(gpupool::executor& ex, const K& k,
                                                 nb::sequence calls, nb::handle cupy_ndarray,
                                                 nb::object out, bool out_is_one_array, bool single,
                                                 const gpupool::task_options& options,
                                                 nb::object keep_alive, nb::handle future_type,
                                                 std::vector<std::uintptr_t> wait_streams) {
  return std::make_unique<device_map_run_of<K>>(
      ex, k, std::move(calls), cupy_ndarray, std::move(out), out_is_one_array, single, options,
      std::move(keep_alive), future_type, std::move(wait_streams));
}

template std::unique_ptr<device_map_run> map_device_calls<gpupool::elementwise_kernel>(
    gpupool::executor&, const gpupool::elementwise_kernel&, nb::sequence, nb::handle, nb::object,
    bool, bool, const gpupool::task_options&, nb::object, nb::handle, std::vector<std::uintptr_t>);
template std::unique_ptr<device_map_run> map_device_calls<gpupool::raw_kernel>(
    gpupool::executor&, const gpupool::raw_kernel&, nb::sequence, nb::handle, nb::object, bool,
    bool, const gpupool::task_options&, nb::object, nb::handle, std::vector<std::uintptr_t>);

void bind_device_map(nb::module_& m) {
  using namespace nb::literals;
  bind_device_arrays(m);
  nb::class_<device_map_run>(
      m, "DeviceMapRun",
      "One map of a compiled kernel over device-array calls, driven step by step by "
      "_device.map_compiled (see device_map.hpp).")
      .def("read_block", &device_map_run::read_block,
           nb::sig("def read_block(self) -> list[tuple[object, int, int, str]] | None"),
           "Reads the next block of calls: None at the end, else the buffers its new groups "
           "need, as (anchor array, ordinal, element count, dtype name).")
      .def("give_buffers", &device_map_run::give_buffers, "buffers"_a,
           nb::sig("def give_buffers(self, buffers: collections.abc.Sequence[tuple[object, int]]) "
                   "-> None"),
           "The block's buffers, as (buffer, address), one per group in order.")
      .def("queue_block", &device_map_run::queue_block,
           "Waits for the producers' streams, then queues the block.")
      .def("cuts", &device_map_run::cuts,
           nb::sig("def cuts(self) -> list[tuple[object, list[int]]]"),
           "(buffer, ends) of each group not cut yet.")
      .def("finish", &device_map_run::finish, "pieces"_a,
           nb::sig("def finish(self, pieces: collections.abc.Sequence[collections.abc.Sequence["
                   "object]]) -> tuple[list[object], list[object]]"),
           "Takes each group's views; returns (outputs, [the map's future]).")
      .def("abandon", &device_map_run::abandon,
           "Cancels what was queued and not started, and waits for what started.");
}

}  // namespace gpupool_python
