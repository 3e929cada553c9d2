// How long one thread takes to hand work to a thread on the other core and get an answer back: the cost XLA:CPU
// pays whenever a parallel operation has to wake a sleeping worker (docs/performance.md).
//
//   gcc -O2 -pthread tools/handoff_latency.c -o /tmp/handoff_latency && /tmp/handoff_latency
//
// Two threads pinned to CPUs 0 and 1 pass a counter back and forth, 20,000 round trips, first sleeping in
// futex waits between turns (how thread pools park idle workers), then busy-polling (how a spinning worker waits).

#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { kRoundTrips = 20000 };

static atomic_int turn;
static int sleeping;  // 1: futex waits; 0: busy-polling

static void wait_while(int value) {
  while (atomic_load(&turn) == value) {
    if (sleeping) syscall(SYS_futex, &turn, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
  }
}

static void pass(int value) {
  atomic_store(&turn, value);
  if (sleeping) syscall(SYS_futex, &turn, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
    fprintf(stderr, "handoff_latency: cannot pin a thread to CPU %d\n", cpu);
    exit(1);
  }
}

static void *answer(void *unused) {
  (void)unused;
  pin(1);
  for (int i = 0; i < kRoundTrips; i++) {
    wait_while(2 * i);  // until the ping 2i + 1 arrives
    pass(2 * i + 2);
  }
  return NULL;
}

static double round_trip_us(int sleep) {
  sleeping = sleep;
  atomic_store(&turn, 0);
  pthread_t other;
  pthread_create(&other, NULL, answer, NULL);
  struct timespec start, end;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (int i = 0; i < kRoundTrips; i++) {
    pass(2 * i + 1);
    wait_while(2 * i + 1);  // until the answer 2i + 2 arrives
  }
  clock_gettime(CLOCK_MONOTONIC, &end);
  pthread_join(other, NULL);
  return ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / 1e3 / kRoundTrips;
}

int main(void) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    fprintf(stderr, "handoff_latency: needs at least 2 CPUs\n");
    return 1;
  }
  pin(0);
  printf("round trip between CPUs 0 and 1: %.2f us sleeping in futex waits, %.2f us busy-polling\n",
         round_trip_us(1), round_trip_us(0));
  return 0;
}
