/* The replay of perfmodel/model.py (`replay`, `Queues`, `Wake.extra`) over arrays, for xpu-perf's sweeps.
 *
 * The same arithmetic in the same order as the Python reference, in doubles, built with -ffp-contract=off (no
 * fused multiply-adds), so that both give the same prediction. Streams and events are dense indices (fast.py
 * maps the trace's numbers); a message's GPU steps are steps[gpu_start[i] .. gpu_start[i + 1]).
 */
#include <stddef.h>
#include <stdint.h>

/* The GPU operations' numbers (protocol/trace.py's GPU_OPS_NAMES) and the message kinds (fast.py's KINDS) come
 * from the build (fast.py's _macros), not typed here again. */
#define WORK XPU_GPU_WORK
#define RECORD XPU_GPU_RECORD
#define WAIT XPU_GPU_WAIT
#define SYNC_ALL XPU_GPU_SYNC_ALL
#define SYNC_STREAM XPU_GPU_SYNC_STREAM
#define SYNC_EVENT XPU_GPU_SYNC_EVENT
#define ASYNC XPU_KIND_ASYNC
#define SYNC XPU_KIND_SYNC

/* cffi: begin */
struct xpu_replay_out {
    double shift, waited, latency, transport, server;
    int64_t round_trips, bytes_up, bytes_down;
};

void xpu_replay(size_t n, const double *sent, const int8_t *kind, const int64_t *up, const int64_t *down,
                const double *server, const double *wait, const double *blocked, const int64_t *gpu_start,
                const double *offset, const int8_t *op, const int32_t *a, const int32_t *ev, const double *b,
                double *free, double *events, double base_ns, double per_byte_ns, double rtt_us, double gbps,
                const double *cx, const double *cy, size_t cn, double spin_ns, double wake_blocked_ns,
                const double *sx, const double *sy, size_t sn, struct xpu_replay_out *out);
/* cffi: end */

static double max2(double a, double b) { return a > b ? a : b; }

/* Wake.extra: straight lines between the measured (idle, extra) points, flat beyond the last. */
static double wake_extra(const double *x, const double *y, size_t n, double idle) {
    double x0 = 0.0, y0 = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x1 = x[i], y1 = y[i];
        if (idle <= x1)
            return x1 > x0 ? y0 + (y1 - y0) * (idle - x0) / (x1 - x0) : y1;
        x0 = x1;
        y0 = y1;
    }
    return y0;
}

/* Queues.run: a message's GPU steps, the server having begun it at `start`; when its syncs release the server.
 * `free` only grows, so the latest of all the streams' is kept as it changes (*all_free). */
static double run_queues(const double *offset, const int8_t *op, const int32_t *a, const int32_t *ev,
                         const double *b, int64_t from, int64_t to, double start, double *free, double *events,
                         double *all_free) {
    double release = 0.0;
    for (int64_t k = from; k < to; k++) {
        double at = start + offset[k];
        switch (op[k]) {
        case WORK:
            free[a[k]] = max2(at, free[a[k]]) + b[k];
            *all_free = max2(*all_free, free[a[k]]);
            break;
        case RECORD:
            events[ev[k]] = max2(at, free[a[k]]);
            break;
        case WAIT:
            free[a[k]] = max2(free[a[k]], events[ev[k]]);
            *all_free = max2(*all_free, free[a[k]]);
            break;
        case SYNC_ALL:
            release = max2(max2(release, at), *all_free);
            break;
        case SYNC_STREAM:
            release = max2(max2(release, at), a[k] == 0 ? *all_free : free[a[k]]);
            break;
        case SYNC_EVENT:
            release = max2(max2(release, at), events[ev[k]]);
            break;
        }
    }
    return release;
}

/* model.replay's loop; `free` (n_streams) and `events` (n_events) are zeroed scratch. */
void xpu_replay(size_t n, const double *sent, const int8_t *kind, const int64_t *up, const int64_t *down,
                const double *server, const double *wait, const double *blocked, const int64_t *gpu_start,
                const double *offset, const int8_t *op, const int32_t *a, const int32_t *ev, const double *b,
                double *free, double *events, double base_ns, double per_byte_ns, double rtt_us, double gbps,
                const double *cx, const double *cy, size_t cn, double spin_ns, double wake_blocked_ns,
                const double *sx, const double *sy, size_t sn, struct xpu_replay_out *out) {
    double half_rtt = rtt_us * 500.0;
    double up_free = 0.0, down_free = 0.0, server_free = 0.0, all_free = 0.0, shift = 0.0, waited = 0.0;
    double latency = 0.0, transport = 0.0, server_sum = 0.0;
    int64_t round_trips = 0, bytes_up = 0, bytes_down = 0;
    for (size_t i = 0; i < n; i++) {
        double t = sent[i] + shift;
        double u = (double)up[i], d = (double)down[i];
        double ready = t + (base_ns / 2 + u * per_byte_ns);
        double leaves = max2(ready, up_free) + (gbps > 0 ? u * 8 / gbps : 0.0);
        up_free = leaves;
        double arrives = leaves + half_rtt;
        double server_wake = arrives > server_free ? wake_extra(sx, sy, sn, arrives - server_free) : 0.0;
        double begun = max2(arrives + server_wake, server_free);
        if (gpu_start[i + 1] > gpu_start[i])
            server_free = max2(begun + server[i] - blocked[i],
                               run_queues(offset, op, a, ev, b, gpu_start[i], gpu_start[i + 1], begun, free, events,
                                          &all_free));
        else
            server_free = begun + server[i];
        bytes_up += up[i];
        if (kind[i] == ASYNC)
            continue;
        bytes_down += down[i];
        ready = server_free + (base_ns / 2 + d * per_byte_ns);
        down_free = max2(ready, down_free) + (gbps > 0 ? d * 8 / gbps : 0.0);
        if (kind[i] != SYNC)
            continue;
        double w = down_free + half_rtt - t;
        /* Machines.client_wake: nothing within the client's spin window, a blocked wait's wake-up past it */
        double client_wake = w > spin_ns ? max2(wake_blocked_ns, wake_extra(cx, cy, cn, w - spin_ns)) : 0.0;
        w += client_wake;
        shift += w - wait[i];
        waited += w;
        round_trips++;
        latency += 2 * half_rtt;
        transport += base_ns + (double)(up[i] + down[i]) * per_byte_ns + server_wake + client_wake;
        server_sum += server_free - arrives - server_wake;
    }
    out->shift = shift;
    out->waited = waited;
    out->latency = latency;
    out->transport = transport;
    out->server = server_sum;
    out->round_trips = round_trips;
    out->bytes_up = bytes_up;
    out->bytes_down = bytes_down;
}
