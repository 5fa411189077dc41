// Priorities: the queue's order (highest first, first come first served within a priority, on
// every device, stolen work included), its aging bound, and through an executor on the CPU
// backend: submit and map with priorities, cancellation and shutdown with mixed priorities,
// starvation under a steady stream of urgent work, the trace, and bad values refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/scheduling/task_queue.hpp"
#include "gpupool/executor.hpp"
#include "inert_item.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

using namespace gpupool::testing;
using detail::task_queue;
using detail::work_item;
using detail::work_item_ptr;

// An item with an id (its submission order) and a priority.
class prio_item final : public inert_item {
 public:
  prio_item(int id, int p) : inert_item(p), id_(id) { trace_id = static_cast<std::uint64_t>(id); }
  [[nodiscard]] int id() const { return id_; }

 private:
  int id_;
};

work_item_ptr item(int id, int p) {
  return std::make_unique<prio_item>(id, p);
}

int id_of(const work_item_ptr& p) {
  return static_cast<const prio_item&>(*p).id();
}

// Every item a lane of `device` takes, without waiting, in order.
std::vector<int> pop_all(task_queue& q, int device) {
  std::vector<int> ids;
  while (auto p = q.pop(device, /*block=*/false)) ids.push_back(id_of(p));
  return ids;
}

TEST(PriorityQueue, HighestFirstThenFirstComeFirstServed) {
  task_queue q(1);
  // id: priority
  const std::vector<std::pair<int, int>> pushed = {{0, 0}, {1, 0}, {2, 2}, {3, -1},
                                                   {4, 2}, {5, 1}, {6, 3}, {7, -3}};
  for (const auto& [id, p] : pushed) ASSERT_TRUE(q.push(item(id, p), std::nullopt));
  EXPECT_EQ(q.size(), pushed.size());
  // Five takes pass over item 0 (fewer than aging_takes): priorities decide, ties by arrival.
  EXPECT_EQ(pop_all(q, 0), (std::vector<int>{6, 2, 4, 5, 0, 1, 3, 7}));
  EXPECT_EQ(q.size(), 0U);
}

TEST(PriorityQueue, TiesAreFirstComeFirstServedWithinEachPriority) {
  task_queue q(1);
  for (int id = 0; id < 12; ++id) ASSERT_TRUE(q.push(item(id, id % 2 == 0 ? 1 : 0), std::nullopt));
  const std::vector<int> got = pop_all(q, 0);
  ASSERT_EQ(got.size(), 12U);
  // Every item of priority 1 before those of priority 0 (6 passes: below the aging bound), each
  // priority in submission order.
  EXPECT_EQ(got, (std::vector<int>{0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11}));
}

TEST(PriorityQueue, PinnedBeforeSharedWithinAPriorityAndAcrossPrioritiesByPriority) {
  task_queue q(1);
  ASSERT_TRUE(q.push(item(0, 0), std::nullopt));
  ASSERT_TRUE(q.push(item(1, 0), 0));
  ASSERT_TRUE(q.push(item(2, 1), std::nullopt));
  ASSERT_TRUE(q.push(item(3, -1), 0));
  EXPECT_EQ(pop_all(q, 0), (std::vector<int>{2, 1, 0, 3}));
}

TEST(PriorityQueue, AgingTakesTheOldestAfterAgingTakesPasses) {
  task_queue q(1);
  ASSERT_TRUE(q.push(item(0, limits::lowest_priority), std::nullopt));
  const int urgent = 3 * static_cast<int>(task_queue::aging_takes);
  for (int id = 1; id <= urgent; ++id)
    ASSERT_TRUE(q.push(item(id, limits::highest_priority), std::nullopt));
  const std::vector<int> got = pop_all(q, 0);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(urgent + 1));
  const auto at = std::find(got.begin(), got.end(), 0) - got.begin();
  // aging_takes urgent items, then the waiting one.
  EXPECT_EQ(at, static_cast<std::ptrdiff_t>(task_queue::aging_takes));
}

TEST(PriorityQueue, LowPriorityProgressesUnderASteadyStreamOfUrgentWork) {
  task_queue q(1);
  // Low items wait while urgent ones keep arriving, one per take (the queue never runs out of
  // urgent work): each low item is still taken within aging_takes + 1 takes of becoming the
  // oldest.
  const int lows = 5;
  for (int id = 0; id < lows; ++id) ASSERT_TRUE(q.push(item(id, -2), std::nullopt));
  int next = 1000;
  ASSERT_TRUE(q.push(item(next++, 2), std::nullopt));
  std::vector<int> low_taken_at;
  for (int take = 0; low_taken_at.size() < static_cast<std::size_t>(lows); ++take) {
    ASSERT_LT(take, 1000) << "low-priority work starved";
    ASSERT_TRUE(q.push(item(next++, 2), std::nullopt));
    const work_item_ptr p = q.pop(0, /*block=*/false);
    ASSERT_TRUE(p);
    if (id_of(p) < lows) {
      EXPECT_EQ(id_of(p), static_cast<int>(low_taken_at.size()));  // in their order
      low_taken_at.push_back(take);
    }
  }
  int previous = -1;
  for (const int at : low_taken_at) {
    EXPECT_LE(at - previous, static_cast<int>(task_queue::aging_takes) + 1);
    previous = at;
  }
}

TEST(PriorityQueue, ALaneStealsHigherPriorityWorkBeforeItsOwnLowerWork) {
  task_queue q(2);
  // Device 0 holds its own (pinned) work of the default priority; urgent items for any device
  // are dealt out over both devices (consecutive pushes of one thread go to each in turn).
  for (int id = 0; id < 4; ++id) ASSERT_TRUE(q.push(item(id, 0), 0));
  ASSERT_TRUE(q.push(item(10, 2), std::nullopt));
  ASSERT_TRUE(q.push(item(11, 2), std::nullopt));
  // Both urgent items first (one of them stolen from device 1; within a priority a lane takes
  // its own device's first), then device 0's own.
  std::vector<int> got = pop_all(q, 0);
  ASSERT_EQ(got.size(), 6U);
  std::sort(got.begin(), got.begin() + 2);
  EXPECT_EQ(got, (std::vector<int>{10, 11, 0, 1, 2, 3}));
}

TEST(PriorityQueue, ALaneStealsDefaultWorkBeforeItsOwnLowPriorityWork) {
  task_queue q(2);
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(q.push(item(id, -1), 0));
  ASSERT_TRUE(q.push(item(10, 0), std::nullopt));
  ASSERT_TRUE(q.push(item(11, 0), std::nullopt));
  std::vector<int> got = pop_all(q, 0);
  ASSERT_EQ(got.size(), 5U);
  std::sort(got.begin(), got.begin() + 2);
  EXPECT_EQ(got, (std::vector<int>{10, 11, 0, 1, 2}));
}

TEST(PriorityQueue, PopSomeTakesInPriorityOrderAndStealsHigherFirst) {
  task_queue q(2);
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(q.push(item(id, 0), 0));
  ASSERT_TRUE(q.push(item(10, 1), 0));
  std::vector<work_item_ptr> out;
  ASSERT_EQ(q.pop_some(0, 2, out, /*block=*/false), 2U);
  ASSERT_EQ(out.size(), 2U);
  EXPECT_EQ(id_of(out[0]), 10);
  EXPECT_EQ(id_of(out[1]), 0);
  // An urgent item only device 1 holds: device 0's lane steals it before its own.
  out.clear();
  ASSERT_TRUE(q.push(item(20, 3), 1));  // pinned: only device 1 may run it
  std::vector<work_item_ptr> urgent;
  urgent.push_back(item(21, 3));
  urgent.push_back(item(22, 3));
  ASSERT_TRUE(q.push_all(urgent));  // one for each device
  std::vector<int> got;
  while (got.size() < 4) {
    out.clear();
    ASSERT_GE(q.pop_some(0, 1, out, /*block=*/false), 1U);
    got.push_back(id_of(out[0]));
  }
  std::sort(got.begin(), got.begin() + 2);
  EXPECT_EQ(got, (std::vector<int>{21, 22, 1, 2}));
}

TEST(PriorityQueue, AgingBoundsStealingPastADevicesOwnWork) {
  task_queue q(2);
  // Urgent work for any device, cut into one run per device; device 0's lane takes its own run.
  const int urgent = 40;
  std::vector<work_item_ptr> items;
  for (int id = 1; id <= urgent; ++id) items.push_back(item(id, 3));
  ASSERT_TRUE(q.push_all(items));
  for (int i = 0; i < urgent / 2; ++i) ASSERT_TRUE(q.pop(0, /*block=*/false));
  // Now only device 1 holds urgent work, and device 0 gets an item only it may run.
  ASSERT_TRUE(q.push(item(0, -3), 0));
  std::vector<int> got;
  while (got.size() < static_cast<std::size_t>(urgent)) {
    auto p = q.pop(0, /*block=*/false);
    ASSERT_TRUE(p);
    got.push_back(id_of(p));
    if (id_of(p) == 0) break;
  }
  // Device 0's lane stole urgent work past its own item aging_takes times, then took its own.
  ASSERT_EQ(got.back(), 0);
  EXPECT_EQ(got.size(), static_cast<std::size_t>(task_queue::aging_takes) + 1);
}

TEST(PriorityQueue, PushAllOfMixedPrioritiesQueuesEachAtItsOwn) {
  task_queue q(1);
  std::vector<work_item_ptr> items;
  items.push_back(item(0, -1));
  items.push_back(item(1, 2));
  items.push_back(item(2, 0));
  items.push_back(item(3, 2));
  ASSERT_TRUE(q.push_all(items));
  EXPECT_TRUE(items.empty());
  EXPECT_EQ(pop_all(q, 0), (std::vector<int>{1, 3, 2, 0}));
}

TEST(PriorityQueue, PushAllOfMixedPrioritiesIntoAClosedQueueLeavesEveryItem) {
  task_queue q(1);
  q.close();
  std::vector<work_item_ptr> items;
  items.push_back(item(0, -1));
  items.push_back(item(1, 2));
  items.push_back(item(2, 0));
  EXPECT_FALSE(q.push_all(items));
  ASSERT_EQ(items.size(), 3U);
  std::vector<int> ids;
  for (const auto& p : items) {
    ASSERT_TRUE(p);
    ids.push_back(id_of(p));
  }
  // The priority that could not be queued (the highest, tried first), then the rest as given.
  EXPECT_EQ(ids, (std::vector<int>{1, 0, 2}));
}

TEST(PriorityQueue, DrainAndRetireReturnEveryItemOfEveryPriority) {
  task_queue q(2);
  int id = 0;
  for (int p = limits::lowest_priority; p <= limits::highest_priority; ++p) {
    ASSERT_TRUE(q.push(item(id++, p), std::nullopt));
    ASSERT_TRUE(q.push(item(id++, p), 1));
  }
  const int total = id;
  auto retired = q.retire(1);
  ASSERT_TRUE(retired);
  // Device 1's pinned items come back highest first.
  std::vector<int> pinned;
  for (const auto& p : retired->pinned) pinned.push_back(id_of(p));
  std::vector<int> want_pinned;
  for (int p = limits::highest_priority; p >= limits::lowest_priority; --p)
    want_pinned.push_back(2 * (p - limits::lowest_priority) + 1);
  EXPECT_EQ(pinned, want_pinned);
  std::size_t back = retired->shared.size();
  ASSERT_TRUE(q.push_all(retired->shared));  // to device 0, each at its priority
  std::vector<int> drained;
  for (auto& [p, device] : q.drain()) {
    EXPECT_FALSE(device.has_value());
    drained.push_back(id_of(p));
  }
  EXPECT_EQ(drained.size() + pinned.size(), static_cast<std::size_t>(total));
  // Every shared item: those device 1 gave back and those device 0 held all along.
  EXPECT_EQ(drained.size(), static_cast<std::size_t>(total) / 2);
  EXPECT_LE(back, drained.size());
  // Shared items are drained in submission order.
  EXPECT_TRUE(std::is_sorted(drained.begin(), drained.end()));
  EXPECT_EQ(q.size(), 0U);
  EXPECT_EQ(q.pop(0, /*block=*/false), nullptr);
}

TEST(PriorityQueue, AnItemOutsideTheRangeIsRefused) {
  task_queue q(1);
  EXPECT_THROW((void)q.push(item(0, limits::highest_priority + 1), std::nullopt),
               std::invalid_argument);
  std::vector<work_item_ptr> items;
  items.push_back(item(1, 0));
  items.push_back(item(2, limits::lowest_priority - 1));
  EXPECT_THROW((void)q.push_all(items), std::invalid_argument);
  EXPECT_EQ(items.size(), 2U);  // left with the caller
  EXPECT_EQ(q.size(), 0U);
}

// --- through an executor on the CPU backend: one device, one lane, held by a first task ---

executor_options one_lane(std::optional<int> priority = std::nullopt) {
  executor_options o = quiet_options(backend_kind::cpu, 1);
  o.cpu_devices = 1;
  if (priority) o.priority = *priority;
  return o;
}

// Records the order tasks ran in.
struct run_log {
  std::mutex mutex;
  std::vector<int> order;
  void add(int id) {
    std::lock_guard lock(mutex);
    order.push_back(id);
  }
};

TEST(PriorityExecutor, SubmitRunsTheHighestPriorityFirst) {
  executor ex(one_lane());
  gate g;
  const auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  run_log log;
  // id, priority (nullopt: the executor's default, 0)
  const std::vector<std::pair<int, std::optional<int>>> tasks = {
      {0, std::nullopt}, {1, -1}, {2, 2}, {3, 2}, {4, 1}, {5, 0}};
  multi_future<void> fs;
  for (const auto& [id, p] : tasks)
    fs.push_back(ex.submit(task_options{p}, [&log, id = id](lane&) { log.add(id); }));
  EXPECT_EQ(ex.queued(), tasks.size());
  g.open();
  for (auto& f : fs) f.get();
  EXPECT_EQ(log.order, (std::vector<int>{2, 3, 4, 0, 5, 1}));
}

TEST(PriorityExecutor, TheExecutorsDefaultPriorityAppliesToCallsWithoutOne) {
  executor ex(one_lane(/*priority=*/-2));
  gate g;
  const auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  run_log log;
  auto a = ex.submit([&](lane&) { log.add(0); });                    // -2, the default
  auto b = ex.submit(task_options{-1}, [&](lane&) { log.add(1); });  // above the default
  auto c = ex.submit_to(0, task_options{-3}, [&](lane&) { log.add(2); });
  g.open();
  a.get();
  b.get();
  c.get();
  EXPECT_EQ(log.order, (std::vector<int>{1, 0, 2}));
}

TEST(PriorityExecutor, AMapsPiecesCarryItsPriorityAndTheTraceShowsIt) {
  executor_options o = one_lane();
  o.chunk_bytes = 4096;  // several pieces per input
  executor ex(o);
  ex.set_tracing(true);
  gate g;
  const auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  const std::uint64_t first = ex.next_task_id();
  run_log log;
  multi_future<void> plain;
  for (int i = 0; i < 3; ++i) plain.push_back(ex.submit([&log, i](lane&) { log.add(i); }));
  const std::vector<std::vector<double>> xs(3, std::vector<double>(2048, 3.0));
  auto urgent = ex.map(builtin_kernel::square(), xs, task_options{.priority = 2});
  g.open();
  for (auto& f : urgent) {
    const auto r = f.get();
    ASSERT_EQ(r.size(), 2048U);
    EXPECT_EQ(r[0], 9.0);
  }
  for (auto& f : plain) f.get();
  const auto records = ex.trace(first).records();
  ASSERT_FALSE(records.empty());
  double first_plain_start = 1e300;
  std::vector<double> urgent_starts;
  for (const auto& r : records) {
    if (r.name == "task") {
      EXPECT_EQ(r.priority, 0);
      first_plain_start = std::min(first_plain_start, r.started);
    } else {
      EXPECT_EQ(r.priority, 2);
      urgent_starts.push_back(r.started);
    }
  }
  ASSERT_GT(urgent_starts.size(), 3U);  // several pieces per input
  // The map, queued last, went before the tasks of the default priority queued before it: all
  // of it, or as much as aging allows before the oldest task is due.
  const auto before = std::count_if(urgent_starts.begin(), urgent_starts.end(),
                                    [&](double t) { return t < first_plain_start; });
  EXPECT_EQ(static_cast<std::size_t>(before),
            std::min<std::size_t>(urgent_starts.size(), detail::task_queue::aging_takes));
}

TEST(PriorityExecutor, CancellingQueuedTasksOfMixedPrioritiesLeavesTheRestInOrder) {
  executor ex(one_lane());
  gate g;
  const auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  run_log log;
  std::vector<future<void>> fs;
  for (int id = 0; id < 8; ++id)
    fs.push_back(ex.submit(task_options{id % 4 - 1}, [&log, id](lane&) { log.add(id); }));
  // Priorities: 0:-1 1:0 2:1 3:2 4:-1 5:0 6:1 7:2. Cancel one of each of two priorities.
  EXPECT_TRUE(fs[3].cancel());
  EXPECT_TRUE(fs[5].cancel());
  g.open();
  for (int id = 0; id < 8; ++id) {
    if (id == 3 || id == 5) {
      EXPECT_THROW(fs[static_cast<std::size_t>(id)].get(), cancelled_error);
    } else {
      fs[static_cast<std::size_t>(id)].get();
    }
  }
  EXPECT_EQ(log.order, (std::vector<int>{7, 2, 6, 1, 0, 4}));
}

TEST(PriorityExecutor, ShutdownCancellingPendingWorkOfMixedPrioritiesEndsEveryFuture) {
  executor ex(one_lane());
  gate g;
  const auto holders = hold_every_lane(ex, g);
  run_log log;
  std::vector<future<void>> fs;
  for (int id = 0; id < 14; ++id)
    fs.push_back(ex.submit(task_options{id % 7 - 3}, [&log, id](lane&) { log.add(id); }));
  const std::vector<std::vector<double>> xs(4, std::vector<double>(512, 2.0));
  auto mapped = ex.map(builtin_kernel::square(), xs, task_options{3});
  std::thread stopper([&] { ex.shutdown(/*cancel_pending=*/true); });
  // The held lane keeps the shutdown from ending; it has drained the queue once nothing is
  // queued.
  while (ex.queued() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  g.open();
  stopper.join();
  for (const auto& f : holders) f.wait();
  for (auto& f : fs) EXPECT_THROW(f.get(), cancelled_error);
  for (auto& f : mapped) EXPECT_THROW((void)f.get(), cancelled_error);
  EXPECT_TRUE(log.order.empty());
}

TEST(PriorityExecutor, ShutdownWithoutCancellingRunsEverythingInPriorityOrder) {
  executor ex(one_lane());
  gate g;
  const auto holders = hold_every_lane(ex, g);
  run_log log;
  std::vector<future<void>> fs;
  for (int id = 0; id < 6; ++id)
    fs.push_back(ex.submit(task_options{id % 3}, [&log, id](lane&) { log.add(id); }));
  std::thread stopper([&] { ex.shutdown(/*cancel_pending=*/false); });
  while (!ex.is_shutdown()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  g.open();
  stopper.join();
  for (auto& f : fs) f.get();
  // 0:0 1:1 2:2 3:0 4:1 5:2
  EXPECT_EQ(log.order, (std::vector<int>{2, 5, 1, 4, 0, 3}));
}

TEST(PriorityExecutor, LowPriorityRunsUnderASteadyStreamOfUrgentTasks) {
  executor ex(one_lane());
  gate g;
  const auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  run_log log;
  std::mutex futures_mutex;
  std::vector<future<void>> chained;
  // Each urgent task submits the next one, so urgent work is always queued while it runs: two
  // such chains of 100 tasks each.
  std::function<void(int)> urgent = [&](int left) {
    std::lock_guard lock(futures_mutex);
    chained.push_back(ex.submit(task_options{limits::highest_priority}, [&, left](lane&) {
      log.add(1);
      if (left > 0) urgent(left - 1);
    }));
  };
  auto low = ex.submit(task_options{limits::lowest_priority}, [&](lane&) { log.add(0); });
  urgent(100);
  urgent(100);
  g.open();
  low.get();
  for (std::size_t i = 0;; ++i) {
    future<void> f;
    {
      std::lock_guard lock(futures_mutex);
      if (i == chained.size()) break;
      f = std::move(chained[i]);
    }
    f.get();
  }
  ASSERT_EQ(log.order.size(), 203U);
  const auto at = std::find(log.order.begin(), log.order.end(), 0) - log.order.begin();
  // Without aging it would run last; with it, after aging_takes urgent tasks.
  EXPECT_EQ(at, static_cast<std::ptrdiff_t>(detail::task_queue::aging_takes));
}

TEST(PriorityExecutor, PrioritiesOutsideTheRangeAreRefusedNamingIt) {
  executor_options bad = one_lane();
  bad.priority = limits::highest_priority + 1;
  try {
    executor ex(bad);
    ADD_FAILURE() << "an executor with priority " << bad.priority << " was made";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("-3 to 3"), std::string::npos) << e.what();
  }
  executor ex(one_lane());
  EXPECT_THROW((void)ex.submit(task_options{4}, [](lane&) {}), std::invalid_argument);
  EXPECT_THROW((void)ex.submit_to(0, task_options{-4}, [](lane&) {}), std::invalid_argument);
  EXPECT_THROW((void)ex.submit_sized(1024, task_options{100}, [](lane&) {}), std::invalid_argument);
  const std::vector<std::vector<double>> xs(2, std::vector<double>(16, 1.0));
  EXPECT_THROW((void)ex.map(builtin_kernel::square(), xs, task_options{-9}), std::invalid_argument);
  // Nothing was queued, and no budget is left taken.
  EXPECT_EQ(ex.queued(), 0U);
  EXPECT_EQ(ex.in_flight().bytes, 0U);
  EXPECT_EQ(ex.submit(task_options{limits::lowest_priority}, [](lane&) { return 7; }).get(), 7);
}

}  // namespace
}  // namespace gpupool
