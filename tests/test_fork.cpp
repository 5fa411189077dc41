// The fork registry (gpupool/fork.hpp): handlers run in a forked child in registration order,
// fork_generation() counts the forks a process came out of, and fork_fresh<T> gives a child (and
// a grandchild) a fresh object of its own while the parent keeps its one.
#include "gpupool/fork.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

using testing::expect_clean_exit;

// Handlers append their number here (no allocation: a fixed array and a count).
int ran[8];
std::atomic<int> ran_count{0};

void note(void* context) noexcept {
  const int i = ran_count.fetch_add(1, std::memory_order_relaxed);
  if (i < 8) ran[i] = *static_cast<int*>(context);
}

int first_number = 1;
int second_number = 2;

TEST(Fork, HandlersRunInTheChildInRegistrationOrderAndTheGenerationCounts) {
  on_fork_child(note, &first_number);
  on_fork_child(note, &second_number);
  const unsigned before = fork_generation();
  ran_count.store(0);
  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    ::alarm(20);
    int code = 0;
    if (fork_generation() != before + 1)
      code = 10;
    else if (ran_count.load() != 2)
      code = 11;
    else if (ran[0] != 1 || ran[1] != 2)
      code = 12;
    if (code == 0) {
      // A grandchild inherits the registry and counts one fork more.
      ran_count.store(0);
      const pid_t grandchild = ::fork();
      if (grandchild == 0) {
        ::_exit(fork_generation() == before + 2 && ran_count.load() == 2 ? 0 : 13);
      }
      int status = 0;
      if (grandchild == -1 || ::waitpid(grandchild, &status, 0) != grandchild || !WIFEXITED(status))
        code = 14;
      else
        code = WEXITSTATUS(status);
    }
    ::_exit(code);
  }
  expect_clean_exit(child);
  EXPECT_EQ(fork_generation(), before) << "the parent counts no fork";
  EXPECT_EQ(ran_count.load(), 0) << "handlers run in the child only";
}

struct guarded {
  std::mutex mutex;
  std::vector<int> values;
  int marker = 0;
};

fork_fresh<guarded> shared_state;  // constant-initialised at namespace scope

TEST(Fork, AForkedChildGetsAFreshObjectEvenWithTheParentsLockHeld) {
  guarded& mine = shared_state.get();
  EXPECT_EQ(&shared_state.get(), &mine) << "one object per process";
  mine.values = {1, 2, 3};
  mine.marker = 7;
  // Another thread holds the lock at the fork: the child must not inherit it held.
  std::mutex started_mutex;
  std::unique_lock<std::mutex> hold_until_forked(started_mutex);
  std::atomic<bool> locked{false};
  std::thread holder([&] {
    std::lock_guard<std::mutex> lock(mine.mutex);
    locked.store(true);
    std::lock_guard<std::mutex> wait(started_mutex);  // until the parent forked
  });
  while (!locked.load()) std::this_thread::yield();
  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    ::alarm(20);
    guarded& fresh = shared_state.get();
    int code = 0;
    if (&fresh == &mine)
      code = 20;
    else if (fresh.marker != 0 || !fresh.values.empty())
      code = 21;
    else if (!fresh.mutex.try_lock())
      code = 22;
    if (code == 0) {
      fresh.mutex.unlock();
      fresh.marker = 9;
      // A grandchild gets one of its own again.
      const pid_t grandchild = ::fork();
      if (grandchild == 0) ::_exit(shared_state.get().marker == 0 ? 0 : 23);
      int status = 0;
      if (grandchild == -1 || ::waitpid(grandchild, &status, 0) != grandchild || !WIFEXITED(status))
        code = 24;
      else
        code = WEXITSTATUS(status);
      if (code == 0 && shared_state.get().marker != 9) code = 25;  // the child's own stays
    }
    ::_exit(code);
  }
  hold_until_forked.unlock();
  holder.join();
  expect_clean_exit(child);
  EXPECT_EQ(&shared_state.get(), &mine) << "the parent keeps its object";
  EXPECT_EQ(mine.marker, 7);
}

fork_fresh<guarded> never_used_before_fork;

TEST(Fork, AChildForkedBeforeTheFirstUseMakesItsOwn) {
  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    ::alarm(20);
    guarded& made = never_used_before_fork.get();
    ::_exit(&made == &never_used_before_fork.get() && made.marker == 0 ? 0 : 30);
  }
  expect_clean_exit(child);
}

TEST(Fork, RacingFirstUsesAgreeOnOneObject) {
  static fork_fresh<guarded> raced;
  std::vector<std::thread> threads;
  std::vector<guarded*> seen(8, nullptr);
  for (int i = 0; i < 8; ++i) threads.emplace_back([&, i] { seen[i] = &raced.get(); });
  for (auto& t : threads) t.join();
  for (guarded* p : seen) EXPECT_EQ(p, seen[0]);
}

}  // namespace
}  // namespace gpupool
