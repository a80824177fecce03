/* The simulator's boundary walk for a search (sim/engine.py, _Run.walk), in C.
 *
 * The same steps in the same order with the same double arithmetic as the Python walk,
 * for what a search runs: timing "early", no recording, no vDNN. Built without
 * floating-point contraction (sim/fastwalk.py), so every sum and product rounds as
 * Python's do and the results are equal bit for bit (tests/test_fastwalk.py).
 */
#include <stdint.h>
#include <string.h>

#define EPS 1e-12

typedef struct {
    int64_t n, n_fwd, m;
    const double *dur;
    int64_t *top;
    double budget;
    int64_t unlimited;
    const int64_t *over;
    const int64_t *first_at, *end_at, *last_fwd, *nbytes;
    const double *so_s, *si_s, *rc_s;
    const int64_t *so_ptr, *so_idx, *rc_ptr, *rc_idx, *src_ptr, *src_idx, *op_ptr, *op_idx;
    const int64_t *free_count;          /* NULL: frees cost no host time */
    const int64_t *queue;               /* the swapped maps by first need; each may start */
    int64_t n_queue;                    /* from n_fwd on (timing "early") */
    const double *rest;                 /* NULL: no cutoff */
    double cutoff;
    double c_so, c_rel, c_si, c_wait, c_rc, c_free;
    /* outputs, per map */
    double *so_done, *si_done, *stall_d2h, *stall_h2d;
    uint8_t *released, *l_out, *l_in;
    int64_t *inflight;                  /* ring buffer of m */
    int64_t *done_wait;                 /* m */
    /* outputs, scalars */
    double t, forward_end;
    int64_t cut_short, overflow, ov_b, ov_i, ov_top, error_i;
} Walk;

typedef struct {
    Walk *w;
    int64_t head, count;                /* inflight ring */
    int64_t n_done, wait_until;
    int64_t qpos, releases;
    int64_t blocked_i, blocked_b, blocked_r;
    double d2h_free, h2d_free;
} State;

static inline double pymax(double a, double b) { return b > a ? b : a; }

static void release(State *s, int64_t i, int64_t b) {
    Walk *w = s->w;
    s->releases += 1;
    w->t += w->c_rel;
    w->released[i] = 1;
    for (int64_t k = b; k < w->end_at[i]; k++) w->top[k] -= w->nbytes[i];
}

static void release_done(State *s, int64_t b) {
    Walk *w = s->w;
    while (s->count && w->so_done[w->inflight[s->head]] <= w->t + EPS) {
        int64_t i = w->inflight[s->head];
        s->head = (s->head + 1) % w->m;
        s->count -= 1;
        if (w->last_fwd[i] < b) release(s, i, b);
        else w->done_wait[s->n_done++] = i;
    }
    if (s->n_done) {
        int64_t kept = 0, least = 0;
        for (int64_t k = 0; k < s->n_done; k++) {
            int64_t i = w->done_wait[k];
            if (w->last_fwd[i] < b) release(s, i, b);
            else {
                if (kept == 0 || w->last_fwd[i] < least) least = w->last_fwd[i];
                w->done_wait[kept++] = i;
            }
        }
        s->n_done = kept;
        s->wait_until = kept ? least : 0;
    }
}

static void wait_swap_out(State *s, int64_t i, int64_t b) {
    Walk *w = s->w;
    if (w->so_done[i] > w->t + EPS) {
        w->stall_d2h[i] += w->so_done[i] - w->t;
        w->t = w->so_done[i];
    }
    w->l_out[i] = 1;
    release_done(s, b);
}

/* 1: fits; 0: nothing left to release; -1: a copy that never completes (error_i) */
static int force_release(State *s, int64_t b, int64_t need) {
    Walk *w = s->w;
    while ((double)(w->top[b] + need) > w->budget) {
        int64_t i = -1;
        for (int64_t k = 0; k < s->count; k++) {
            int64_t j = w->inflight[(s->head + k) % w->m];
            if (w->last_fwd[j] < b) { i = j; break; }
        }
        if (i < 0) return 0;
        wait_swap_out(s, i, b);
        if (!w->released[i]) { w->error_i = i; return -1; }
    }
    return 1;
}

static int still_blocked(State *s, int64_t i, int64_t b) {
    return s->blocked_i == i && s->blocked_b >= b && s->blocked_r == s->releases;
}

static int room(State *s, int64_t i, int64_t b) {
    Walk *w = s->w;
    if (w->unlimited) return 1;
    if (still_blocked(s, i, b)) return 0;
    int64_t k = b;                       /* the first highest point, as argmax */
    for (int64_t j = b + 1; j < w->end_at[i]; j++) if (w->top[j] > w->top[k]) k = j;
    if ((double)(w->top[k] + w->nbytes[i]) <= w->budget) return 1;
    s->blocked_i = i; s->blocked_b = k; s->blocked_r = s->releases;
    return 0;
}

static void swap_in(State *s, int64_t i, int64_t b) {
    Walk *w = s->w;
    w->t += w->c_si;
    for (int64_t k = b; k < w->end_at[i]; k++) w->top[k] += w->nbytes[i];
    double start = pymax(w->t, s->h2d_free);
    s->h2d_free = w->si_done[i] = start + w->si_s[i];
}

static void wait_for(State *s, int64_t i, int64_t b) {
    Walk *w = s->w;
    w->t += w->c_wait;
    if (w->si_done[i] > w->t + EPS) {
        w->stall_h2d[i] += w->si_done[i] - w->t;
        w->t = w->si_done[i];
        if (b >= w->n_fwd) w->l_in[i] = 1;
    }
}

static void note_overflow(Walk *w, int64_t kind, int64_t b, int64_t i) {
    if (!w->overflow) {
        w->overflow = kind; w->ov_b = b; w->ov_i = i; w->ov_top = w->top[b];
    }
}

/* 0: done; -1: error (error_i) */
static int swap_ins(State *s, int64_t b) {
    Walk *w = s->w;
    while (s->qpos < w->n_queue) {
        int64_t i = w->queue[s->qpos];
        int forced = w->first_at[i] == b;
        if (!forced && w->n_fwd > b) break;
        if (!w->released[i]) {
            if (!forced) break;
            wait_swap_out(s, i, b);
        }
        if (!room(s, i, b)) {
            if (!forced) break;
            int fit = force_release(s, b, w->nbytes[i]);
            if (fit < 0) return -1;
            if (!fit) note_overflow(w, 2, b, i);
        }
        swap_in(s, i, b);
        s->qpos += 1;
    }
    return 0;
}

static double swap_in_bound(Walk *w) {
    double done = w->t, bound = w->t;
    for (int64_t k = 0; k < w->n_queue; k++) {
        int64_t i = w->queue[k];
        done = pymax(done, w->so_done[i]) + w->si_s[i];
        bound = pymax(bound, done + w->rest[w->first_at[i]]);
    }
    return bound;
}

/* The walk (engine._Run.walk for timing "early", unrecorded). 0: done; -1: error_i's
 * swap-out never completes. */
int walk(Walk *w) {
    State st;
    memset(&st, 0, sizeof st);
    State *s = &st;
    s->w = w;
    s->blocked_i = s->blocked_b = s->blocked_r = -1;
    w->t = w->forward_end = 0.0;
    w->cut_short = w->overflow = 0;
    w->error_i = -1;
    const int64_t n = w->n, n_fwd = w->n_fwd;
    for (int64_t b = 0; b <= n; b++) {
        if (b == n_fwd) {
            w->forward_end = w->t;
            double late = w->rest ? swap_in_bound(w) : 0.0;
            if (late >= w->cutoff) { w->cut_short = 1; w->t = late; return 0; }
        }
        if (w->c_free != 0.0 && w->free_count && w->free_count[b])
            w->t += w->c_free * (double)w->free_count[b];
        for (int64_t k = w->so_ptr[b]; k < w->so_ptr[b + 1]; k++) {
            int64_t i = w->so_idx[k];
            w->t += w->c_so;
            double start = pymax(w->t, s->d2h_free);
            s->d2h_free = w->so_done[i] = start + w->so_s[i];
            w->inflight[(s->head + s->count) % w->m] = i;
            s->count += 1;
        }
        if ((s->count && w->so_done[w->inflight[s->head]] <= w->t + EPS)
                || (s->n_done && b > s->wait_until))
            release_done(s, b);
        if (b < n && w->over[b] && (double)w->top[b] > w->budget) {
            int fit = force_release(s, b, 0);
            if (fit < 0) return -1;
            if (!fit) note_overflow(w, 1, b, -1);
        }
        if (n_fwd <= b && b < n && s->qpos < w->n_queue) {
            int64_t head = w->queue[s->qpos];
            if (w->first_at[head] == b || (w->n_fwd <= b && w->released[head]
                                           && !still_blocked(s, head, b)))
                if (swap_ins(s, b) < 0) return -1;
        }
        int64_t rc0 = w->rc_ptr[b], rc1 = w->rc_ptr[b + 1];
        if (rc1 > rc0) {
            for (int64_t k = w->src_ptr[b]; k < w->src_ptr[b + 1]; k++)
                wait_for(s, w->src_idx[k], b);
            for (int64_t k = rc0; k < rc1; k++)
                w->t += w->rc_s[w->rc_idx[k]] + w->c_rc;
        }
        for (int64_t k = w->op_ptr[b]; k < w->op_ptr[b + 1]; k++)
            wait_for(s, w->op_idx[k], b);
        if (w->rest && w->t + w->rest[b] >= w->cutoff) {
            w->cut_short = 1; w->t = w->t + w->rest[b]; return 0;
        }
        if (b < n) w->t += w->dur[b];
    }
    if (n_fwd >= n) w->forward_end = w->t;
    return 0;
}

/* The recompute set's part of a plan's lifetimes (sim/lifetimes.py, _rebuilt_parts): the
 * same rule as the Python reference there. ``rebuilt`` ascends; each map is visited after
 * every map that reads it (sources have smaller ids), so its point, the earliest boundary
 * any reader or its own first need wants it, is known when it is visited. ``first``, ``end``
 * (the model's, copied), ``rc_point`` (-1), ``min_read`` (INT64_MAX) and ``extra`` (0) come
 * initialized; ``keys`` receives source * stride + point per read. Returns the reads. */
int64_t rebuilt_parts(int64_t n_rebuilt, const int64_t *rebuilt, const int64_t *src_ptr,
                      const int64_t *src_idx, const int64_t *first0, const int64_t *rc_extra,
                      const int64_t *between, int64_t stride, int64_t *first, int64_t *end,
                      int64_t *rc_point, int64_t *min_read, int64_t *extra, int64_t *keys) {
    int64_t k = 0;
    for (int64_t r = n_rebuilt - 1; r >= 0; r--) {
        int64_t i = rebuilt[r];
        int64_t point = first0[i] < min_read[i] ? first0[i] : min_read[i];
        rc_point[i] = point;
        int64_t held = rc_extra[i] + between[point];
        if (held > extra[point]) extra[point] = held;
        for (int64_t e = src_ptr[i]; e < src_ptr[i + 1]; e++) {
            int64_t s = src_idx[e];
            if (point < min_read[s]) min_read[s] = point;
            if (point < first[s]) first[s] = point;
            if (point + 1 > end[s]) end[s] = point + 1;
            keys[k++] = s * stride + point;
        }
    }
    return k;
}

/* A plan's static memory (sim/lifetimes.py, static_top; the rule is sim/memory.py's): each
 * map is held from its producer to its final drop ``end``, less its hole where it has one
 * (``hole[i]``: recompute, or swap where ``minimal``) from past its last forward use to its
 * rebuild or first need. ``diff`` (n + 2) comes zeroed; writes level and top (n + 1). */
void static_top(int64_t n, int64_t m, const int64_t *codes, const int64_t *first,
                const int64_t *end, const int64_t *rc_point, const int64_t *extra,
                const int64_t *last_fwd, const int64_t *nbytes, const int64_t *base_level,
                const int64_t *peak_inc, int64_t minimal, int64_t *diff, int64_t *level,
                int64_t *top) {
    for (int64_t i = 0; i < m; i++) {
        int64_t nb = nbytes[i];
        diff[end[i]] -= nb;
        if (codes[i] == 2 || (codes[i] == 1 && minimal)) {
            diff[last_fwd[i] + 1] -= nb;
            diff[codes[i] == 2 ? rc_point[i] : first[i]] += nb;
        }
    }
    int64_t held = 0;
    for (int64_t b = 0; b <= n; b++) {
        held += diff[b];
        level[b] = base_level[b] + held;
        top[b] = level[b] + (peak_inc[b] > extra[b] ? peak_inc[b] : extra[b]);
    }
}

/* KeepRoom.fill (policies/search.py): the candidates, in order, that fit one after another:
 * a map kept fills its hole [lo, hi) of ``top`` (updated in place) with its bytes, if the
 * hole's highest point has room for them under ``budget``. Returns how many are kept. */
int64_t fill(int64_t n_cand, const int64_t *cand, const int64_t *lo, const int64_t *hi,
             const int64_t *nbytes, int64_t budget, int64_t *top, int64_t *kept) {
    int64_t k = 0;
    for (int64_t c = 0; c < n_cand; c++) {
        int64_t i = cand[c], a = lo[i], z = hi[i], nb = nbytes[i], fits = 1;
        for (int64_t b = a; b < z && fits; b++)
            fits = top[b] + nb <= budget;
        if (!fits) continue;
        for (int64_t b = a; b < z; b++)
            top[b] += nb;
        kept[k++] = i;
    }
    return k;
}
