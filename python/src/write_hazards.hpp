// Where a map whose outputs the caller gives would let one call write memory that another call
// of the map reads or writes: its calls run in any order, at once, on several lanes, so such a
// map's results would depend on the timing. Each call may write in place over its own input
// (element i reads its inputs' element i, then writes the output's), and nothing else.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>

namespace gpupool_python {

class write_hazards {
 public:
  // Notes that call `call` reads bytes [begin, end); what is wrong, if the map writes them.
  std::optional<std::string> add_input(std::uintptr_t begin, std::uintptr_t end, std::size_t call) {
    if (begin >= end) return std::nullopt;
    if (auto writer = overlapping_output(begin, end))
      return "reads memory that call " + std::to_string(*writer) + " writes";
    // Merged with the reads it overlaps: a range several reads share, or read by one call in
    // more than one argument over other bounds, is no longer one call's own.
    bool own = true;
    std::uintptr_t low = begin, high = end;
    auto it = first_overlapping(inputs_, begin);
    while (it != inputs_.end() && it->first < end) {
      own = own && it->first == begin && it->second.end == end && it->second.owner == call &&
            it->second.own;
      low = std::min(low, it->first);
      high = std::max(high, it->second.end);
      it = inputs_.erase(it);
    }
    inputs_[low] = read{high, call, own};
    return std::nullopt;
  }

  // Notes that call `call` writes bytes [begin, end); what is wrong, if anything.
  std::optional<std::string> add_output(std::uintptr_t begin, std::uintptr_t end,
                                        std::size_t call) {
    if (begin >= end) return std::nullopt;
    if (auto writer = overlapping_output(begin, end))
      return "writes memory that call " + std::to_string(*writer) + " writes too";
    auto it = first_overlapping(inputs_, begin);
    if (it != inputs_.end() && it->first < end) {
      const read& r = it->second;
      const bool in_place = it->first == begin && r.end == end && r.owner == call && r.own;
      if (!in_place)
        return r.own && r.owner != call
                   ? "writes memory that call " + std::to_string(r.owner) + " reads"
                   : std::string(
                         "writes memory that it or another call reads, other than in "
                         "place over one of its own inputs");
    }
    outputs_[begin] = written{end, call};
    return std::nullopt;
  }

 private:
  struct read {
    std::uintptr_t end;
    std::size_t owner;  // the call, where `own`
    bool own;           // read by that call alone, as one range
  };
  struct written {
    std::uintptr_t end;
    std::size_t call;
  };

  // The first range of `ranges` (disjoint, by start) that may overlap [begin, ...): the one
  // holding `begin`, else the first starting after it.
  template <class Ranges>
  static typename Ranges::iterator first_overlapping(Ranges& ranges, std::uintptr_t begin) {
    auto it = ranges.upper_bound(begin);
    if (it != ranges.begin()) {
      auto before = std::prev(it);
      if (before->second.end > begin) return before;
    }
    return it;
  }

  std::optional<std::size_t> overlapping_output(std::uintptr_t begin, std::uintptr_t end) {
    auto it = first_overlapping(outputs_, begin);
    if (it != outputs_.end() && it->first < end) return it->second.call;
    return std::nullopt;
  }

  std::map<std::uintptr_t, read> inputs_;      // disjoint: overlapping reads are merged
  std::map<std::uintptr_t, written> outputs_;  // disjoint: overlapping writes are refused
};

}  // namespace gpupool_python
