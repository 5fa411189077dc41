// The memo of compiled kernels every backend keeps (detail::compile_for): a kernel asked for
// again with the same text, pattern of arrays and scalars and device is the one compiled before,
// without the backend's compile (which makes the source, hashes it and looks in the disk cache)
// being asked again; anything compiling depends on makes a new entry, and a failed compile
// leaves none.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernels/kernel_source.hpp"
#include "core/kernels/user_call.hpp"
#include "gpupool/elementwise.hpp"

namespace gpupool::detail {
namespace {

// The CPU backend, counting the compiles asked of it.
class counting_backend final : public backend {
 public:
  counting_backend() : inner_(cpu_backend_registration.make({.count = 2})) {}
  int compiles = 0;

  backend_kind kind() const noexcept override { return inner_->kind(); }
  const backend_traits& traits() const noexcept override { return inner_->traits(); }
  int device_count() const override { return inner_->device_count(); }
  device_info describe(int ordinal) const override { return inner_->describe(ordinal); }
  void bind_thread(int ordinal) override { inner_->bind_thread(ordinal); }
  std::unique_ptr<backend_stream> open_stream(int ordinal, int priority) override {
    return inner_->open_stream(ordinal, priority);
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

// The backend seam: each backend describes itself (backend_traits) and owns its code generator;
// what the core hands a backend back (a timer, a compiled kernel) is checked to be its own.
TEST(BackendSeam, EveryBackendDescribesItself) {
  for (const backend_name& row : backend_names) {
    const backend_traits& t = traits_of(row.kind);
    EXPECT_NE(t.generator, nullptr) << row.name;
    EXPECT_NE(t.default_lanes, nullptr) << row.name;
    EXPECT_GE(t.default_lanes(1, 1), 1) << row.name;
    EXPECT_GE(t.default_lanes(1024, 1), 1) << row.name;
    EXPECT_FALSE(t.sweep_lanes(1, 1).empty()) << row.name;
    EXPECT_FALSE(t.sweep_chunks.empty()) << row.name;
    EXPECT_LE(t.sweep_bytes_per_device, t.most_sweep_bytes_per_device) << row.name;
    EXPECT_TRUE(t.automatic_tuning == tuning::measured || t.automatic_tuning == tuning::fixed);
    device_info d;
    d.backend = row.kind;
    EXPECT_GE(t.least_device_batch_elements(d), 1u) << row.name;
    EXPECT_GE(t.default_in_flight_budget(d), 1u) << row.name;
  }
  const auto cpu = cpu_backend_registration.make({});
  EXPECT_EQ(&cpu->traits(), cpu_backend_registration.traits);
  EXPECT_EQ(&cpu->traits(), &traits_of(cpu->kind()));
}

TEST(BackendSeam, EachGeneratorPutsTheBodyWhereItSays) {
  const elementwise_kernel k("float64 x, float64 a", "float64 y", "y = a * x; // the body", "seam");
  for (const backend_name& row : backend_names) {
    const kernel_generator& g = *traits_of(row.kind).generator;
    const std::string source = g.source(k, {true, false});
    EXPECT_NE(source.find(kernel_entry_point), std::string::npos) << g.language();
    std::size_t at = 0;
    for (int line = 1; line < g.body_first_line(k); ++line) at = source.find('\n', at) + 1;
    EXPECT_EQ(source.compare(at, k.body().size(), k.body()), 0) << g.language() << ":\n" << source;
  }
}

// A timer or a compiled kernel of another type (another backend's, a decorator's) is refused with
// both types named, not reinterpreted.
class foreign_timer final : public backend_timer {
 public:
  void record() override {}
  double microseconds_since(backend_timer& /*earlier*/) override { return 0; }
};

class foreign_kernel final : public compiled_kernel {
 public:
  foreign_kernel() : compiled_kernel({true}) {}
};

TEST(BackendSeam, ABackendRefusesObjectsItDidNotMake) {
  const auto cpu = cpu_backend_registration.make({});
  const auto stream = cpu->open_stream(0);
  const auto timer = stream->make_timer();
  timer->record();
  auto own = stream->make_timer();
  own->record();
  EXPECT_GE(timer->microseconds_since(*own), -1e9);  // its own: fine
  foreign_timer other;
  try {
    (void)timer->microseconds_since(other);
    ADD_FAILURE() << "a foreign timer was taken";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("foreign_timer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu_timer"), std::string::npos) << e.what();
  }
  const foreign_kernel k;
  double x = 1, y = 0;
  void* args[] = {&x, &y};
  EXPECT_THROW(stream->launch_compiled(k, args, 1), std::logic_error);
}

}  // namespace
}  // namespace gpupool::detail
