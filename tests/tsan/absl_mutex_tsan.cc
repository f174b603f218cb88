// ThreadSanitizer annotations for Debian's uninstrumented Abseil (LD_PRELOADed by the tsan stage
// of deploy/test.sh). libabsl_synchronization is not built with TSan, so TSan cannot see that
// absl::Mutex orders memory accesses and reports every access guarded by one as a race. This
// library interposes the exported Mutex and CondVar entry points, calls the real ones (dlsym
// RTLD_NEXT) and tells TSan about each acquire and release (__tsan_mutex_* API). It binds to
// Debian 12's inline namespace (absl::debian3); elsewhere it finds nothing and aborts loudly.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"

extern "C" {
void __tsan_mutex_pre_lock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_mutex_post_lock(void* addr, unsigned flags, int recursion) __attribute__((weak));
int __tsan_mutex_pre_unlock(void* addr, unsigned flags) __attribute__((weak));
void __tsan_mutex_post_unlock(void* addr, unsigned flags) __attribute__((weak));
}

namespace {

constexpr unsigned kRead = 1 << 3;       // __tsan_mutex_read_lock
constexpr unsigned kTry = 1 << 4;        // __tsan_mutex_try_lock
constexpr unsigned kTryFailed = 1 << 5;  // __tsan_mutex_try_lock_failed

template <typename F>
F Real(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (p == nullptr) {
    std::fprintf(stderr, "absl_mutex_tsan: %s not found (not Debian 12's Abseil?)\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(p);
}

// Abseil's entry points call each other (CondVar::WaitWithTimeout calls WaitWithDeadline, the
// timed LockWhen/Await forms call the deadline ones): through the PLT those inner calls land in
// this library again. Only the outermost interposed call on a thread annotates; nested ones pass
// straight through, or TSan would see the mutex released twice.
thread_local int g_depth = 0;
struct Nest {
  Nest() { ++g_depth; }
  ~Nest() { --g_depth; }
  Nest(const Nest&) = delete;
  Nest& operator=(const Nest&) = delete;
};
bool Outermost() { return g_depth == 1; }

void Acquiring(void* m, unsigned flags = 0) {
  if (!Outermost()) return;
  if (__tsan_mutex_pre_lock != nullptr) __tsan_mutex_pre_lock(m, flags);
}
void Acquired(void* m, unsigned flags = 0) {
  if (!Outermost()) return;
  if (__tsan_mutex_post_lock != nullptr) __tsan_mutex_post_lock(m, flags, 0);
}
void Releasing(void* m, unsigned flags = 0) {
  if (!Outermost()) return;
  if (__tsan_mutex_pre_unlock != nullptr) __tsan_mutex_pre_unlock(m, flags);
}
void Released(void* m, unsigned flags = 0) {
  if (!Outermost()) return;
  if (__tsan_mutex_post_unlock != nullptr) __tsan_mutex_post_unlock(m, flags);
}

#define MC_NS "_ZN4absl7debian3"

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  Nest nest;
  static auto real = Real<void (*)(Mutex*)>(MC_NS "5Mutex4LockEv");
  Acquiring(this);
  real(this);
  Acquired(this);
}
void Mutex::Unlock() {
  Nest nest;
  static auto real = Real<void (*)(Mutex*)>(MC_NS "5Mutex6UnlockEv");
  Releasing(this);
  real(this);
  Released(this);
}
void Mutex::ReaderLock() {
  Nest nest;
  static auto real = Real<void (*)(Mutex*)>(MC_NS "5Mutex10ReaderLockEv");
  Acquiring(this, kRead);
  real(this);
  Acquired(this, kRead);
}
void Mutex::ReaderUnlock() {
  Nest nest;
  static auto real = Real<void (*)(Mutex*)>(MC_NS "5Mutex12ReaderUnlockEv");
  Releasing(this, kRead);
  real(this);
  Released(this, kRead);
}
bool Mutex::TryLock() {
  Nest nest;
  static auto real = Real<bool (*)(Mutex*)>(MC_NS "5Mutex7TryLockEv");
  Acquiring(this, kTry);
  const bool ok = real(this);
  Acquired(this, ok ? kTry : kTry | kTryFailed);
  return ok;
}
bool Mutex::ReaderTryLock() {
  Nest nest;
  static auto real = Real<bool (*)(Mutex*)>(MC_NS "5Mutex13ReaderTryLockEv");
  Acquiring(this, kRead | kTry);
  const bool ok = real(this);
  Acquired(this, kRead | (ok ? kTry : kTry | kTryFailed));
  return ok;
}
void Mutex::LockWhen(const Condition& cond) {
  Nest nest;
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>(MC_NS "5Mutex8LockWhenERKNS0_9ConditionE");
  Acquiring(this);
  real(this, cond);
  Acquired(this);
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  Nest nest;
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>(MC_NS "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Acquiring(this, kRead);
  real(this, cond);
  Acquired(this, kRead);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  Nest nest;
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      MC_NS "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Acquiring(this);
  const bool r = real(this, cond, timeout);
  Acquired(this);
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  Nest nest;
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      MC_NS "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Acquiring(this);
  const bool r = real(this, cond, deadline);
  Acquired(this);
  return r;
}
// Await releases the mutex while it waits: a release, then an acquire.
void Mutex::Await(const Condition& cond) {
  Nest nest;
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>(MC_NS "5Mutex5AwaitERKNS0_9ConditionE");
  Releasing(this);
  Released(this);
  Acquiring(this);
  real(this, cond);
  Acquired(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  Nest nest;
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      MC_NS "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Releasing(this);
  Released(this);
  Acquiring(this);
  const bool r = real(this, cond, timeout);
  Acquired(this);
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  Nest nest;
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      MC_NS "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Releasing(this);
  Released(this);
  Acquiring(this);
  const bool r = real(this, cond, deadline);
  Acquired(this);
  return r;
}
void CondVar::Wait(Mutex* mu) {
  Nest nest;
  static auto real = Real<void (*)(CondVar*, Mutex*)>(MC_NS "7CondVar4WaitEPNS0_5MutexE");
  Releasing(mu);
  Released(mu);
  Acquiring(mu);
  real(this, mu);
  Acquired(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  Nest nest;
  static auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      MC_NS "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Releasing(mu);
  Released(mu);
  Acquiring(mu);
  const bool r = real(this, mu, timeout);
  Acquired(mu);
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  Nest nest;
  static auto real = Real<bool (*)(CondVar*, Mutex*, Time)>(
      MC_NS "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Releasing(mu);
  Released(mu);
  Acquiring(mu);
  const bool r = real(this, mu, deadline);
  Acquired(mu);
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
