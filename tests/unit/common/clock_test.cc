// Waiting on the Clock seam (RealClock, FakeClock) and PeriodicThread on top of it. Every wait
// here ends on an event or on a clock the test moves; none sleeps for a fixed time.
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/periodic_thread.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"

namespace mc {
namespace {

// A flag guarded by a mutex, the shape of every wait in the daemons.
struct Flag {
  absl::Mutex mu;
  bool set ABSL_GUARDED_BY(mu) = false;
  void Set() {
    absl::MutexLock lock(&mu);
    set = true;
  }
  // Waits on `clock` until set or `deadline_ms`.
  bool Wait(const Clock& clock, int64_t deadline_ms) {
    absl::MutexLock lock(&mu);
    return clock.WaitUntil(mu, absl::Condition(&set), deadline_ms);
  }
};

TEST(RealClock, WaitUntilReturnsOnceTheConditionHolds) {
  const RealClock& clock = RealClock::Get();
  Flag flag;
  std::thread setter([&] { flag.Set(); });
  // A deadline no run reaches: only the condition can end the wait.
  EXPECT_TRUE(flag.Wait(clock, clock.NowMs() + 3'600'000));
  setter.join();
}

TEST(RealClock, WaitUntilReturnsFalseAtTheDeadline) {
  const RealClock& clock = RealClock::Get();
  Flag flag;
  const int64_t deadline = clock.NowMs() + 20;
  EXPECT_FALSE(flag.Wait(clock, deadline));
  EXPECT_GE(clock.NowMs(), deadline);
}

TEST(RealClock, WaitUntilDoesNotWaitForAConditionThatHolds) {
  Flag flag;
  flag.Set();
  EXPECT_TRUE(flag.Wait(RealClock::Get(), RealClock::Get().NowMs() + 3'600'000));
}

TEST(FakeClock, SleepAdvancesTheClockAndRunsTheHook) {
  FakeClock clock(1000);
  std::vector<int64_t> hooked;
  clock.SetOnSleep([&](int64_t ms) { hooked.push_back(ms); });
  clock.SleepForMs(5);
  clock.SleepForMs(0);
  EXPECT_EQ(clock.NowMs(), 1005);
  EXPECT_EQ(hooked, (std::vector<int64_t>{5, 0}));
  EXPECT_EQ(clock.sleeps(), 2u);
}

TEST(FakeClock, AWaitEndsWhenTheTestMovesTheClockToItsDeadline) {
  FakeClock clock(1000);
  Flag flag;
  bool result = true;
  std::thread waiter([&] { result = flag.Wait(clock, 1100); });
  ASSERT_TRUE(clock.AwaitWaiting(1));
  clock.AdvanceMs(99);
  EXPECT_EQ(clock.waiting(), 1u) << "short of the deadline: still waiting";
  clock.AdvanceMs(1);
  waiter.join();
  EXPECT_FALSE(result);
  EXPECT_EQ(clock.waiting(), 0u);
}

TEST(FakeClock, AWaitEndsWhenItsConditionHolds) {
  FakeClock clock(1000);
  Flag flag;
  bool result = false;
  std::thread waiter([&] { result = flag.Wait(clock, 1100); });
  ASSERT_TRUE(clock.AwaitWaiting(1));
  flag.Set();
  waiter.join();
  EXPECT_TRUE(result);
  EXPECT_EQ(clock.NowMs(), 1000) << "no time passed";
}

TEST(FakeClock, SetMsWakesEveryWaiterItPasses) {
  FakeClock clock(0);
  Flag a, b;
  std::thread wa([&] { EXPECT_FALSE(a.Wait(clock, 10)); });
  std::thread wb([&] { EXPECT_FALSE(b.Wait(clock, 20)); });
  ASSERT_TRUE(clock.AwaitWaiting(2));
  clock.SetMs(50);
  wa.join();
  wb.join();
  EXPECT_EQ(clock.waits_begun(), 2u);
}

// A task that records when it ran (on the fake clock) and asks for `period_ms` each time.
struct Recorder {
  explicit Recorder(const FakeClock& clock, int64_t period_ms = 100)
      : clock(clock), period_ms(period_ms) {}
  int64_t Run() {
    absl::MutexLock lock(&mu);
    at.push_back(clock.NowMs());
    return period_ms;
  }
  std::vector<int64_t> Runs() {
    absl::MutexLock lock(&mu);
    return at;
  }
  const FakeClock& clock;
  int64_t period_ms;
  absl::Mutex mu;
  std::vector<int64_t> at ABSL_GUARDED_BY(mu);
};

TEST(PeriodicThread, RunsAfterTheFirstDelayThenEveryPeriod) {
  FakeClock clock(0);
  Recorder rec(clock);
  PeriodicThread thread(clock, [&] { return rec.Run(); });
  thread.Start(50);
  ASSERT_TRUE(clock.AwaitWaiting(1));
  clock.AdvanceMs(50);
  // The thread waits again once it has run: its second wait proves the run is done.
  ASSERT_TRUE(clock.AwaitWaitsBegun(2));
  EXPECT_EQ(rec.Runs(), (std::vector<int64_t>{50}));
  clock.AdvanceMs(60);  // short of the period: no run (the times below would show one at 110)
  clock.AdvanceMs(40);
  ASSERT_TRUE(clock.AwaitWaitsBegun(3));
  EXPECT_EQ(rec.Runs(), (std::vector<int64_t>{50, 150}));
  EXPECT_EQ(thread.runs(), 2u);
  thread.Stop();
}

TEST(PeriodicThread, WakeNowRunsAtOnce) {
  FakeClock clock(0);
  Recorder rec(clock, 3'600'000);
  PeriodicThread thread(clock, [&] { return rec.Run(); });
  thread.Start(3'600'000);
  ASSERT_TRUE(clock.AwaitWaiting(1));
  thread.WakeNow();
  ASSERT_TRUE(clock.AwaitWaitsBegun(2));
  EXPECT_EQ(rec.Runs(), (std::vector<int64_t>{0})) << "no time had to pass";
}

TEST(PeriodicThread, AZeroWaitRunsAgainAtOnceUntilTheTaskAsksForMore) {
  FakeClock clock(0);
  int runs = 0;
  PeriodicThread thread(clock, [&] { return ++runs < 3 ? 0 : 3'600'000; });
  thread.Start(0);
  ASSERT_TRUE(clock.AwaitWaitsBegun(1));
  EXPECT_EQ(thread.runs(), 3u);
  EXPECT_EQ(clock.NowMs(), 0);
}

TEST(PeriodicThread, StopEndsAWaitAtOnce) {
  // On the real clock, with an hour to wait: only Stop() can end it.
  int runs = 0;
  PeriodicThread thread(RealClock::Get(), [&] { return ++runs, 3'600'000; });
  thread.Start(3'600'000);
  thread.Stop();
  EXPECT_EQ(runs, 0);
  EXPECT_TRUE(thread.stopping());
  thread.Stop();  // idempotent
  thread.Start(0);
  EXPECT_EQ(thread.runs(), 0u) << "a stopped thread does not start again";
}

TEST(PeriodicThread, StopWaitsForTheRunningTaskWhichSeesStopping) {
  FakeClock clock(0);
  absl::Notification in_task;
  bool saw_stopping = false;
  PeriodicThread* self = nullptr;
  PeriodicThread thread(clock, [&] {
    in_task.Notify();
    // A long task checks stopping() between its steps.
    while (!self->stopping()) clock.SleepForMs(1);
    saw_stopping = true;
    return int64_t{0};
  });
  self = &thread;
  thread.Start(0);
  in_task.WaitForNotification();
  thread.Stop();
  EXPECT_TRUE(saw_stopping);
  EXPECT_EQ(thread.runs(), 1u);
}

TEST(PeriodicThread, KStopEndsTheThread) {
  FakeClock clock(0);
  absl::Notification ran;
  PeriodicThread thread(clock, [&] {
    ran.Notify();
    return PeriodicThread::kStop;
  });
  thread.Start(0);
  ran.WaitForNotification();
  thread.Stop();  // joins a thread that ended on its own
  EXPECT_EQ(thread.runs(), 1u);
  EXPECT_EQ(clock.waits_begun(), 0u);
}

}  // namespace
}  // namespace mc
