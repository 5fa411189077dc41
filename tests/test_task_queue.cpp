// The executor's queue on its own: per-device queues, stealing, pinned items, wake-ups, the spin
// of a lane before it sleeps, coalescing (work_item::absorb), close and drain, and many producers
// and consumers at once; then stealing and pinning through an executor on two CPU stand-in devices.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/scheduling/lane_spin.hpp"
#include "core/scheduling/task_queue.hpp"
#include "gpupool/executor.hpp"
#include "inert_item.hpp"
#include "test_support.hpp"

namespace gpupool::detail {
namespace {

using namespace std::chrono_literals;

// An item that only carries an id; items of one kind absorb the items queued behind them, up to
// `capacity` ids in all (kind 0 absorbs nothing).
class test_item final : public gpupool::testing::inert_item {
 public:
  explicit test_item(int id, int kind = 0, std::size_t capacity = 1)
      : id_(id), kind_(kind), capacity_(capacity) {
    trace_id = static_cast<std::uint64_t>(id);
    carried_.reserve(capacity);  // absorb must not allocate (it cannot throw)
  }

  bool absorb(work_item_ptr& next) noexcept override {
    auto* other = dynamic_cast<test_item*>(next.get());
    if (kind_ == 0 || other == nullptr || other->kind_ != kind_ || 1 + carried_.size() >= capacity_)
      return false;
    carried_.push_back(std::move(next));
    return true;
  }

  // This item's id, then the ids of the items it absorbed, in order.
  [[nodiscard]] std::vector<int> ids() const {
    std::vector<int> all{id_};
    for (const auto& c : carried_) all.push_back(static_cast<const test_item&>(*c).id_);
    return all;
  }

 private:
  int id_;
  int kind_;
  std::size_t capacity_;
  std::vector<work_item_ptr> carried_;
};

work_item_ptr item(int id, int kind = 0, std::size_t capacity = 1) {
  return std::make_unique<test_item>(id, kind, capacity);
}

std::vector<int> ids_of(const work_item_ptr& p) {
  return static_cast<const test_item&>(*p).ids();
}

int id_of(const work_item_ptr& p) {
  return ids_of(p).front();
}

std::vector<work_item_ptr> items(int first, int count, int kind = 0, std::size_t capacity = 1) {
  std::vector<work_item_ptr> v;
  for (int i = first; i < first + count; ++i) v.push_back(item(i, kind, capacity));
  return v;
}

// Waits (a few seconds at most) until `done()`; false if it never became true.
bool eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

TEST(TaskQueue, PinnedItemsReachOnlyTheirDevice) {
  task_queue q(2);
  ASSERT_TRUE(q.push(item(1), 1));
  std::vector<work_item_ptr> batch = items(2, 3);
  ASSERT_TRUE(q.push_all(batch, 1));
  EXPECT_TRUE(batch.empty());
  EXPECT_EQ(q.size(), 4u);
  EXPECT_EQ(q.pop(0, /*block=*/false), nullptr);  // device 0 never takes device 1's items
  for (int id = 1; id <= 4; ++id) {
    auto got = q.pop(1, /*block=*/false);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(id_of(got), id);
  }
  EXPECT_EQ(q.size(), 0u);
}

TEST(TaskQueue, ALaneTakesItsPinnedItemsThenItsSharedOnesThenSteals) {
  task_queue q(2);
  std::vector<work_item_ptr> shared = items(0, 4);
  ASSERT_TRUE(q.push_all(shared));  // two runs of two, one per device
  ASSERT_TRUE(q.push(item(10), 0));
  std::vector<int> order;
  while (auto got = q.pop(0, /*block=*/false)) order.push_back(id_of(got));
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order.front(), 10);
  const std::vector<int> rest(order.begin() + 1, order.end());
  // Its own run first, then the other device's, each in order.
  EXPECT_TRUE(rest == (std::vector<int>{0, 1, 2, 3}) || rest == (std::vector<int>{2, 3, 0, 1}))
      << rest[0] << " " << rest[1] << " " << rest[2] << " " << rest[3];
  EXPECT_EQ(q.size(), 0u);
}

TEST(TaskQueue, ADeviceThatRunsDryStealsSharedWorkButNeverPinnedWork) {
  task_queue q(2);
  std::vector<work_item_ptr> shared = items(0, 100);
  ASSERT_TRUE(q.push_all(shared));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(q.push(item(1000 + i), 1));
  std::vector<int> taken;
  while (auto got = q.pop(0, /*block=*/false)) taken.push_back(id_of(got));
  std::sort(taken.begin(), taken.end());
  std::vector<int> expected(100);
  for (int i = 0; i < 100; ++i) expected[static_cast<std::size_t>(i)] = i;
  EXPECT_EQ(taken, expected);  // every shared item, half of them stolen; no pinned one
  EXPECT_EQ(q.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    auto got = q.pop(1, /*block=*/false);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(id_of(got), 1000 + i);
  }
}

TEST(TaskQueue, ABatchIsDealtOutInOneRunPerDevice) {
  task_queue q(4);
  std::vector<work_item_ptr> batch = items(0, 8);
  ASSERT_TRUE(q.push_all(batch));
  EXPECT_EQ(q.size(), 8u);
  // Each device's first item is the head of its own run of two.
  std::vector<int> heads;
  for (int d = 0; d < 4; ++d) heads.push_back(id_of(q.pop(d, /*block=*/false)));
  std::sort(heads.begin(), heads.end());
  EXPECT_EQ(heads, (std::vector<int>{0, 2, 4, 6}));
  // Fewer items than devices: one run each for some of them, all taken.
  std::vector<work_item_ptr> small = items(10, 3);
  ASSERT_TRUE(q.push_all(small));
  EXPECT_EQ(q.size(), 7u);
  int taken = 0;
  while (q.pop(2, /*block=*/false)) ++taken;
  EXPECT_EQ(taken, 7);
}

TEST(TaskQueue, TheLastQueuedItemAbsorbsWhatFollowsAndSizeCountsOnlyQueuedItems) {
  task_queue q(1);
  constexpr int a = 1, b = 2;
  ASSERT_TRUE(q.push(item(0, a, 3), std::nullopt));
  ASSERT_TRUE(q.push(item(1, a, 3), std::nullopt));  // absorbed by 0
  ASSERT_TRUE(q.push(item(2, a, 3), std::nullopt));  // absorbed by 0, which is now full
  EXPECT_EQ(q.size(), 1u);
  ASSERT_TRUE(q.push(item(3, a, 3), std::nullopt));
  ASSERT_TRUE(q.push(item(4, b, 3), std::nullopt));  // another kind: never absorbed by a's
  EXPECT_EQ(q.size(), 3u);
  std::vector<work_item_ptr> batch;
  batch.push_back(item(5, b, 3));
  batch.push_back(item(6, b, 3));
  batch.push_back(item(7, a, 3));
  ASSERT_TRUE(q.push_all(batch));  // 5 and 6 join 4; 7 is queued
  EXPECT_EQ(q.size(), 4u);
  EXPECT_EQ(ids_of(q.pop(0, false)), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(ids_of(q.pop(0, false)), (std::vector<int>{3}));
  EXPECT_EQ(ids_of(q.pop(0, false)), (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(q.size(), 1u);
  // Only an item still queued absorbs: 7 is, until a lane takes it.
  auto seven = q.pop(0, false);
  ASSERT_TRUE(q.push(item(8, a, 3), std::nullopt));
  EXPECT_EQ(ids_of(seven), (std::vector<int>{7}));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(ids_of(q.pop(0, false)), (std::vector<int>{8}));
  EXPECT_EQ(q.size(), 0u);
}

TEST(TaskQueue, ItemsForDifferentDevicesAreNeverAbsorbedTogether) {
  task_queue q(2);
  ASSERT_TRUE(q.push(item(0, 1, 4), 0));
  ASSERT_TRUE(q.push(item(1, 1, 4), 1));
  ASSERT_TRUE(q.push(item(2, 1, 4), 1));  // joins 1, on the same device
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(ids_of(q.pop(0, false)), (std::vector<int>{0}));
  EXPECT_EQ(ids_of(q.pop(1, false)), (std::vector<int>{1, 2}));
}

TEST(TaskQueue, PopSomeTakesSeveralInOrder) {
  task_queue q(1);
  std::vector<work_item_ptr> batch = items(0, 10);
  ASSERT_TRUE(q.push_all(batch));
  std::vector<work_item_ptr> out;
  EXPECT_EQ(q.pop_some(0, 4, out, /*block=*/false), 4u);
  EXPECT_EQ(q.size(), 6u);
  EXPECT_EQ(q.pop_some(0, 100, out, /*block=*/false), 6u);
  ASSERT_EQ(out.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(id_of(out[static_cast<std::size_t>(i)]), i);
  EXPECT_EQ(q.pop_some(0, 4, out, /*block=*/false), 0u);
  EXPECT_EQ(q.pop_some(0, 0, out, /*block=*/false), 0u);
}

TEST(TaskQueue, BadArgumentsAreRefused) {
  EXPECT_THROW(task_queue(0), std::invalid_argument);
  task_queue q(2);
  EXPECT_THROW(q.push(nullptr, std::nullopt), std::invalid_argument);
  EXPECT_THROW(q.push(item(0), 2), std::out_of_range);
  EXPECT_THROW(q.push(item(0), -1), std::out_of_range);
  EXPECT_THROW((void)q.pop(2, false), std::out_of_range);
  std::vector<work_item_ptr> with_null;
  with_null.push_back(item(0));
  with_null.push_back(nullptr);
  EXPECT_THROW(q.push_all(with_null), std::invalid_argument);
  EXPECT_EQ(q.size(), 0u);
}

TEST(TaskQueue, CloseWakesEveryWaitingLaneAndRefusesWork) {
  task_queue q(2);
  std::atomic<int> returned_null{0};
  std::vector<std::thread> lanes;
  for (int d = 0; d < 2; ++d)
    for (int i = 0; i < 2; ++i)
      lanes.emplace_back([&q, &returned_null, d] {
        if (q.pop(d, /*block=*/true) == nullptr) ++returned_null;
      });
  ASSERT_TRUE(eventually([&] { return q.idle_lanes(0) == 2 && q.idle_lanes(1) == 2; }));
  q.close();
  for (auto& t : lanes) t.join();
  EXPECT_EQ(returned_null.load(), 4);
  EXPECT_TRUE(q.closed());
  EXPECT_FALSE(q.push(item(0), std::nullopt));
  std::vector<work_item_ptr> batch = items(1, 2);
  EXPECT_FALSE(q.push_all(batch));
  EXPECT_EQ(batch.size(), 2u);  // left with the caller
  EXPECT_NE(batch[0], nullptr);
  std::vector<work_item_ptr> one = items(3, 1);
  EXPECT_FALSE(q.push_all(one, 1));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_NE(one[0], nullptr);
  EXPECT_EQ(q.size(), 0u);
}

TEST(TaskQueue, ARetiredDeviceGivesBackWhatItHeldTakesNothingMoreAndItsLanesLeave) {
  task_queue q(2);
  ASSERT_TRUE(q.push(item(2), 1));
  ASSERT_TRUE(q.push(item(3), 1));
  std::vector<work_item_ptr> batch = items(10, 4);
  ASSERT_TRUE(q.push_all(batch));  // dealt over both devices: 10, 11 on one, 12, 13 on the other
  const std::size_t before = q.size();
  auto taken = q.retire(1);
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(q.retire(1), nullptr);  // once
  EXPECT_TRUE(q.retired(1));
  EXPECT_FALSE(q.retired(0));
  EXPECT_EQ(q.live_devices(), 1);
  ASSERT_EQ(taken->pinned.size(), 2u);
  EXPECT_EQ(id_of(taken->pinned[0]), 2);
  EXPECT_EQ(id_of(taken->pinned[1]), 3);
  EXPECT_EQ(taken->shared.size(), 2u);
  EXPECT_EQ(q.size(), before - 4);

  // Nothing more for device 1; work for any device goes to device 0 alone.
  EXPECT_FALSE(q.push(item(4), 1));
  std::vector<work_item_ptr> pinned = items(5, 2);
  EXPECT_FALSE(q.push_all(pinned, 1));
  EXPECT_EQ(pinned.size(), 2u);  // left with the caller
  EXPECT_TRUE(q.push_all(taken->shared));
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(q.push(item(20 + i), std::nullopt));
  EXPECT_EQ(q.pop(1, /*block=*/true), nullptr);  // its lanes take nothing, and do not wait
  std::vector<work_item_ptr> none;
  EXPECT_EQ(q.pop_some(1, 8, none, /*block=*/true), 0u);
  std::set<int> on_zero;
  while (auto it = q.pop(0, /*block=*/false)) on_zero.insert(id_of(it));
  EXPECT_EQ(on_zero.size(), 12u);  // 10..13 and 20..27
  EXPECT_EQ(q.size(), 0u);

  // With no device left, nothing is queued.
  std::thread last([&] { EXPECT_EQ(q.pop(0, /*block=*/true), nullptr); });
  ASSERT_TRUE(eventually([&] { return q.idle_lanes(0) == 1; }));
  ASSERT_NE(q.retire(0), nullptr);
  last.join();  // its waiting lane was woken and left
  EXPECT_EQ(q.live_devices(), 0);
  EXPECT_FALSE(q.push(item(30), std::nullopt));
  std::vector<work_item_ptr> rest = items(31, 3);
  EXPECT_FALSE(q.push_all(rest));
  EXPECT_EQ(rest.size(), 3u);
  EXPECT_FALSE(q.closed());
}

TEST(TaskQueue, AClosedQueueStillHandsOutWhatItHolds) {
  task_queue q(2);
  std::vector<work_item_ptr> shared = items(0, 4);
  ASSERT_TRUE(q.push_all(shared));
  ASSERT_TRUE(q.push(item(10), 1));
  q.close();
  std::vector<int> device0;
  while (auto got = q.pop(0, /*block=*/true)) device0.push_back(id_of(got));
  std::sort(device0.begin(), device0.end());
  EXPECT_EQ(device0, (std::vector<int>{0, 1, 2, 3}));  // not device 1's pinned item
  auto pinned = q.pop(1, /*block=*/true);
  ASSERT_NE(pinned, nullptr);
  EXPECT_EQ(id_of(pinned), 10);
  EXPECT_EQ(q.pop(1, /*block=*/true), nullptr);
}

TEST(TaskQueue, DrainReturnsPinnedItemsByDeviceThenTheRestInSubmissionOrder) {
  task_queue q(2);
  std::vector<work_item_ptr> shared = items(0, 6);
  ASSERT_TRUE(q.push_all(shared));
  ASSERT_TRUE(q.push(item(10), 1));
  ASSERT_TRUE(q.push(item(11), 0));
  auto drained = q.drain();
  EXPECT_EQ(q.size(), 0u);
  ASSERT_EQ(drained.size(), 8u);
  EXPECT_EQ(id_of(drained[0].first), 11);
  EXPECT_EQ(drained[0].second, std::optional<int>(0));
  EXPECT_EQ(id_of(drained[1].first), 10);
  EXPECT_EQ(drained[1].second, std::optional<int>(1));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(id_of(drained[static_cast<std::size_t>(2 + i)].first), i);
    EXPECT_EQ(drained[static_cast<std::size_t>(2 + i)].second, std::nullopt);
  }
  EXPECT_EQ(q.pop(0, false), nullptr);
  EXPECT_EQ(q.pop(1, false), nullptr);
}

// Lanes blocked in pop, recording what they take and where.
struct waiting_lanes {
  task_queue& queue;
  std::mutex mutex;
  std::vector<std::pair<int, int>> taken;  // (device, id)
  std::vector<std::thread> threads;

  waiting_lanes(task_queue& q, int devices, int per_device) : queue(q) {
    for (int d = 0; d < devices; ++d)
      for (int i = 0; i < per_device; ++i)
        threads.emplace_back([this, d] {
          while (auto got = queue.pop(d, /*block=*/true)) {
            std::lock_guard lock(mutex);
            taken.emplace_back(d, id_of(got));
          }
        });
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return taken.size();
  }
  void stop() {
    queue.close();
    for (auto& t : threads) t.join();
    threads.clear();
  }
  ~waiting_lanes() {
    if (!threads.empty()) stop();
  }
};

TEST(TaskQueue, EachItemWakesOneLaneAndOnlyOnADeviceThatMayRunIt) {
  task_queue q(2);
  waiting_lanes lanes(q, 2, 4);
  auto all_asleep = [&] { return q.idle_lanes(0) == 4 && q.idle_lanes(1) == 4; };
  ASSERT_TRUE(eventually(all_asleep));
  const std::size_t before = q.wakeups();

  // A pinned item wakes one lane of its device, not every lane.
  ASSERT_TRUE(q.push(item(1), 1));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 1; }));
  ASSERT_TRUE(eventually(all_asleep));
  EXPECT_EQ(q.wakeups() - before, 1u);

  // An item for any device wakes one lane.
  ASSERT_TRUE(q.push(item(2), std::nullopt));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 2; }));
  ASSERT_TRUE(eventually(all_asleep));
  EXPECT_EQ(q.wakeups() - before, 2u);

  // A batch of three pinned items wakes at most three lanes, all of that device.
  std::vector<work_item_ptr> batch = items(3, 3);
  ASSERT_TRUE(q.push_all(batch, 0));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 5; }));
  ASSERT_TRUE(eventually(all_asleep));
  EXPECT_LE(q.wakeups() - before, 5u);
  lanes.stop();
  for (const auto& [device, id] : lanes.taken) {
    if (id == 1) {
      EXPECT_EQ(device, 1);
    }
    if (id >= 3) {
      EXPECT_EQ(device, 0);
    }
  }
}

TEST(TaskQueue, AnItemQueuedWhileALaneSpinsGoesToThatLaneAndWakesNobody) {
  // Three lanes fall asleep once their spin (2 s) ends; an item wakes one, which then spins
  // again beside the two asleep: what comes meanwhile is its, with no wake-up. A batch wakes
  // sleeping lanes only for the items beyond the spinning one.
  task_queue q(1, 2s);
  waiting_lanes lanes(q, 1, 3);
  ASSERT_TRUE(eventually([&] { return q.idle_lanes(0) == 3 && q.spinning_lanes(0) == 0; }));
  const std::size_t before = q.wakeups();
  ASSERT_TRUE(q.push(item(1), std::nullopt));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 1 && q.spinning_lanes(0) == 1; }));
  EXPECT_EQ(q.wakeups() - before, 1u);
  EXPECT_EQ(q.idle_lanes(0), 2);
  // One at a time (two queued together would have the lane that takes the first wake another
  // for the second, as it should).
  ASSERT_TRUE(q.push(item(2), std::nullopt));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 2 && q.spinning_lanes(0) == 1; }));
  ASSERT_TRUE(q.push(item(3), 0));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 3 && q.spinning_lanes(0) == 1; }));
  EXPECT_EQ(q.wakeups() - before, 1u);  // the spinning lane took both
  EXPECT_EQ(q.idle_lanes(0), 2);
  std::vector<work_item_ptr> batch = items(4, 2);
  ASSERT_TRUE(q.push_all(batch));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 5; }));
  // One lane woken, for the item beyond the spinning lane's (the spinning lane may take both
  // first; the woken one then finds nothing), and no other once every lane is back waiting.
  ASSERT_TRUE(eventually([&] { return q.wakeups() - before >= 2; }));
  ASSERT_TRUE(eventually([&] { return q.spinning_lanes(0) + q.idle_lanes(0) == 3; }));
  EXPECT_EQ(q.wakeups() - before, 2u);
  q.close();  // ends the spins at once: the lanes leave long before their 2 s
  const auto t0 = std::chrono::steady_clock::now();
  lanes.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
}

TEST(TaskQueue, LanesSleepOnceTheirSpinEndsAndAnItemThenWakesOne) {
  task_queue q(1, 1ms);
  waiting_lanes lanes(q, 1, 4);
  ASSERT_TRUE(eventually([&] { return q.idle_lanes(0) == 4 && q.spinning_lanes(0) == 0; }));
  const std::size_t before = q.wakeups();
  ASSERT_TRUE(q.push(item(1), std::nullopt));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 1; }));
  ASSERT_TRUE(eventually([&] { return q.idle_lanes(0) == 4; }));
  EXPECT_EQ(q.wakeups() - before, 1u);
}

TEST(TaskQueue, RetiringADeviceEndsItsLanesSpin) {
  task_queue q(2, 10s);
  waiting_lanes lanes(q, 1, 2);  // device 0 only
  ASSERT_TRUE(eventually([&] { return q.spinning_lanes(0) == 2; }));
  ASSERT_NE(q.retire(0), nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& t : lanes.threads) t.join();  // their pops return nothing: they leave
  lanes.threads.clear();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// Pushes one item while the one lane waits (asleep with spin 0, else spinning), then drains
// sparing what lanes on their way will take: how many of `rounds` items were drained.
int drained_while_a_lane_waits(std::chrono::microseconds spin, int rounds) {
  int drained = 0;
  for (int r = 0; r < rounds; ++r) {
    task_queue q(1, spin);
    waiting_lanes lanes(q, 1, 1);
    EXPECT_TRUE(eventually(
        [&] { return spin.count() > 0 ? q.spinning_lanes(0) == 1 : q.idle_lanes(0) == 1; }));
    EXPECT_TRUE(q.push(item(r), std::nullopt));
    drained += q.drain(/*spare_woken=*/true).empty() ? 0 : 1;
    lanes.stop();
  }
  return drained;
}

TEST(TaskQueue, ACancellingDrainSparesTheItemASpinningLaneWillTake) {
  // A push that finds a lane spinning wakes nobody; that lane is on its way all the same.
  EXPECT_EQ(drained_while_a_lane_waits(0us, 50), 0);
  EXPECT_EQ(drained_while_a_lane_waits(10s, 200), 0);
}

TEST(TaskQueue, ALaneLeavingItsSpinForItsOwnItemHandsOnTheStealOfAnotherDevicesItem) {
  // Device 1 has no lanes. Device 0: lanes B and C sleep and lane A spins; each lane holds the
  // item it takes until released (a long task). A batch of two, one item per device, wakes
  // nobody while A spins: A is counted on its way for both. A takes device 0's item and must
  // then hand a wake-up on, so that B or C steals device 1's item instead of leaving it queued
  // while they sleep and A holds its own. Everything runs on one core, A at the lowest
  // priority, so that A is still spinning when the batch's wake-ups are decided.
  cpu_set_t everywhere;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(everywhere), &everywhere), 0);
  const auto one_core = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  };
  one_core();
  for (int round = 0; round < 5; ++round) {
    task_queue q(2, 300ms);
    std::atomic<bool> release{false};
    std::atomic<int> taken{0};
    const auto lane = [&](bool lowest) {
      one_core();
      if (lowest) {
        sched_param p{};
        pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);
      }
      while (auto got = q.pop(0, /*block=*/true)) {
        ++taken;
        while (!release.load()) std::this_thread::sleep_for(200us);  // a long task
      }
    };
    std::vector<std::thread> threads;
    threads.emplace_back(lane, false);
    threads.emplace_back(lane, false);
    ASSERT_TRUE(eventually([&] { return q.idle_lanes(0) == 2 && q.spinning_lanes(0) == 0; }));
    threads.emplace_back(lane, true);
    ASSERT_TRUE(eventually([&] { return q.spinning_lanes(0) == 1; }));
    std::vector<work_item_ptr> batch = items(0, 2);
    ASSERT_TRUE(q.push_all(batch));
    EXPECT_TRUE(eventually([&] { return taken.load() == 2; }))
        << "round " << round << ": " << q.size() << " item(s) left queued while " << q.idle_lanes(0)
        << " lane(s) slept";
    release.store(true);
    q.close();
    for (auto& t : threads) t.join();
  }
  pthread_setaffinity_np(pthread_self(), sizeof(everywhere), &everywhere);
}

TEST(LaneSpin, UnsetAndEmptyMeanTheDefaultAndDigitsAreMicroseconds) {
  EXPECT_EQ(parse_lane_spin(nullptr), default_lane_spin);
  EXPECT_EQ(parse_lane_spin(""), default_lane_spin);
  EXPECT_EQ(parse_lane_spin("0"), 0us);
  EXPECT_EQ(parse_lane_spin("250"), 250us);
  EXPECT_EQ(parse_lane_spin("100000"), longest_lane_spin);
}

TEST(LaneSpin, AnythingElseIsRefusedByName) {
  for (const char* bad :
       {"-1", "+5", " 5", "5 ", "5us", "1e3", "100001", "99999999999999999999", "0x10", "fast"}) {
    try {
      (void)parse_lane_spin(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("GPUPOOL_LANE_SPIN_US must be microseconds"), std::string::npos) << what;
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
    }
  }
}

// A batch the queue cannot make room for (a deque that cannot grow) is not queued at all: every
// item stays with the caller, nothing is counted or can be taken, and the queue works on after.
// The failure is put at each of the first allocations push_all makes in turn, so that some land
// while the deques grow (300 items need several of their blocks), for one device and for any.
TEST(TaskQueue, ABatchThatCannotBeQueuedWholeIsNotQueuedAtAll) {
  for (const std::optional<int> device : {std::optional<int>{0}, std::optional<int>{}}) {
    task_queue q(2);
    std::vector<work_item_ptr> items;
    for (int i = 0; i < 300; ++i) items.push_back(item(i, /*kind=*/1, /*capacity=*/2));
    int refused = 0;
    for (std::size_t failing = 1; failing <= 40; ++failing) {
      if (!gpupool::testing::fail_allocation_on_this_thread(failing))
        GTEST_SKIP() << "this build keeps the standard operator new (sanitizers)";
      bool threw = false;
      try {
        (void)q.push_all(items, device);
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      gpupool::testing::fail_allocation_on_this_thread(0);
      if (!threw) break;  // push_all made fewer allocations than that: it queued the batch
      ++refused;
      ASSERT_EQ(items.size(), 300u) << "failing allocation " << failing;
      for (std::size_t i = 0; i < items.size(); ++i)
        ASSERT_NE(items[i], nullptr)
            << "item " << i << " was taken, failing allocation " << failing;
      EXPECT_EQ(q.size(), 0u) << "failing allocation " << failing;
      EXPECT_EQ(q.pop(0, /*block=*/false), nullptr) << "failing allocation " << failing;
      EXPECT_EQ(q.pop(1, /*block=*/false), nullptr) << "failing allocation " << failing;
    }
    EXPECT_GT(refused, 3);  // the deques' growth was among the failures
    // Then the same batch queues whole, in order (items of kind 1 coalesce in pairs).
    ASSERT_TRUE(q.push_all(items, device));
    EXPECT_TRUE(items.empty());
    std::vector<int> seen;
    for (int d : {0, 1})
      while (auto taken = q.pop(d, /*block=*/false))
        for (int id : ids_of(taken)) seen.push_back(id);
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen.size(), 300u);
    for (int i = 0; i < 300; ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], i);
    q.close();
  }
}

TEST(TaskQueue, ABatchForIdleLanesIsCutIntoOneEntryPerLaneAndASingleItemIsNotAbsorbed) {
  // With every lane busy (none waits here), coalescible items merge as far as they allow.
  {
    task_queue busy(1);
    std::vector<work_item_ptr> batch = items(0, 256, /*kind=*/1, /*capacity=*/256);
    ASSERT_TRUE(busy.push_all(batch, std::nullopt));
    EXPECT_EQ(busy.size(), 1u);
    busy.close();
  }
  task_queue q(1);
  waiting_lanes lanes(q, 1, 4);
  ASSERT_TRUE(eventually([&] { return q.idle_lanes(0) == 4; }));
  // Four waiting lanes: the 256 items become four entries of 64, one for each lane, so that
  // all four start at once.
  std::vector<work_item_ptr> batch = items(0, 256, /*kind=*/1, /*capacity=*/256);
  ASSERT_TRUE(q.push_all(batch, std::nullopt));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 4; }));
  ASSERT_TRUE(eventually([&] { return q.idle_lanes(0) == 4; }));
  // A single item while lanes wait is queued on its own (a lane takes it at once).
  ASSERT_TRUE(q.push(item(1000, 1, 256), std::nullopt));
  ASSERT_TRUE(q.push(item(1001, 1, 256), std::nullopt));
  ASSERT_TRUE(eventually([&] { return lanes.count() == 6; }));
  lanes.stop();
  std::set<int> firsts;
  for (const auto& [device, id] : lanes.taken) firsts.insert(id);
  EXPECT_EQ(firsts, (std::set<int>{0, 64, 128, 192, 1000, 1001}));
}

TEST(TaskQueue, ALaneOfAnotherDeviceIsWokenForSharedItemsNoLaneOfTheirOwnTakes) {
  // Device 1 has no lanes at all: items dealt to it must be stolen by device 0's only lane,
  // which is asleep or busy whenever they arrive.
  task_queue q(2);
  std::atomic<int> taken{0};
  std::thread lane([&] {
    while (q.pop(0, /*block=*/true)) ++taken;
  });
  constexpr int total = 3000;
  for (int i = 0; i < total; ++i) {
    if (i % 2 == 0) {
      ASSERT_TRUE(q.push(item(i), std::nullopt));
    } else {
      std::vector<work_item_ptr> two = items(i * 10, 1);
      ASSERT_TRUE(q.push_all(two));
    }
    if (i % 100 == 0) std::this_thread::sleep_for(200us);  // let the lane fall asleep
  }
  EXPECT_TRUE(eventually([&] { return taken.load() == total; })) << taken.load() << " taken";
  q.close();
  lane.join();
  EXPECT_EQ(taken.load(), total);
  EXPECT_EQ(q.size(), 0u);
}

// Producers and consumers at once, lanes spinning for `spin` before they sleep.
void many_producers_and_consumers(std::chrono::microseconds spin) {
  SCOPED_TRACE("spin " + std::to_string(spin.count()) + " us");
  constexpr int devices = 3, lanes_per_device = 3, producers = 4, per_producer = 4000;
  constexpr int total = producers * per_producer;
  task_queue q(devices, spin);
  // The device each id is pinned to, or -1; written by its producer before it is queued.
  std::vector<int> pinned(total, -1);
  std::vector<std::atomic<int>> seen(total);
  std::atomic<int> consumed{0};
  std::atomic<int> misplaced{0};

  std::vector<std::thread> lanes;
  for (int d = 0; d < devices; ++d)
    for (int l = 0; l < lanes_per_device; ++l)
      lanes.emplace_back([&, d, l] {
        auto record = [&](const work_item_ptr& got) {
          for (int id : ids_of(got)) {
            seen[static_cast<std::size_t>(id)].fetch_add(1);
            const int p = pinned[static_cast<std::size_t>(id)];
            if (p >= 0 && p != d) ++misplaced;
            ++consumed;
          }
        };
        if (l % 2 == 0) {
          while (auto got = q.pop(d, /*block=*/true)) record(got);
        } else {
          std::vector<work_item_ptr> out;
          while (q.pop_some(d, 3, out, /*block=*/true) > 0) {
            for (const auto& got : out) record(got);
            out.clear();
          }
        }
      });

  std::vector<std::thread> makers;
  for (int p = 0; p < producers; ++p)
    makers.emplace_back([&, p] {
      // Single items and batches of three, some pinned; shared items (kind 1) and items pinned
      // to one device (kind 2) absorb those queued behind them, up to four.
      const int first = p * per_producer;
      for (int i = 0; i < per_producer;) {
        const int id = first + i;
        if (id % 5 == 0 && i + 3 <= per_producer) {
          const std::optional<int> target =
              (id / 5) % 4 == 0 ? std::optional<int>((id / 5) % devices) : std::nullopt;
          std::vector<work_item_ptr> batch;
          for (int k = 0; k < 3; ++k) {
            pinned[static_cast<std::size_t>(id + k)] = target.value_or(-1);
            batch.push_back(item(id + k, target ? 2 : 1, 4));
          }
          ASSERT_TRUE(q.push_all(batch, target));
          i += 3;
        } else {
          const std::optional<int> target =
              id % 7 == 0 ? std::optional<int>(id % devices) : std::nullopt;
          pinned[static_cast<std::size_t>(id)] = target.value_or(-1);
          ASSERT_TRUE(q.push(item(id, target ? 2 : 1, 4), target));
          ++i;
        }
      }
    });
  for (auto& t : makers) t.join();
  // Every item is taken without closing the queue: a lost wake-up would leave some behind.
  EXPECT_TRUE(eventually([&] { return consumed.load() == total; }))
      << consumed.load() << " of " << total << " taken, " << q.size() << " queued";
  q.close();
  for (auto& t : lanes) t.join();
  int missing = 0, duplicated = 0;
  for (auto& s : seen) {
    missing += s.load() == 0 ? 1 : 0;
    duplicated += s.load() > 1 ? 1 : 0;
  }
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(duplicated, 0);
  EXPECT_EQ(misplaced.load(), 0);
  EXPECT_EQ(q.size(), 0u);
}

TEST(TaskQueue, ManyProducersAndConsumersLoseAndDuplicateNothing) {
  for (const auto spin : {0us, 50us, 1000us}) many_producers_and_consumers(spin);
}

// Through the executor, on two CPU stand-in devices.
executor_options two_stand_in_devices(int lanes) {
  executor_options o;
  o.backend = backend_kind::cpu;
  o.cpu_devices = 2;
  o.lanes_per_device = lanes;
  o.quiet = true;
  return o;
}

TEST(Scheduling, WorkForAnyDeviceRunsOnTheOtherWhileOneDevicesLanesAreAllBusy) {
  executor ex(two_stand_in_devices(2));
  std::atomic<int> blocked{0};
  std::atomic<bool> release{false};
  std::vector<future<void>> holders;
  for (int i = 0; i < 2; ++i)
    holders.push_back(ex.submit_to(0, [&](lane&) {
      ++blocked;
      const auto deadline = std::chrono::steady_clock::now() + 30s;
      while (!release.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(100us);
    }));
  ASSERT_TRUE(eventually([&] { return blocked.load() == 2; }));
  // Half of these are dealt to device 0, whose lanes cannot take them: device 1 steals them.
  std::vector<future<int>> tasks;
  for (int i = 0; i < 200; ++i) tasks.push_back(ex.submit([](lane& l) { return l.device(); }));
  for (auto& t : tasks) {
    ASSERT_TRUE(t.wait_for(20s)) << "a task waited for a busy device";
    EXPECT_EQ(t.get(), 1);
  }
  release.store(true);
  for (auto& h : holders) h.get();
}

TEST(Scheduling, TasksForADeviceRunOnlyThere) {
  executor ex(two_stand_in_devices(3));
  std::vector<future<int>> tasks;
  for (int i = 0; i < 300; ++i)
    tasks.push_back(ex.submit_to(i % 2, [](lane& l) { return l.device(); }));
  for (int i = 0; i < 300; ++i) EXPECT_EQ(tasks[static_cast<std::size_t>(i)].get(), i % 2);
}

}  // namespace
}  // namespace gpupool::detail
