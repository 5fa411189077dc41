// How many blocks a grid-stride loop gets when its work is capped at a number of blocks.
#pragma once

namespace gpupool::detail {

/// Blocks for a grid-stride loop over `wanted` blocks' worth of elements when at most `most`
/// fit: all of them if they do, else the fewest that still need no more turns of the longest
/// thread than `most` blocks would (ceil(wanted / most) turns). The kernel lasts as long as its
/// longest threads either way; the blocks left out are resident slots other lanes' kernels can
/// use (with 16,384 elements a call and at most 17 blocks of 256, 17 blocks leave some threads 4
/// elements and some 3, 16 blocks run 4 each, and the longest thread runs 4 in both). 0 wanted:
/// 0.
constexpr unsigned long long balanced_blocks(unsigned long long wanted, unsigned long long most) {
  if (most == 0) most = 1;
  if (wanted <= most) return wanted;
  const unsigned long long turns = (wanted + most - 1) / most;
  return (wanted + turns - 1) / turns;
}

}  // namespace gpupool::detail
