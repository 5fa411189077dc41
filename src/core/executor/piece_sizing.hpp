// Piece sizing: how finely a call over host arrays is cut into the pieces that lanes pipeline.
#pragma once

#include <algorithm>
#include <cstddef>

namespace gpupool::detail {

class task_queue;

class piece_sizing {
 public:
  // `chunk_bytes`: the slot buffers' size, the most a piece's widest array takes; `given`: the
  // user chose it (then it is always used as it is).
  piece_sizing(std::size_t chunk_bytes, bool given, int lanes_per_device) noexcept
      : chunk_bytes_(chunk_bytes), given_(given), lanes_per_device_(lanes_per_device) {}

  // The most bytes of its widest array a piece of a call moving `total` bytes takes, given what
  // waits in `queue` and the devices it still serves. chunk_bytes,
  // unless that leaves lanes idle: when the chunk size was not given and less is queued than
  // there are lanes, a call too small to give every lane two pieces is cut finer (down to a
  // floor), so that all lanes copy at once: a few arrays end sooner in smaller pieces, while
  // many arrays run faster in larger ones. With a backlog the lanes are busy anyway, and smaller
  // pieces would only add per-piece cost.
  [[nodiscard]] std::size_t piece_bytes(std::size_t total, const task_queue& queue) const;

  // Elements per piece (all pieces but the last of an array are this long) of `element`-byte
  // elements, in pieces of at most `most_bytes`.
  [[nodiscard]] static std::size_t per_piece(std::size_t element, std::size_t most_bytes) noexcept {
    return std::max<std::size_t>(most_bytes / element, 1);
  }

  // Pieces of `per_piece` elements that `count` elements take.
  [[nodiscard]] static std::size_t pieces(std::size_t count, std::size_t per_piece) noexcept {
    return (count + per_piece - 1) / per_piece;
  }

 private:
  std::size_t chunk_bytes_;
  bool given_;
  int lanes_per_device_;
};

}  // namespace gpupool::detail
