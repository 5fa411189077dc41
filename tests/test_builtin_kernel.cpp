// The built-in kernels' value type under its name, builtin_kernel, and under the name it had
// before, kernel: code written against the old name keeps compiling (with a deprecation warning)
// and runs the same kernel.
#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

#include "gpupool/gpupool.hpp"

namespace {

// Warnings are errors in this project, and the old name is deprecated: this is the one place
// that uses it, on purpose, to check that users' code still compiles against it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static_assert(std::is_same_v<gpupool::kernel, gpupool::builtin_kernel>,
              "gpupool::kernel must stay the old name of gpupool::builtin_kernel");
gpupool::kernel scale_by_the_old_name(double alpha) {
  return gpupool::kernel::scale(alpha);
}
#pragma GCC diagnostic pop

TEST(BuiltinKernel, ABuiltinMadeByTheOldNameRunsAsTheSameKernel) {
  const gpupool::builtin_kernel k = scale_by_the_old_name(2.5);
  EXPECT_EQ(k.operation(), gpupool::op::scale);
  EXPECT_EQ(k.alpha(), 2.5);
  gpupool::executor ex(
      {.backend = gpupool::backend_kind::cpu, .lanes_per_device = 1, .quiet = true});
  const std::vector<std::vector<double>> xs{{1.0, -2.0, 4.0}};
  const auto out = ex.map(k, xs).get();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(std::vector<double>(out[0].begin(), out[0].end()),
            (std::vector<double>{2.5, -5.0, 10.0}));
}

TEST(BuiltinKernel, OfBuildsEachBuiltinOfTheTableAndDropsAnAlphaItTakesNone) {
  for (const gpupool::builtin_kernel_info& info : gpupool::builtin_kernels()) {
    const auto k = gpupool::builtin_kernel::of(info.operation, 3.0);
    EXPECT_STREQ(k.name(), info.name);
    EXPECT_EQ(k.arity(), info.arity);
    EXPECT_EQ(k.alpha(), info.takes_alpha ? 3.0 : 0.0) << info.name;
  }
}

}  // namespace
