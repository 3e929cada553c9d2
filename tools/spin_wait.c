// Makes XLA:CPU's idle intra-op workers spin for a while before they sleep: an LD_PRELOAD experiment for the
// sampler benchmark (docs/performance.md). On this 2-vCPU VM waking a sleeping thread costs ~35 us
// (tools/handoff_latency.c) and XLA:CPU wakes its parked worker ~27 times per denoising step; OpenMP's workers,
// which torch uses, spin by default.
//
//   gcc -O2 -shared -fPIC -pthread tools/spin_wait.c -o /tmp/spin_wait.so -ldl
//   LD_PRELOAD=/tmp/spin_wait.so python scripts/bench_sampler.py --matmul_dtype=bfloat16
//
// The workers park in two ways, and both are wrapped: Eigen's thread pool waits on a std::condition_variable,
// and absl's Mutex/CondVar call syscall(SYS_futex, FUTEX_WAIT...). A wrapped wait first polls for up to SPIN_US
// microseconds (default 1000) for a notify / a change of the futex word, then sleeps as before. Returning early
// is a spurious wake-up, which both kinds of caller allow (they re-check their condition). Only threads named
// SPIN_THREAD_NAME (default "tf_XLAEigen", XLA:CPU's pool) spin, at most SPIN_MAX (default 1) at a time, so the
// thread doing the work keeps a core; every other thread of the process (torch's included) waits as before.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>

// Notify counts per condition variable (hashed into buckets): a polling waiter returns when its own changes, so that
// other threads' notifies (torch's pool, say) do not keep it polling.
static atomic_uint notifies[4096];
static atomic_int spinning;   // threads polling now
static long spin_ns = -1;
static int max_spinning = -1;
static __thread int is_spinner = -1;

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

// Whether this thread may poll now; on 1 the caller must call end_poll().
static int begin_poll(void) {
  if (spin_ns < 0) {
    const char* us = getenv("SPIN_US");
    const char* max = getenv("SPIN_MAX");
    spin_ns = (us ? atol(us) : 1000) * 1000L;
    max_spinning = max ? atoi(max) : 1;
  }
  if (is_spinner < 0) {
    const char* want = getenv("SPIN_THREAD_NAME");
    char name[32] = {0};
    pthread_getname_np(pthread_self(), name, sizeof name);
    is_spinner = strcmp(name, want ? want : "tf_XLAEigen") == 0;
  }
  if (!is_spinner || spin_ns <= 0) return 0;
  if (atomic_fetch_add(&spinning, 1) < max_spinning) return 1;
  atomic_fetch_sub(&spinning, 1);
  return 0;
}

static void end_poll(void) { atomic_fetch_sub(&spinning, 1); }

// Polls until changed(arg) or the budget is spent; returns whether it changed.
static int poll_for(int (*changed)(const void*, unsigned), const void* arg, unsigned seen) {
  long end = now_ns() + spin_ns;
  for (int i = 1;; i++) {
    if (changed(arg, seen)) return 1;
    _mm_pause();
    if (i % 64 == 0 && now_ns() > end) return 0;
  }
}

static atomic_uint* notify_count(const void* cv) { return &notifies[((unsigned long)cv >> 4) % 4096]; }

static int notified(const void* cv, unsigned seen) {
  return atomic_load_explicit(notify_count(cv), memory_order_acquire) != seen;
}

static int word_changed(const void* word, unsigned value) { return *(volatile const int*)word != (int)value; }

struct unique_lock { pthread_mutex_t* mutex; _Bool owns; };

// The condition variable this thread last polled in vain, and its notify count then: until that count moves, the
// thread is idle and sleeps at once (else the timed sleep below, then a poll, then again... would keep a core busy).
static __thread const void* idle_cv;
static __thread unsigned idle_seen;

// std::condition_variable::wait(std::unique_lock<std::mutex>&)
void _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE(pthread_cond_t* cv, struct unique_lock* lock) {
  unsigned seen = atomic_load_explicit(notify_count(cv), memory_order_acquire);  // (under the lock: none lost)
  if ((cv == idle_cv && seen == idle_seen) || !begin_poll()) {
    pthread_cond_wait(cv, lock->mutex);  // (the lock held since the caller's check: no notify is missed)
    return;
  }
  pthread_mutex_unlock(lock->mutex);
  int changed = poll_for(notified, cv, seen);
  end_poll();
  pthread_mutex_lock(lock->mutex);
  if (changed || notified(cv, seen)) return;
  idle_cv = cv;
  idle_seen = seen;
  // A notify between that check and the wait below would find no sleeper (notifiers may signal after unlocking):
  // sleep in 2 ms slices, each ending in a spurious wake-up, rather than forever.
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += 2000000;
  if (until.tv_nsec >= 1000000000) { until.tv_sec++; until.tv_nsec -= 1000000000; }
  pthread_cond_timedwait(cv, lock->mutex, &until);
}

void _ZNSt18condition_variable10notify_oneEv(pthread_cond_t* cv) {
  atomic_fetch_add_explicit(notify_count(cv), 1, memory_order_release);
  pthread_cond_signal(cv);
}

void _ZNSt18condition_variable10notify_allEv(pthread_cond_t* cv) {
  atomic_fetch_add_explicit(notify_count(cv), 1, memory_order_release);
  pthread_cond_broadcast(cv);
}

long syscall(long number, ...) {
  static long (*real)(long, ...);
  if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_futex) {
    int op = (int)a[1] & FUTEX_CMD_MASK;
    // (Untimed waits only: a thread that sleeps with a timeout is polling for something itself, and spinning
    // before each of its naps would keep a core busy while the process is idle.)
    if ((op == FUTEX_WAIT || op == FUTEX_WAIT_BITSET) && a[3] == 0 && begin_poll()) {
      int changed = poll_for(word_changed, (const void*)a[0], (unsigned)a[2]);
      end_poll();
      if (changed) return 0;
    }
  }
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
