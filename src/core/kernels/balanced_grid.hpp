// How many blocks a grid-stride loop gets when its work is capped at a number of blocks.
#pragma once

namespace gpupool::detail {

/// Blocks for a grid-stride loop over `wanted` blocks' worth of elements when at most `most`
/// fit: all of them if they do, else as few as give every thread the same number of turns
/// (ceil(wanted / most)) — taking `most` itself would leave some threads one turn more than the
/// others, and the kernel as long as its longest threads (with 16,384 elements a call and 17
/// blocks of 256, some threads run 4 elements and some 3; 16 blocks run 4 each). 0 wanted: 0.
constexpr unsigned long long balanced_blocks(unsigned long long wanted, unsigned long long most) {
  if (most == 0) most = 1;
  if (wanted <= most) return wanted;
  const unsigned long long turns = (wanted + most - 1) / most;
  return (wanted + turns - 1) / turns;
}

}  // namespace gpupool::detail
