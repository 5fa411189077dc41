// gpupool: many worker threads ("lanes") per GPU, on every GPU, with a CPU stand-in.
// The one header a user includes. It pulls in no CUDA header.
#pragma once

#include "gpupool/availability.hpp"  // IWYU pragma: export
#include "gpupool/elementwise.hpp"   // IWYU pragma: export
#include "gpupool/error.hpp"         // IWYU pragma: export
#include "gpupool/executor.hpp"      // IWYU pragma: export
#include "gpupool/future.hpp"        // IWYU pragma: export
#include "gpupool/host_vector.hpp"   // IWYU pragma: export
#include "gpupool/lane.hpp"          // IWYU pragma: export
#include "gpupool/map_stream.hpp"    // IWYU pragma: export
#include "gpupool/options.hpp"       // IWYU pragma: export
#include "gpupool/pinned.hpp"        // IWYU pragma: export
#include "gpupool/pointer.hpp"       // IWYU pragma: export
#include "gpupool/trace.hpp"         // IWYU pragma: export
#include "gpupool/types.hpp"         // IWYU pragma: export
#include "gpupool/version.hpp"       // IWYU pragma: export
