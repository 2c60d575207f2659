/* bench/async_calls.py's application: N cudaMemsetAsync calls through NVIDIA's libcudart, then one
 * synchronize. Waits for a line on stdin before the calls and before it exits, so that the benchmark
 * can read the server worker's CPU time around them. Prints one line of figures.
 *
 *     async_calls LIBCUDART N */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*memset_fn)(void *, int, size_t, void *);
typedef int (*sync_fn)(void *);

static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void wait_for_line(void) {
    char line[16];
    if (!fgets(line, sizeof line, stdin)) exit(4);
}

int main(int argc, char **argv) {
    if (argc != 3) return 1;
    void *rt = dlopen(argv[1], RTLD_NOW);
    if (!rt) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    long n = atol(argv[2]);
    malloc_fn cuda_malloc = (malloc_fn)dlsym(rt, "cudaMalloc");
    memset_fn memset_async = (memset_fn)dlsym(rt, "cudaMemsetAsync");
    sync_fn stream_sync = (sync_fn)dlsym(rt, "cudaStreamSynchronize");
    void *p;
    if (cuda_malloc(&p, 1 << 20) || memset_async(p, 0, 256, 0) || stream_sync(0)) return 2;
    printf("ready\n");
    fflush(stdout);
    wait_for_line();
    double t0 = seconds(CLOCK_MONOTONIC), app0 = seconds(CLOCK_THREAD_CPUTIME_ID);
    double all0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    for (long i = 0; i < n; i++)
        if (memset_async((char *)p + (i % 4096) * 256, (int)(i & 255), 256, 0)) return 3;
    double t1 = seconds(CLOCK_MONOTONIC), app1 = seconds(CLOCK_THREAD_CPUTIME_ID);
    if (stream_sync(0)) return 3;
    double t2 = seconds(CLOCK_MONOTONIC), all2 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    printf("%.6f %.6f %.6f %.6f\n", t1 - t0, t2 - t0, app1 - app0, all2 - all0);
    fflush(stdout);
    wait_for_line();
    return 0;
}
