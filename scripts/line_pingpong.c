// How long one cache line takes to move between CPU 0 and CPU 1: two
// threads, pinned, hand one atomic word back and forth. A shared reference
// count that both cores write (an Arc clone per request) pays this each
// time the line moves. BENCHMARKS.md, issue 20.
//   gcc -O2 -pthread scripts/line_pingpong.c -o /tmp/pingpong && /tmp/pingpong
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define ROUNDS 2000000L
static _Atomic long flag __attribute__((aligned(64)));

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *other(void *arg) {
  (void)arg;
  pin(1);
  for (long i = 0; i < ROUNDS; i++) {
    while (atomic_load(&flag) != 2 * i + 1) {
    }
    atomic_store(&flag, 2 * i + 2);
  }
  return NULL;
}

int main(void) {
  pthread_t t;
  struct timespec a, b;
  pthread_create(&t, NULL, other, NULL);
  pin(0);
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < ROUNDS; i++) {
    while (atomic_load(&flag) != 2 * i) {
    }
    atomic_store(&flag, 2 * i + 1);
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  pthread_join(t, NULL);
  double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
  printf("one cache-line move between CPU 0 and CPU 1: %.1f ns\n", ns / ROUNDS / 2);
  return 0;
}
