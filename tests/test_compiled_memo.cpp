// The memo of compiled kernels every backend keeps (detail::compile_for): a kernel asked for
// again with the same text, pattern of arrays and scalars and device is the one compiled before,
// without the backend's compile (which makes the source, hashes it and looks in the disk cache)
// being asked again; anything compiling depends on makes a new entry, and a failed compile
// leaves none.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernels/user_call.hpp"
#include "gpupool/elementwise.hpp"

namespace gpupool::detail {
namespace {

// The CPU backend, counting the compiles asked of it.
class counting_backend final : public backend {
 public:
  counting_backend() : inner_(cpu_backend_registration.make(2)) {}
  int compiles = 0;

  backend_kind kind() const noexcept override { return inner_->kind(); }
  int device_count() const override { return inner_->device_count(); }
  device_info describe(int ordinal) const override { return inner_->describe(ordinal); }
  void bind_thread(int ordinal) override { inner_->bind_thread(ordinal); }
  std::unique_ptr<backend_stream> open_stream(int ordinal) override {
    return inner_->open_stream(ordinal);
  }
  void prepare_device(int ordinal) override { inner_->prepare_device(ordinal); }
  std::size_t free_memory(int ordinal) const override { return inner_->free_memory(ordinal); }
  std::shared_ptr<const compiled_kernel> compile(const elementwise_kernel& k,
                                                 const std::vector<bool>& is_array,
                                                 int ordinal) override {
    ++compiles;
    return inner_->compile(k, is_array, ordinal);
  }
  std::shared_ptr<const compiled_kernel> compile(const raw_kernel& k, int ordinal) override {
    ++compiles;
    return inner_->compile(k, ordinal);
  }

 private:
  std::shared_ptr<backend> inner_;
};

class CompiledMemo : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/gpupool-test-cache-XXXXXX";  // this run's own compile cache
    ASSERT_NE(::mkdtemp(dir), nullptr);
    ::setenv("GPUPOOL_CACHE_DIR", dir, 1);
  }
  static prepared_call call_of(const elementwise_kernel& k, std::vector<kernel_argument> args) {
    return prepare_call(k, args, k.output().type, 4);
  }
  const std::vector<double> x = std::vector<double>(4, 1.0);
};

TEST_F(CompiledMemo, TheSameKernelPatternAndDeviceCompileOnce) {
  counting_backend b;
  const elementwise_kernel k("float64 x, float64 a", "float64 y", "y = a * x;", "memo_once");
  const prepared_call call = call_of(k, {x, 2.0});
  auto first = compile_for(b, k, call, 0);
  auto again = compile_for(b, k, call, 0);
  // An equal kernel made anew (a Python kernel object per call, say) finds it too.
  const elementwise_kernel same("float64 x, float64 a", "float64 y", "y = a * x;", "memo_once");
  auto equal = compile_for(b, same, call_of(same, {x, 3.0}), 0);
  EXPECT_EQ(b.compiles, 1);
  EXPECT_EQ(first.get(), again.get());
  EXPECT_EQ(first.get(), equal.get());
}

TEST_F(CompiledMemo, AnythingCompilingDependsOnMakesANewEntry) {
  counting_backend b;
  const elementwise_kernel k("float64 x, float64 a", "float64 y", "y = a * x;", "memo_keys");
  auto base = compile_for(b, k, call_of(k, {x, 2.0}), 0);
  // Another pattern (a as an array), another device, another body under the same name, another
  // name, another parameter type.
  auto pattern = compile_for(b, k, call_of(k, {x, x}), 0);
  auto device = compile_for(b, k, call_of(k, {x, 2.0}), 1);
  const elementwise_kernel body("float64 x, float64 a", "float64 y", "y = a + x;", "memo_keys");
  auto other_body = compile_for(b, body, call_of(body, {x, 2.0}), 0);
  const elementwise_kernel name("float64 x, float64 a", "float64 y", "y = a * x;", "memo_keys2");
  auto other_name = compile_for(b, name, call_of(name, {x, 2.0}), 0);
  const elementwise_kernel type("float64 x, int64 a", "float64 y", "y = a * x;", "memo_keys");
  auto other_type = compile_for(b, type, call_of(type, {x, 2}), 0);
  EXPECT_EQ(b.compiles, 6);
  EXPECT_NE(base.get(), pattern.get());
  EXPECT_NE(base.get(), other_body.get());
  EXPECT_EQ(compile_for(b, k, call_of(k, {x, x}), 0).get(), pattern.get());
  EXPECT_EQ(b.compiles, 6);
}

TEST_F(CompiledMemo, AFailedCompileLeavesNothingBehind) {
  counting_backend b;
  const elementwise_kernel broken("float64 x", "float64 y", "y = x +;", "memo_broken");
  const prepared_call call = call_of(broken, {x});
  EXPECT_THROW((void)compile_for(b, broken, call, 0), compile_error);
  EXPECT_THROW((void)compile_for(b, broken, call, 0), compile_error);
  EXPECT_EQ(b.compiles, 2);  // asked again: the failure was not kept as an answer
}

TEST_F(CompiledMemo, ARawKernelTheBackendCannotRunIsAskedForEachTime) {
  // The CPU backend refuses raw CUDA kernels: the refusal is not kept as an answer either.
  counting_backend b;
  const raw_kernel k("extern \"C\" __global__ void f(double* y) {}", "f", "", "float64* y");
  const prepared_call call = prepare_call(k, {}, k.output().type, 4);
  EXPECT_THROW((void)compile_for(b, k, call, 0), backend_unavailable);
  EXPECT_THROW((void)compile_for(b, k, call, 0), backend_unavailable);
  EXPECT_EQ(b.compiles, 2);
}

}  // namespace
}  // namespace gpupool::detail
