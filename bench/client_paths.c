/* What a driver call costs the application's thread on each path the client could take
 * (issue: a client that never needs the application's GIL). Driven by bench/client_paths.py.
 *
 *   client_paths shim N         through the shim as built today: cuCtxGetFlags (answered in the
 *                               client core's Python), cuMemsetD8Async (queued in C, the lane),
 *                               cuGetProcAddress (answered in C) for the floor of an entry point,
 *                               and cuCtxGetDevice (answered in C from the core's table, answers.h)
 *   client_paths futex N        a round trip to another process over shared memory and futexes,
 *                               the peer in C: the floor of any out-of-process client
 *   client_paths peer N CMD...  the same round trip with CMD as the peer (a Python helper), the
 *                               shared page passed as file descriptor 3
 *   client_paths ring N CMD...  N 64-byte records enqueued into a shared ring that CMD drains,
 *                               no answers: what a C-encoded async call costs its caller
 *
 * Each prints one line: `<path> <ns per call, caller's wall clock> [<extra>]`.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RING_SLOTS 4096  /* records of 64 bytes */

typedef struct {
    /* round trips: the caller bumps `request`, the peer answers by copying it to `answer` */
    _Alignas(64) uint32_t request;
    _Alignas(64) uint32_t answer;
    /* the ring: the producer owns `head`, the consumer `tail`; `wake` counts producer nudges */
    _Alignas(64) uint64_t head;
    _Alignas(64) uint64_t tail;
    _Alignas(64) uint32_t consumer_sleeping;
    _Alignas(64) unsigned char records[RING_SLOTS][64];
} shared_page;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void futex_wait(uint32_t *addr, uint32_t value) {
    syscall(SYS_futex, addr, FUTEX_WAIT, value, NULL, NULL, 0);
}

static void futex_wake(uint32_t *addr) { syscall(SYS_futex, addr, FUTEX_WAKE, 1, NULL, NULL, 0); }

/* Wait until *addr != value: spin a little first (a peer that answers fast is not put to
 * sleep), then sleep on the futex. */
static void await_change(uint32_t *addr, uint32_t value) {
    for (int i = 0; i < 2000; i++)
        if (__atomic_load_n(addr, __ATOMIC_ACQUIRE) != value) return;
    while (__atomic_load_n(addr, __ATOMIC_ACQUIRE) == value) futex_wait(addr, value);
}

static shared_page *new_page(int *fd_out) {
    int fd = memfd_create("xpu-client-paths", 0);
    if (fd < 0 || ftruncate(fd, sizeof(shared_page)) < 0) { perror("memfd"); exit(1); }
    shared_page *page = mmap(NULL, sizeof(shared_page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (page == MAP_FAILED) { perror("mmap"); exit(1); }
    memset(page, 0, sizeof *page);
    *fd_out = fd;
    return page;
}

static pid_t start_peer(int fd, char **cmd) {
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 3);
        execvp(cmd[0], cmd);
        perror("exec");
        _exit(127);
    }
    return pid;
}

static double round_trips(shared_page *page, long n) {
    for (int warm = 0; warm < 2; warm++) {  /* the first pass wakes the peer up and warms caches */
        double start = now_ns();
        for (long i = 0; i < n; i++) {
            uint32_t ticket = __atomic_add_fetch(&page->request, 1, __ATOMIC_RELEASE);
            futex_wake(&page->request);
            await_change(&page->answer, ticket - 1);
        }
        if (warm) return (now_ns() - start) / n;
    }
    return 0;
}

static void c_peer(shared_page *page, long total) {
    uint32_t seen = 0;
    for (long i = 0; i < total; i++) {
        await_change(&page->request, seen);
        seen = __atomic_load_n(&page->request, __ATOMIC_ACQUIRE);
        __atomic_store_n(&page->answer, seen, __ATOMIC_RELEASE);
        futex_wake(&page->answer);
    }
}

static int run_futex(long n, char **cmd) {
    int fd;
    shared_page *page = new_page(&fd);
    pid_t pid;
    if (cmd) {
        pid = start_peer(fd, cmd);
    } else if ((pid = fork()) == 0) {
        c_peer(page, 2 * n);
        _exit(0);
    }
    double ns = round_trips(page, n);
    if (cmd) {  /* tell a Python peer to stop: request 0xFFFFFFFF */
        __atomic_store_n(&page->request, 0xFFFFFFFFu, __ATOMIC_RELEASE);
        futex_wake(&page->request);
    }
    waitpid(pid, NULL, 0);
    printf("%s %.0f\n", cmd ? "peer" : "futex", ns);
    return 0;
}

/* The producer side of a C-encoded async call: claim a slot, write the record, publish it,
 * and nudge the consumer only if it sleeps. Waits only when the ring is full. */
static void enqueue(shared_page *page, const unsigned char *record) {
    uint64_t head = page->head;
    while (head - __atomic_load_n(&page->tail, __ATOMIC_ACQUIRE) >= RING_SLOTS) {
        __atomic_store_n(&page->consumer_sleeping, 0, __ATOMIC_RELEASE);
        sched_yield();  /* full: the consumer is behind */
    }
    memcpy(page->records[head % RING_SLOTS], record, 64);
    __atomic_store_n(&page->head, head + 1, __ATOMIC_RELEASE);
    if (__atomic_load_n(&page->consumer_sleeping, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&page->consumer_sleeping, 0, __ATOMIC_RELEASE);
        futex_wake(&page->consumer_sleeping);
    }
}

static int run_ring(long n, char **cmd) {
    int fd;
    shared_page *page = new_page(&fd);
    pid_t pid = start_peer(fd, cmd);
    unsigned char record[64] = {0};
    double start = now_ns();
    for (long i = 0; i < n; i++) {
        memcpy(record, &i, sizeof i);  /* an opcode and arguments would go here */
        enqueue(page, record);
    }
    double produced = now_ns();
    while (__atomic_load_n(&page->tail, __ATOMIC_ACQUIRE) < (uint64_t)n) sched_yield();
    double drained = now_ns();
    kill(pid, 15);
    waitpid(pid, NULL, 0);
    printf("ring %.1f %.0f\n", (produced - start) / n, n / ((drained - start) / 1e9));
    return 0;
}

typedef int (*fn_ctx_get_device)(int *);
typedef int (*fn_ctx_get_flags)(unsigned *);
typedef int (*fn_memset_async)(uint64_t, unsigned char, size_t, void *);
typedef int (*fn_proc_address)(const char *, void **, int, uint64_t, int *);

static int run_shim(long n) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda || !dlsym(cuda, "xpu_lib_enter")) { fprintf(stderr, "the shim is not preloaded\n"); return 1; }
    int (*init)(unsigned) = dlsym(cuda, "cuInit");
    int (*device_get)(int *, int) = dlsym(cuda, "cuDeviceGet");
    int (*retain)(void **, int) = dlsym(cuda, "cuDevicePrimaryCtxRetain");
    int (*set_current)(void *) = dlsym(cuda, "cuCtxSetCurrent");
    int (*alloc)(uint64_t *, size_t) = dlsym(cuda, "cuMemAlloc_v2");
    int (*sync)(void) = dlsym(cuda, "cuCtxSynchronize");
    fn_ctx_get_device get_device = (fn_ctx_get_device)dlsym(cuda, "cuCtxGetDevice");
    fn_ctx_get_flags get_flags = (fn_ctx_get_flags)dlsym(cuda, "cuCtxGetFlags");
    unsigned flags;
    fn_memset_async memset_async = (fn_memset_async)dlsym(cuda, "cuMemsetD8Async");
    fn_proc_address proc_address = (fn_proc_address)dlsym(cuda, "cuGetProcAddress_v2");
    int dev;
    void *ctx, *pfn;
    uint64_t ptr;
    if (init(0) || device_get(&dev, 0) || retain(&ctx, dev) || set_current(ctx) || alloc(&ptr, 4096)) {
        fprintf(stderr, "driver set-up failed\n");
        return 1;
    }
    double t0 = now_ns();
    for (long i = 0; i < n; i++) proc_address("cuMemsetD8Async", &pfn, 12000, 0, NULL);
    double t1 = now_ns();
    for (long i = 0; i < n; i++) get_flags(&flags);
    double t2 = now_ns();
    for (long i = 0; i < n; i++) memset_async(ptr, 1, 256, NULL);
    double t3 = now_ns();
    sync();
    double t4 = now_ns();
    for (long i = 0; i < n; i++) get_device(&dev);
    double t5 = now_ns();
    printf("shim %.0f %.0f %.0f %.0f %.0f\n", (t1 - t0) / n, (t2 - t1) / n, (t3 - t2) / n, n / ((t4 - t2) / 1e9),
           (t5 - t4) / n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: client_paths shim|futex|peer|ring N [CMD...]\n"); return 2; }
    long n = atol(argv[2]);
    if (!strcmp(argv[1], "shim")) return run_shim(n);
    if (!strcmp(argv[1], "futex")) return run_futex(n, NULL);
    if (!strcmp(argv[1], "peer") && argc > 3) return run_futex(n, argv + 3);
    if (!strcmp(argv[1], "ring") && argc > 3) return run_ring(n, argv + 3);
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
