/*
 * sched.c - the serving engine: one thread per model running a continuous
 * batch of rows (see the engine section of include/ember.h).
 *
 * Threads and ownership
 *   - Any thread may call ember_engine_submit / ember_stream_*; they touch
 *     only the inbox (engine mutex) and a stream's event queue (stream
 *     mutex). They never run compute.
 *   - The engine thread owns everything else: the waiting queue, the rows,
 *     the model's KV cache and run state. Each step it moves the inbox to
 *     the waiting queue, drops cancelled requests, admits waiting requests
 *     into free rows, runs one forward over decode tokens (one per decoding
 *     row) and prefill chunks (up to prefill_chunk prompt tokens), samples,
 *     and pushes events.
 *   - A stream is shared by the engine and the client: refs counts the
 *     holders (under the stream mutex); the last to let go frees it.
 *
 * Admission is transactional: a request is validated and its row prepared
 * (sampler configured, history copied) before the row joins the batch; a
 * failure ends that request with an error and leaves the batch untouched.
 *
 * Prefix reuse, two ways, the longer one wins:
 *   - the prefix cache (kv_prefix.h): rows publish their full blocks as
 *     their prompt is prefilled and when they end; a new request installs
 *     the longest cached run of its prompt into a free row by reference
 *     (rows of one batch share those blocks). Cached blocks no request
 *     holds are evicted least recently used first when memory is short,
 *     before any running request is preempted.
 *   - a free row keeps the KV of its last request: a new request may take
 *     the free row sharing the longest prefix with its prompt (to the
 *     token, partial blocks too).
 *   - the disk tier (kv_disk.h, with prompt_cache_dir): rows that end are
 *     queued as files, written a slice at a time while the engine has
 *     nothing else to do (and at shutdown); a request whose prompt shares
 *     at least a block more with a file than with memory loads the file
 *     into a free row and trims it to the shared length.
 * Either way the reused positions are skipped (reported as n_cached).
 * Since every kernel is batch invariant, they hold exactly the values a
 * fresh prefill would compute.
 *
 * Step pacing (engine param prefill_pace): while rows decode, a step takes
 * at most pace_budget() prompt tokens, so it lasts about prefill_pace
 * times a step of its decoding rows alone. The cost of a step is a line in
 * its token count, fitted here to the steps without drafts (pace.h).
 * Chunking never changes a token (chunk invariance); it only moves work
 * between steps.
 *
 * Tokens on the device: when every output of a step is a plain row
 * (plain_row: greedy, or sampled where the backend has sample_rows), the
 * forward picks the tokens (ember_batch.argmax, .draw) and no logits row is
 * copied to the host. A sampled row's draw then takes its sampler's next
 * uniform, as the host draw would, and follows the same chain
 * (core/draw_def.h: ember_draw). Any
 * other row in the step (penalties, constraints, log-probabilities,
 * drafts) makes the whole step read its logits and draw on the host.
 *
 * Speculative decoding (engine params spec, docs/speculative.md): a
 * decoding row whose request speculates asks the draft source (spec.h) for
 * up to draft_max tokens and, in the batch room and KV memory the prefill
 * left, feeds them after its last token inside a speculative round of its
 * KV row (ember_kv_spec_begin). The forward returns logits for the last
 * token and every draft; verify_drafts walks them in order through the
 * same per-token path as a plain decode (penalties, sampler, logprobs, stop
 * ids, limits, events) and stops at the first token that differs from its
 * draft or when the request ends; ember_kv_spec_commit then keeps exactly
 * the positions whose tokens stand. Kernels are batch invariant, so those
 * logits are exactly a plain decode's: greedy output is unchanged, sampled
 * rows verify by rejection sampling (ember_sampler_sample_draft) and keep
 * their distribution. Rounds open and close inside one step: admission,
 * preemption, release and the prefix cache only ever see committed rows.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/util.h"
#include "engine.h"
#include "pace.h"
#include "kv/kv_disk.h"
#include "kv/kv_prefix.h"
#include "sample/sampler.h"
#include "spec.h"

/* ---- streams ---------------------------------------------------------------------- */

struct ember_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ember_event *q; /* ring buffer of events */
    size_t head, count, cap;
    bool done_pushed, done_popped;
    int refs;
    atomic_int cancel;
    /* the request, owned by the engine thread once queued */
    ember_gen_params g;
    int32_t *prompt;
    ember_logit_bias *bias;
    int32_t *stop_ids;
    ember_stream *next; /* inbox / waiting queue link */
};

static void stream_unref(ember_stream *s) {
    pthread_mutex_lock(&s->mu);
    int left = --s->refs;
    pthread_mutex_unlock(&s->mu);
    if (left > 0) return;
    if (s->g.constrain_free) s->g.constrain_free(s->g.constrain_user);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->q);
    free(s->prompt);
    free(s->bias);
    free(s->stop_ids);
    free(s);
}

/* Appends an event. Returns false when memory for the queue ran out. */
static bool stream_push(ember_stream *s, const ember_event *ev) {
    pthread_mutex_lock(&s->mu);
    bool ok = true;
    if (s->count == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        ember_event *q = ember_malloc(cap * sizeof *q);
        if (!q) {
            ok = false;
        } else {
            for (size_t i = 0; i < s->count; i++) q[i] = s->q[(s->head + i) % s->cap];
            free(s->q);
            s->q = q;
            s->cap = cap;
            s->head = 0;
        }
    }
    if (ok) {
        s->q[(s->head + s->count) % s->cap] = *ev;
        s->count++;
        if (ev->kind == EMBER_EV_DONE) s->done_pushed = true;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* The final event; on a full queue it replaces the last queued event so the
   client always learns how the request ended. */
static void stream_finish(ember_stream *s, const ember_event *done) {
    if (!stream_push(s, done)) {
        pthread_mutex_lock(&s->mu);
        if (s->count) s->q[(s->head + s->count - 1) % s->cap] = *done;
        s->done_pushed = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

int ember_stream_next(ember_stream *s, ember_event *ev, int timeout_ms) {
    struct timespec until;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&s->mu);
    while (s->count == 0 && !s->done_popped) {
        if (s->done_pushed) break; /* cannot happen with count 0 unless popped */
        if (timeout_ms < 0)
            pthread_cond_wait(&s->cv, &s->mu);
        else if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT)
            break;
    }
    int got = 0;
    if (s->count > 0) {
        *ev = s->q[s->head];
        s->head = (s->head + 1) % s->cap;
        s->count--;
        if (ev->kind == EMBER_EV_DONE) s->done_popped = true;
        got = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return got;
}

void ember_stream_cancel(ember_stream *s) {
    if (s) atomic_store(&s->cancel, 1);
}

void ember_stream_free(ember_stream *s) {
    if (!s) return;
    ember_stream_cancel(s);
    stream_unref(s);
}

/* ---- the engine --------------------------------------------------------------------- */

typedef enum row_phase { ROW_FREE = 0, ROW_PREFILL, ROW_DECODE } row_phase;

typedef struct row {
    row_phase phase;
    ember_stream *s;
    int32_t *hist;      /* [n_ctx + 1] prompt then generated tokens */
    int n_hist;         /* tokens in hist */
    int n_prompt, n_fed; /* prompt length; positions already in the KV cache */
    int n_target;       /* positions to prefill: the prompt, or after a preemption the whole history */
    int n_gen, n_cached;
    uint64_t order;     /* admission order: prefill goes first-come first-served */
    uint64_t stamp;     /* the step that last took a prefill chunk from this row */
    uint64_t used;      /* the step this row last ran: free rows' KV is evicted oldest first */
    uint64_t salt;      /* cache_salt of the request whose KV the row holds: reuse needs the same */
    ember_sampler *sampler;
    uint32_t *counts;   /* [V] generated-token counts (penalties) */
    uint8_t *seen;      /* [V / 8 + 1] tokens of prompt and output (repetition penalty) */
    bool spec;          /* the request speculates: its slot of the draft source is open */
    int32_t *draft;     /* [draft_max] this step's proposed tokens (NULL without a source) */
    int n_draft;        /* drafts in this step's forward (0: a plain decode) */
    int o_last, o_draft; /* this step's logits rows: of the last token, of the first draft */
} row;

struct ember_engine {
    ember_model *m;
    ember_engine_params p;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    ember_stream *inbox, *inbox_tail;
    int queued; /* inbox + waiting, for the queue bound (under mu) */
    /* engine thread only */
    ember_stream *wait_head, *wait_tail;
    row *rows;
    int n_rows;
    uint64_t next_order;
    uint64_t steps;
    int *out_row; /* [n_rows + draft tokens] row of each logits row of a step */
    int32_t *ids; /* [as out_row] tokens chosen by the forward (ember_batch.argmax) or by pick_tokens */
    ember_draw *draws; /* [as out_row] the device draws' parameters (ember_batch.draw) */
    int *pick_o;  /* [as out_row] pick_tokens' outputs */
    bool *picked; /* [as out_row] pick_tokens chose ids[o] */
    ember_event *pick_ev; /* [as out_row] pick_tokens' log-probabilities of ids[o] (rows that ask) */
    /* plan_drafts' arguments to ember_draft_propose_many, [n_rows] each */
    int *d_slot, *d_nhist, *d_cap, *d_n;
    const int32_t **d_hist;
    int32_t **d_out;
    float *raw; /* [V] a row's logits before penalties, for logprobs */
    int *plan;          /* [n_rows] tokens each row takes in this step */
    ember_kv_prefix *px; /* the prefix cache; NULL when the cache's kinds cannot share */
    ember_kv_disk *disk; /* the disk tier; NULL without prompt_cache_dir */
    bool disk_work;      /* the disk tier has queued writes */
    ember_draft *src;    /* the draft source; NULL: no speculation */
    /* a source reading the target's taps (EAGLE-3): the step's tapped tokens (batch index, row) and
       their taps [max_batch_tokens * tap_width]; the rows' histories by row for observe */
    int32_t *tap_idx;
    int *tap_row;
    int32_t *tap_pos, *tap_tok;
    float *taps;
    const int32_t **tap_hist;
    int *tap_nhist;
    double px_stats_at;  /* when publish_stats last read the prefix cache's figures */
    pace_fit fit;        /* pacing: the steps' cost model (pace.h) */
    int fit_dec;         /* pacing: the decoding rows of the last step folded into it */
    ember_engine_stats stats; /* published under mu */
};

static void row_free_mem(row *r) {
    free(r->hist);
    free(r->draft);
    free(r->counts);
    free(r->seen);
    ember_sampler_free(r->sampler);
}

void ember_engine_shutdown(ember_engine *e) {
    if (!e || !e->started) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->started = false;
}

void ember_engine_free(ember_engine *e) {
    if (!e) return;
    ember_engine_shutdown(e);
    ember_kv_disk_free(e->disk);
    ember_kv_prefix_free(e->px);
    ember_draft_free(e->src);
    free(e->tap_idx);
    free(e->tap_row);
    free(e->tap_pos);
    free(e->tap_tok);
    free(e->taps);
    free(e->tap_hist);
    free(e->tap_nhist);
    for (int i = 0; i < e->n_rows && e->rows; i++) row_free_mem(&e->rows[i]);
    free(e->rows);
    free(e->out_row);
    free(e->ids);
    free(e->draws);
    free(e->pick_o);
    free(e->picked);
    free(e->pick_ev);
    free(e->d_slot);
    free(e->d_nhist);
    free(e->d_cap);
    free(e->d_n);
    free(e->d_hist);
    free(e->d_out);
    free(e->plan);
    free(e->raw);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

/* Pushes the final event and drops the engine's reference to s. */
static void end_stream(ember_stream *s, ember_finish finish, int n_prompt, int n_gen, int n_cached, int code,
                       const char *msg) {
    ember_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = EMBER_EV_DONE;
    ev.finish = finish;
    ev.n_prompt = n_prompt;
    ev.n_generated = n_gen;
    ev.n_cached = n_cached;
    ev.error_code = code;
    if (msg) snprintf(ev.error, sizeof ev.error, "%s", msg);
    stream_finish(s, &ev);
    stream_unref(s);
}

static void publish_stats(ember_engine *e);

/* Releases row r: clears its penalty marks, keeps its KV and the matching
   history for prefix reuse, publishes the new stats, then ends its stream
   (so a client that sees the end also sees the row gone from the stats). */
static void release_row(ember_engine *e, row *r, ember_finish finish, int code, const char *msg) {
    ember_stream *s = r->s;
    for (int i = 0; i < r->n_hist; i++) {
        r->counts[r->hist[i]] = 0;
        r->seen[r->hist[i] >> 3] = 0;
    }
    r->s = NULL;
    r->phase = ROW_FREE;
    if (r->spec) ember_draft_close(e->src, (int)(r - e->rows));
    r->spec = false;
    r->n_hist = ember_kv_len(e->m->kv, (int)(r - e->rows)); /* tokens beyond the KV were never fed */
    if (s->g.no_prompt_cache) { /* opted out: its KV is not kept for anyone */
        ember_kv_clear(e->m->kv, (int)(r - e->rows));
        r->n_hist = 0;
    } else {
        if (e->px) /* best effort: out of memory only publishes less */
            (void)ember_kv_prefix_publish(e->px, (int)(r - e->rows), r->hist, r->n_hist, s->g.cache_salt);
        if (e->disk && r->n_hist >= EMBER_KV_BLOCK) /* to disk when idle; best effort too */
            e->disk_work |= ember_kv_disk_queue(e->disk, (int)(r - e->rows), r->hist, s->g.cache_salt, NULL) ==
                                EMBER_OK;
    }
    r->used = e->steps;
    pthread_mutex_lock(&e->mu);
    e->stats.generated_tokens_total += (uint64_t)r->n_gen;
    e->stats.cached_tokens_total += (uint64_t)r->n_cached;
    pthread_mutex_unlock(&e->mu);
    publish_stats(e);
    end_stream(s, finish, r->n_prompt, r->n_gen, r->n_cached, code, msg);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* KV bytes the admitted rows still need for the rest of their prefill,
   plus one block of growth per running row. */
static size_t kv_committed(ember_engine *e) {
    ember_kv *kv = e->m->kv;
    size_t c = 0, blk = ember_kv_bytes_per_token(kv, false) * EMBER_KV_BLOCK;
    for (int i = 0; i < e->n_rows; i++) {
        const row *r = &e->rows[i];
        if (r->phase == ROW_FREE) continue;
        if (r->phase == ROW_PREFILL) c += ember_kv_need_bytes(kv, i, r->n_target - r->n_fed);
        c += blk;
    }
    return c;
}

/* Drops the KV a free row keeps for prefix reuse (the least recently used
   one, except row keep), or when none holds any, the disk tier's queued
   writes, then prefix-cache blocks no request holds; false when there was
   nothing to drop. */
static bool evict_cached(ember_engine *e, int keep) {
    ember_kv *kv = e->m->kv;
    int best = -1;
    for (int i = 0; i < e->n_rows; i++)
        if (i != keep && e->rows[i].phase == ROW_FREE && ember_kv_len(kv, i) > 0 &&
            (best < 0 || e->rows[i].used < e->rows[best].used))
            best = i;
    if (best < 0 && e->disk && ember_kv_disk_drop_queued(e->disk)) {
        e->disk_work = false;
        return true;
    }
    if (best < 0) /* then the prefix cache's blocks no request holds, a block's worth at a time */
        return e->px && ember_kv_prefix_evict(e->px, ember_kv_bytes_per_token(kv, false) * EMBER_KV_BLOCK) > 0;
    ember_kv_clear(kv, best);
    e->rows[best].n_hist = 0;
    return true;
}

/* The free row to install a prefix into (from the prefix cache or a file):
   an empty one, else the least recently used; -1 when none is free. */
static int pick_free_row(ember_engine *e) {
    ember_kv *kv = e->m->kv;
    int pick = -1;
    for (int i = 0; i < e->n_rows; i++) {
        const row *r = &e->rows[i];
        if (r->phase != ROW_FREE) continue;
        if (pick < 0 || (ember_kv_len(kv, i) == 0 && ember_kv_len(kv, pick) > 0) ||
            ((ember_kv_len(kv, i) == 0) == (ember_kv_len(kv, pick) == 0) && r->used < e->rows[pick].used))
            pick = i;
    }
    return pick;
}

/* Moves waiting requests into free rows while there are both and the KV
   memory allows: a request is admitted when the blocks its prompt needs
   (beyond a reused prefix) fit beside what admitted rows still need. */
static void admit(ember_engine *e) {
    ember_model *m = e->m;
    ember_kv *kv = m->kv;
    while (e->wait_head) {
        ember_stream *s = e->wait_head;
        int best = -1, best_len = -1;
        for (int i = 0; i < e->n_rows; i++) {
            row *r = &e->rows[i];
            if (r->phase != ROW_FREE) continue;
            int c = r->salt == s->g.cache_salt ? common_prefix(r->hist, ember_kv_len(kv, i), s->prompt, s->g.n_prompt - 1)
                                                : 0;
            if (c > 0 && c < ember_kv_min_reuse(kv, i)) c = 0; /* the row cannot go back that far */
            if (c > best_len || (c == best_len && ember_kv_len(kv, i) < ember_kv_len(kv, best))) {
                best = i;
                best_len = c;
            }
        }
        if (best < 0) return; /* no free row: wait */
        if (s->g.no_prompt_cache) best_len = 0; /* opted out: no reuse (the row's old KV goes) */
        /* the prefix cache, when it has more: into an empty free row, or the least recently used one */
        bool from_px = false;
        int pm = e->px && !s->g.no_prompt_cache
                     ? ember_kv_prefix_match(e->px, s->prompt, s->g.n_prompt - 1, s->g.cache_salt)
                     : 0;
        if (pm > best_len) {
            best = pick_free_row(e);
            best_len = pm;
            from_px = true;
        }
        /* the disk tier, when a file holds at least a block more */
        int dfile = -1;
        int dm = e->disk && !s->g.no_prompt_cache
                     ? ember_kv_disk_match(e->disk, s->prompt, s->g.n_prompt - 1, s->g.cache_salt, &dfile)
                     : 0;
        bool from_disk = false;
        if (dfile >= 0 && dm >= best_len + EMBER_KV_BLOCK) {
            if (!from_px) {
                best = pick_free_row(e);
            }
            best_len = dm;
            from_px = false;
            from_disk = true;
        }
        /* memory: the prompt's blocks beside what admitted rows still need */
        size_t need = ember_kv_request_bytes(kv, s->g.n_prompt) - ember_kv_request_bytes(kv, best_len);
        /* the part of the row's own cache not reused comes back (all of it when the prefix comes
           from the prefix cache; an estimate: blocks it shares stay) */
        int own = from_px || from_disk ? 0 : best_len;
        for (;;) {
            size_t have = ember_kv_free_bytes(kv), held = kv_committed(e);
            if (ember_kv_len(kv, best) > own)
                have += ember_kv_request_bytes(kv, ember_kv_len(kv, best)) - ember_kv_request_bytes(kv, own);
            if (need + held <= have) break;
            if (!evict_cached(e, best)) break;
        }
        size_t have = ember_kv_free_bytes(kv), held = kv_committed(e);
        if (ember_kv_len(kv, best) > own)
            have += ember_kv_request_bytes(kv, ember_kv_len(kv, best)) - ember_kv_request_bytes(kv, own);
        bool running = false;
        for (int i = 0; i < e->n_rows && !running; i++) running = e->rows[i].phase != ROW_FREE;
        if (need + held > have && running) return; /* wait for running requests to give blocks back */
        e->wait_head = s->next;
        if (!e->wait_head) e->wait_tail = NULL;
        s->next = NULL;
        pthread_mutex_lock(&e->mu);
        e->queued--;
        pthread_mutex_unlock(&e->mu);
        if (need + held > have) { /* alone and still too big: it can never run */
            char msg[200];
            snprintf(msg, sizeof msg, "the prompt needs %.1f MiB of KV cache, more than the %.1f MiB available",
                     (double)need / (1 << 20), (double)have / (1 << 20));
            end_stream(s, EMBER_FINISH_ERROR, s->g.n_prompt, 0, 0, EMBER_ERR_NOMEM, msg);
            continue;
        }
        /* prepare the row; nothing in the running batch changes on failure */
        row *r = &e->rows[best];
        ember_error err = {0};
        if (ember_sampler_configure(r->sampler, &s->g.sampling, &err) != EMBER_OK) {
            end_stream(s, EMBER_FINISH_ERROR, s->g.n_prompt, 0, 0, err.code, err.msg);
            continue;
        }
        if (from_disk) {
            /* the whole file into the emptied row, then back to the shared length; a damaged
               file is removed by the disk tier, and any failure is a full prefill */
            ember_kv_clear(kv, best);
            for (int tries = 1; dfile >= 0 && ember_kv_disk_restore(e->disk, dfile, best, NULL) != EMBER_OK; tries++)
                if (tries == 3 || ember_kv_disk_match(e->disk, s->prompt, s->g.n_prompt - 1, s->g.cache_salt,
                                                      &dfile) < best_len)
                    dfile = -1; /* else the damaged file is gone: the next one sharing as much */
            if (dfile < 0 || ember_kv_trim(kv, best, best_len, NULL) != EMBER_OK) {
                ember_kv_clear(kv, best);
                best_len = 0;
            }
        } else if (from_px) {
            ember_kv_clear(kv, best);
            if (ember_kv_prefix_attach(e->px, best, s->prompt, best_len, s->g.cache_salt, NULL) != EMBER_OK)
                best_len = 0; /* evicted meanwhile, or no memory for the table: a full prefill */
        } else if (ember_kv_trim(kv, best, best_len, NULL) != EMBER_OK) {
            ember_kv_clear(kv, best);
            best_len = 0;
        }
        memcpy(r->hist, s->prompt, (size_t)s->g.n_prompt * sizeof *r->hist);
        r->n_hist = s->g.n_prompt;
        for (int i = 0; i < r->n_hist; i++) r->seen[r->hist[i] >> 3] |= (uint8_t)(1u << (r->hist[i] & 7));
        r->s = s;
        r->n_prompt = s->g.n_prompt;
        r->n_target = s->g.n_prompt;
        r->n_fed = best_len;
        r->n_cached = best_len;
        r->salt = s->g.cache_salt;
        if (!s->g.no_prompt_cache) { /* a hit: positions reused, from the prefix cache or the row */
            pthread_mutex_lock(&e->mu);
            if (best_len > 0)
                e->stats.prefix_cache_hits++;
            else
                e->stats.prefix_cache_misses++;
            pthread_mutex_unlock(&e->mu);
        }
        r->n_gen = 0;
        r->order = e->next_order++;
        /* speculation, unless opted out; a source that cannot open the slot only means none */
        r->spec = e->src && !s->g.no_speculation &&
                  ember_draft_open(e->src, best, r->hist, r->n_hist, NULL) == EMBER_OK;
        r->phase = ROW_PREFILL;
    }
}

/* Drops cancelled requests from the waiting queue. */
static void drop_cancelled_waiting(ember_engine *e) {
    ember_stream **pp = &e->wait_head, *prev = NULL;
    while (*pp) {
        ember_stream *s = *pp;
        if (atomic_load(&s->cancel)) {
            *pp = s->next;
            if (e->wait_tail == s) e->wait_tail = prev;
            pthread_mutex_lock(&e->mu);
            e->queued--;
            pthread_mutex_unlock(&e->mu);
            end_stream(s, EMBER_FINISH_CANCELLED, s->g.n_prompt, 0, 0, 0, NULL);
        } else {
            prev = s;
            pp = &s->next;
        }
    }
}

static bool is_eos(const ember_model *m, int32_t t) {
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos_ids[i] == t) return true;
    return false;
}

/* Penalties and biases, in place on one row of logits. */
static void process_logits(const row *r, float *lg, int V) {
    const ember_gen_params *g = &r->s->g;
    for (int i = 0; i < g->n_logit_bias; i++) lg[r->s->bias[i].token] += r->s->bias[i].bias;
    float rep = g->repetition_penalty;
    bool pf = g->presence_penalty != 0 || g->frequency_penalty != 0;
    if (rep == 1.0f || rep == 0.0f) rep = 0;
    if (!pf && !rep) return;
    for (int t = 0; t < V; t++) {
        if (rep && (r->seen[t >> 3] >> (t & 7) & 1)) lg[t] = lg[t] > 0 ? lg[t] / rep : lg[t] * rep;
        if (pf && r->counts[t])
            lg[t] -= g->presence_penalty + g->frequency_penalty * (float)r->counts[t];
    }
}

/* The log-probability fields of ev for token t: from x, the row's logits
   before penalties, bias and constraint (V of them), t's log-softmax and the
   top_logprobs largest (value down, id up). */
static void fill_logprobs(const ember_gen_params *g, const float *x, int V, int32_t t, ember_event *ev) {
    const double lse = ember_log_sum_exp(x, V); /* the log-softmax normaliser */
    ev->logprob = (float)(x[t] - lse);
    const int k = g->top_logprobs;
    for (int i = 0; i < V && k > 0; i++) { /* insertion into a short sorted list */
        float v = x[i];
        int n = ev->n_top;
        if (n == k && !(v > x[ev->top_ids[n - 1]])) continue;
        int j = n < k ? n++ : n - 1;
        while (j > 0 && v > x[ev->top_ids[j - 1]]) {
            ev->top_ids[j] = ev->top_ids[j - 1];
            j--;
        }
        ev->top_ids[j] = i;
        ev->n_top = n;
    }
    for (int i = 0; i < ev->n_top; i++) ev->top_logprobs[i] = (float)(x[ev->top_ids[i]] - lse);
}

/* Samples row r's next token from lg (verifying draft when >= 0, see
   ember_sampler_sample_draft), or takes *tok as chosen when lg is NULL (a
   plain_row whose forward picked it, or a row pick_tokens drew: then lp,
   when not NULL, holds the token's log-probabilities), records it and
   reports it. Returns
   EMBER_FINISH_NONE when the request goes on, else how it ends (ERROR: the
   event queue ran out of memory); the caller ends it (end_request) once
   its KV is settled. */
static ember_finish emit_token(ember_engine *e, row *r, float *lg, int32_t draft, int32_t *tok,
                               const ember_event *lp) {
    ember_model *m = e->m;
    const int V = m->cfg.vocab_size;
    const ember_gen_params *g = &r->s->g;
    ember_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = EMBER_EV_TOKEN;
    bool want_lp = lg && (g->logprobs || g->top_logprobs > 0);
    int32_t t = *tok; /* lg NULL: the forward (plain_row) or pick_tokens chose it */
    if (lg) {
        if (want_lp) memcpy(e->raw, lg, (size_t)V * sizeof *lg);
        process_logits(r, lg, V);
        if (g->constrain_mask) g->constrain_mask(g->constrain_user, lg, V); /* this row's logits only */
        t = draft >= 0 ? ember_sampler_sample_draft(r->sampler, lg, draft) : ember_sampler_sample(r->sampler, lg);
    }
    *tok = t;
    if (g->constrain_accept) g->constrain_accept(g->constrain_user, t);
    ev.token = t;
    if (want_lp) {
        fill_logprobs(g, e->raw, V, t, &ev);
    } else if (lp) {
        ev.logprob = lp->logprob;
        ev.n_top = lp->n_top;
        memcpy(ev.top_ids, lp->top_ids, sizeof ev.top_ids);
        memcpy(ev.top_logprobs, lp->top_logprobs, sizeof ev.top_logprobs);
    }
    r->hist[r->n_hist++] = t;
    r->n_gen++;
    if (r->counts[t] < UINT32_MAX) r->counts[t]++;
    r->seen[t >> 3] |= (uint8_t)(1u << (t & 7));
    if (!stream_push(r->s, &ev)) return EMBER_FINISH_ERROR;
    bool stop = (!g->ignore_eos && is_eos(m, t));
    for (int i = 0; i < g->n_stop_ids && !stop; i++) stop = r->s->stop_ids[i] == t;
    if (stop) return EMBER_FINISH_STOP;
    if (r->n_gen >= g->max_tokens || r->n_hist > m->params.n_ctx) /* no position left to feed it */
        return EMBER_FINISH_LENGTH;
    return EMBER_FINISH_NONE;
}

/* Ends row r's request as emit_token said, or moves it on to decoding. */
static void end_request(ember_engine *e, row *r, ember_finish f) {
    if (f == EMBER_FINISH_NONE)
        r->phase = ROW_DECODE;
    else if (f == EMBER_FINISH_ERROR)
        release_row(e, r, f, EMBER_ERR_NOMEM, "out of memory queueing events");
    else
        release_row(e, r, f, 0, NULL);
}

static bool wants_logprobs(const row *r) {
    return r->s->g.logprobs || r->s->g.top_logprobs > 0;
}

/* Does process_logits leave row r's logits as they are (no bias, no
   penalty)? */
static bool logits_untouched(const row *r) {
    const ember_gen_params *g = &r->s->g;
    return g->n_logit_bias == 0 && (g->repetition_penalty == 1.0f || g->repetition_penalty == 0.0f) &&
           g->presence_penalty == 0 && g->frequency_penalty == 0;
}

/* Does row r take its token from its logits as they are (no bias,
   penalty, constraint, log-probabilities or drafts)? Then the forward may
   pick it on the device: greedy rows (temperature 0) by the largest logit
   (ember_batch.argmax: the same token as emit_token's sampler), sampled
   rows where the backend draws (ember_model_draws; ember_batch.draw: the
   device draw of core/draw_def.h, the chain of emit_token's sampler with
   the row's next uniform, so the host's token but where a cut or the draw
   falls within rounding of a boundary), without copying the logits row to
   the host. */
static bool plain_row(const row *r) {
    const ember_gen_params *g = &r->s->g;
    return r->phase != ROW_FREE && r->n_draft == 0 && logits_untouched(r) && !g->constrain_mask &&
           !g->constrain_accept && !wants_logprobs(r);
}

/* Verifies row r's n_draft drafts against this step's logits (rows o_last,
   then o_draft ..): each position goes through emit_token in order, the
   walk stops at the first token that is not its draft (the target's own
   token: a correction), after the last draft (the bonus token) or when the
   request ends. The row's speculative KV round then keeps the positions
   whose tokens stand (the fed last token and the accepted drafts). Adds
   the accepted drafts to *accepted and the tokens produced to *produced,
   and sets *fin to how the request ends (EMBER_FINISH_NONE: it goes on) for
   the caller's end_request, once the row's counts are in the stats.
   Returns false when the row was released here already (its KV round
   could not commit; *fin is then unset). */
static bool verify_drafts(ember_engine *e, row *r, float *logits, uint64_t *accepted, uint64_t *produced,
                          ember_finish *fin) {
    ember_kv *kv = e->m->kv;
    const size_t V = (size_t)e->m->cfg.vocab_size;
    const int i = (int)(r - e->rows), d = r->n_draft;
    int j = 0, acc = 0;
    ember_finish f;
    for (;;) {
        float *lg = logits + (size_t)(j == 0 ? r->o_last : r->o_draft + j - 1) * V; /* penalties apply in place */
        int32_t want = j < d ? r->draft[j] : -1, t;
        f = emit_token(e, r, lg, want, &t, NULL);
        if (j < d && t == want) acc++;
        if (f != EMBER_FINISH_NONE || j == d || t != want) break;
        j++;
    }
    r->n_draft = 0;
    *accepted += (uint64_t)acc;
    *produced += (uint64_t)j + 1;
    ember_draft_commit(e->src, i, d, acc);
    ember_error err = {0};
    if (ember_kv_spec_commit(kv, i, j + 1, &err) != EMBER_OK) { /* cannot happen: the round holds d + 1 */
        ember_kv_clear(kv, i);
        release_row(e, r, EMBER_FINISH_ERROR, EMBER_ERR_INTERNAL, err.msg);
        return false;
    }
    *fin = f;
    return true;
}

/* Drops a running row's KV to free memory (the most recently admitted one
   that is not `keep` and came after `after`): it goes back to prefilling its whole history, which
   reproduces its KV exactly (batch and chunk invariance), so its output is
   unchanged. false when there is no other running row. */
static bool preempt_newest(ember_engine *e, int keep, uint64_t after) {
    row *v = NULL;
    for (int i = 0; i < e->n_rows; i++) {
        row *r = &e->rows[i];
        if (i != keep && r->phase != ROW_FREE && r->order > after && ember_kv_len(e->m->kv, i) > 0 &&
            (!v || r->order > v->order))
            v = r;
    }
    if (!v) return false;
    int i = (int)(v - e->rows);
    ember_kv_clear(e->m->kv, i);
    /* a decoding row feeds its last token next: prefill everything up to it
       and sample from the last position, as its decode step would */
    v->n_target = v->n_hist;
    v->n_fed = 0;
    v->phase = ROW_PREFILL;
    pthread_mutex_lock(&e->mu);
    e->stats.preempted_total++;
    pthread_mutex_unlock(&e->mu);
    return true;
}

/* Step pacing (pace.h has the cost model and the budget). PACE_DEFAULT is
   what prefill_pace 0 means (ember_engine_new resolves it). At 16 streams
   of a 0.5B model on 2 cores (bench/RESULTS.md, "Step pacing: the
   default"), a step of 16 prompt tokens kept the mixed-load ITL p99 at
   1.2-2.0x the decode-only p99 with a first token in 0.6-0.8 s; pace 2
   (20-30 tokens there) let the p99 reach 1.7-3.6x; a floor of 8 or 4
   brought it to 0.6-0.9x but the first token to 5-10 s and cost 20-40% of
   the throughput. Pace 1.5 asks for 11-16 tokens there, so the floor
   (PACE_MIN) holds it at 16. */
#define PACE_DEFAULT 1.5f

/* Folds a step's time into the pacing fit: every step without drafts (a
   draft's cost is not a token's: it comes with its source's own work), so
   that a server's first prompts, prefilled alone, already give the line its
   slope. */
static void pace_measure(ember_engine *e, double dt, int n_dec, int n_prompt, int n_draft) {
    if (n_draft == 0 && n_dec + n_prompt > 0) {
        pace_fit_add(&e->fit, n_dec + n_prompt, dt);
        e->fit_dec = n_dec;
    }
}

/* Makes KV room for every decoding row's next position: cached prefixes
   first, then the newest rows are preempted; a row that alone fills the
   budget ends (EMBER_FINISH_LENGTH). */
static void make_decode_room(ember_engine *e) {
    ember_kv *kv = e->m->kv;
    for (;;) {
        size_t need = 0;
        for (int i = 0; i < e->n_rows; i++)
            if (e->rows[i].phase == ROW_DECODE) need += ember_kv_need_bytes(kv, i, 1);
        if (need <= ember_kv_free_bytes(kv)) break;
        if (evict_cached(e, -1)) continue;
        int oldest = -1;
        for (int i = 0; i < e->n_rows; i++)
            if (e->rows[i].phase == ROW_DECODE && (oldest < 0 || e->rows[i].order < e->rows[oldest].order)) oldest = i;
        if (!preempt_newest(e, oldest, 0)) {
            /* one row alone has filled the KV budget: its context ends here */
            if (oldest >= 0) release_row(e, &e->rows[oldest], EMBER_FINISH_LENGTH, 0, NULL);
            break;
        }
    }
}

/* Puts each decoding row's last token into the batch (e->plan[i] = 1 for
   those); *nt and *no count the batch's tokens and outputs. */
static void plan_decode(ember_engine *e, int *nt_io, int *no_io) {
    ember_model *m = e->m;
    int *out_row = e->out_row, nt = *nt_io, no = *no_io;
    for (int i = 0; i < e->n_rows; i++) {
        row *r = &e->rows[i];
        e->plan[i] = 0;
        r->n_draft = 0;
        if (r->phase != ROW_DECODE) continue;
        m->b_tok[nt] = r->hist[r->n_hist - 1];
        m->b_pos[nt] = r->n_hist - 1;
        m->b_row[nt] = i;
        m->b_out[no] = nt;
        r->o_last = no;
        out_row[no++] = i;
        e->plan[i] = 1;
        r->used = e->steps;
        nt++;
    }
    *nt_io = nt;
    *no_io = no;
}

/* Adds prefill chunks, the oldest admitted rows first, within the batch
   size, the step's prefill budget (paced when rows decode: *paced tells
   whether the pace, not the prompts, bounded it) and the KV memory left
   (*spare, reduced by what is planned); a row that cannot fit makes room
   or ends. */
/*
 * The prefill chunk of a row whose cache asks forwards to hold spans of
 * `span` positions whole (ember_kv_chunk_span: a hybrid model, whose delta
 * rule runs a chunked form on such spans and a recurrent form elsewhere;
 * the two agree only to rounding), k positions asked for, room the most the
 * batch and the cache allow. So that a request's bits do not depend on how
 * busy the engine is (pacing, other rows), the prompt is cut only at span
 * boundaries (at least up to the next one, even past the step's budget) or
 * at its end; and after a preemption, the generated tokens (decoded one by
 * one the first time) are recomputed in pieces shorter than a span, which
 * never hold one whole. Where the batch or the cache cannot take a whole
 * span (max_batch_tokens below it), the plain chunk goes: correct, equal
 * only to rounding.
 */
static int span_chunk(const row *r, int span, int k, int room) {
    if (r->n_fed >= r->n_prompt) return k < span - 1 ? k : span - 1;
    int end = r->n_fed + k;
    if (end >= r->n_prompt) return r->n_prompt - r->n_fed; /* the prompt's end (k held all of it) */
    int aligned = end / span * span;
    if (aligned <= r->n_fed) aligned = (r->n_fed / span + 1) * span; /* the next boundary */
    if (aligned > r->n_prompt) aligned = r->n_prompt;
    return aligned - r->n_fed <= room ? aligned - r->n_fed : k;
}

static void plan_prefill(ember_engine *e, int *nt_io, int *no_io, size_t *spare_io, bool *paced_out) {
    ember_model *m = e->m;
    ember_kv *kv = m->kv;
    const int B = m->params.max_batch_tokens;
    int *out_row = e->out_row, nt = *nt_io, no = *no_io, n_dec = 0;
    size_t spare = *spare_io;
    for (int i = 0; i < e->n_rows; i++) n_dec += e->plan[i];
    int budget = e->p.prefill_chunk;
    bool paced = false;
    if (n_dec > 0) { /* rows are decoding: keep their pace */
        int b = pace_budget(&e->fit, e->p.prefill_pace, n_dec, budget);
        paced = b < budget;
        budget = b;
    }
    while (nt < B && budget > 0) { /* prefill the oldest admitted rows first, in the memory left */
        row *r = NULL;
        for (int i = 0; i < e->n_rows; i++) {
            row *c = &e->rows[i];
            if (c->phase == ROW_PREFILL && c->n_fed < c->n_target && c->stamp != e->steps &&
                (!r || c->order < r->order))
                r = c;
        }
        if (!r) break;
        int i = (int)(r - e->rows);
        r->stamp = e->steps; /* one chunk per row per step */
        int k = r->n_target - r->n_fed;
        if (k > B - nt) k = B - nt;
        if (k > budget) k = budget;
        int lim = ember_kv_max_append(kv, i); /* chunks stop at a KV conversion offset */
        if (k > lim) k = lim;
        const int span = ember_kv_chunk_span(kv);
        if (span) k = span_chunk(r, span, k, (B - nt) < lim ? B - nt : lim);
        while (k > 0 && ember_kv_need_bytes(kv, i, k) > spare) k = k > EMBER_KV_BLOCK ? k - EMBER_KV_BLOCK : k - 1;
        if (k <= 0) {
            /* no memory for this row now: drop cached prefixes (no request loses
               anything), whatever else the step holds; then, with nothing else
               in the step, rows admitted after it (so the oldest always
               progresses); alone, it can never fit. (Admission counts the
               blocks of the row's old KV as coming back, but those the prefix
               cache shares stay until evicted here.) */
            const size_t before = ember_kv_free_bytes(kv);
            if (evict_cached(e, i)) {
                spare += ember_kv_free_bytes(kv) - before;
                r->stamp = 0; /* try again within this step */
                continue;
            }
            if (nt > 0) continue;
            if (preempt_newest(e, i, r->order)) {
                r->stamp = 0;
                spare = ember_kv_free_bytes(kv);
                continue;
            }
            bool older = false;
            for (int j = 0; j < e->n_rows && !older; j++)
                older = j != i && e->rows[j].phase != ROW_FREE && e->rows[j].order < r->order;
            if (!older)
                release_row(e, r, EMBER_FINISH_ERROR, EMBER_ERR_NOMEM, "the KV cache budget cannot hold this request");
            continue;
        }
        spare -= ember_kv_need_bytes(kv, i, k);
        for (int j = 0; j < k; j++) {
            m->b_tok[nt] = r->hist[r->n_fed + j];
            m->b_pos[nt] = r->n_fed + j;
            m->b_row[nt] = i;
            nt++;
        }
        budget -= k;
        r->used = e->steps;
        if (r->n_fed + k == r->n_target) {
            m->b_out[no] = nt - 1;
            out_row[no++] = i;
        }
        r->n_fed += k; /* committed below only if the forward succeeds */
    }
    *paced_out = paced && budget == 0 && nt > *nt_io; /* the cap, not the prompts' ends, bounded the step */
    *nt_io = nt;
    *no_io = no;
    *spare_io = spare;
}

/* Adds the draft tokens of the speculating decoding rows in the batch room
   and memory the prefill left (it goes first, so speculation never holds
   up a prompt); each feeds what its source proposes after its last token,
   inside a KV round. */
static void plan_drafts(ember_engine *e, int *nt_io, int *no_io, size_t spare) {
    ember_model *m = e->m;
    ember_kv *kv = m->kv;
    const int B = m->params.max_batch_tokens;
    int *out_row = e->out_row, nt = *nt_io, no = *no_io, n = 0, room = B - nt;
    /* the rows that draft this step and how many each may: the batch room
       goes to them in row order, each taking its cap */
    for (int i = 0; i < e->n_rows && e->src; i++) {
        row *r = &e->rows[i];
        if (!e->plan[i] || !r->spec) continue;
        int cap = e->p.draft_max, lim = ember_kv_max_append(kv, i) - 1; /* the context's end, a conversion offset */
        if (r->s->g.draft_max > 0 && r->s->g.draft_max < cap) cap = r->s->g.draft_max;
        if (cap > lim) cap = lim;
        if (cap > r->s->g.max_tokens - r->n_gen - 1) cap = r->s->g.max_tokens - r->n_gen - 1; /* tokens it may still take */
        if (cap > room) cap = room;
        if (cap < e->p.draft_min) continue;
        e->d_slot[n] = i;
        e->d_hist[n] = r->hist;
        e->d_nhist[n] = r->n_hist;
        e->d_cap[n] = cap;
        e->d_out[n] = r->draft;
        n++;
        room -= cap;
    }
    /* one call: a draft model proposes for every row in shared forwards */
    ember_draft_propose_many(e->src, n, e->d_slot, e->d_hist, e->d_nhist, e->d_cap, e->d_out, e->d_n);
    for (int j = 0; j < n; j++) {
        const int i = e->d_slot[j];
        row *r = &e->rows[i];
        int d = e->d_n[j];
        size_t base = ember_kv_need_bytes(kv, i, 1), extra = 0;
        while (d >= e->p.draft_min && (extra = ember_kv_need_bytes(kv, i, 1 + d) - base) > spare) d--;
        if (d < e->p.draft_min || ember_kv_spec_begin(kv, i, NULL) != EMBER_OK) continue;
        spare -= extra;
        r->n_draft = d;
        r->o_draft = no;
        for (int k = 0; k < d; k++) {
            m->b_tok[nt] = r->draft[k];
            m->b_pos[nt] = r->n_hist + k;
            m->b_row[nt] = i;
            m->b_out[no] = nt;
            out_row[no++] = i;
            nt++;
        }
    }
    *nt_io = nt;
    *no_io = no;
}

/* Does row r's token come from its logits row and its own state alone (no
   drafts to verify, no constraint; log-probabilities only where the logits
   stay untouched, so that they can be read after the draw without the
   engine's shared copy)? Then pick_tokens may draw it beside others. */
static bool pick_alone(const row *r) {
    const ember_gen_params *g = &r->s->g;
    return r->n_draft == 0 && !g->constrain_mask && !g->constrain_accept && (!wants_logprobs(r) || logits_untouched(r));
}

/* One of pick_tokens' tasks: output pick_o[k]'s penalties and draw, as
   emit_token would do them (the row's sampler, its logits row in place),
   and its log-probabilities into pick_ev[o] when the request asks. */
static void pick_task(void *ctx, int k, int thread) {
    (void)thread;
    ember_engine *e = ctx;
    const int o = e->pick_o[k], V = e->m->cfg.vocab_size;
    row *r = &e->rows[e->out_row[o]];
    float *lg = e->m->logits + (size_t)o * (size_t)V;
    process_logits(r, lg, V);
    e->ids[o] = ember_sampler_sample(r->sampler, lg);
    if (wants_logprobs(r)) { /* pick_alone: process_logits left lg as it was */
        memset(&e->pick_ev[o], 0, sizeof e->pick_ev[o]);
        fill_logprobs(&r->s->g, lg, V, e->ids[o], &e->pick_ev[o]);
    }
}

/* Before take_outputs hands out a step's tokens (when the forward chose
   none): the outputs of rows that pick_alone accepts are drawn at once on
   the backend's host threads (host_run; in order here without one), each
   row with its own sampler and logits, so the tokens are the ones a draw
   after another would give. Sets e->ids[o] and e->picked[o] for them (and
   clears picked for the rest); with fewer than two such rows it leaves
   them all to emit_token. */
static void pick_tokens(ember_engine *e, int no) {
    int n = 0;
    for (int o = 0; o < no; o++) {
        const row *r = &e->rows[e->out_row[o]];
        e->picked[o] = false;
        if (r->phase == ROW_FREE || (e->plan[e->out_row[o]] && o != r->o_last) || !pick_alone(r)) continue;
        e->pick_o[n++] = o;
    }
    if (n < 2) return;
    ember_backend *be = e->m->be;
    if (be->ops->host_run)
        be->ops->host_run(be, n, pick_task, e);
    else
        for (int k = 0; k < n; k++) pick_task(e, k, 0);
    for (int k = 0; k < n; k++) e->picked[e->pick_o[k]] = true;
}

/* After a forward: each output's logits go to its row (a sampled token, or
   the verification of its drafts), and the step's counts into e->stats.
   A row's counts go in before its request can end (end_request pushes the
   final event), so a client that sees a request end and then reads the
   stats finds every token it was given counted. */
static void take_outputs(ember_engine *e, int no, bool chosen) {
    ember_model *m = e->m;
    const int V = m->cfg.vocab_size;
    int *out_row = e->out_row;
    pthread_mutex_lock(&e->mu);
    e->stats.steps_total++;
    pthread_mutex_unlock(&e->mu);
    if (!chosen) pick_tokens(e, no);
    for (int o = 0; o < no; o++) {
        row *r = &e->rows[out_row[o]];
        bool decoding = e->plan[out_row[o]];
        if (decoding && o != r->o_last) continue; /* a draft's logits: read by verify_drafts */
        if (r->phase == ROW_FREE) continue;
        uint64_t drafted = 0, accepted = 0, produced = 0;
        ember_finish f;
        if (r->n_draft > 0) {
            drafted = (uint64_t)r->n_draft;
            if (!verify_drafts(e, r, m->logits, &accepted, &produced, &f)) continue; /* released */
        } else {
            produced = decoding;
            const bool have = chosen || e->picked[o]; /* the forward or pick_tokens chose it */
            int32_t t = have ? e->ids[o] : 0;
            const ember_event *lp = !chosen && e->picked[o] && wants_logprobs(r) ? &e->pick_ev[o] : NULL;
            f = emit_token(e, r, have ? NULL : m->logits + (size_t)o * (size_t)V, -1, &t, lp);
        }
        pthread_mutex_lock(&e->mu);
        e->stats.spec_drafted_total += drafted;
        e->stats.spec_accepted_total += accepted;
        e->stats.spec_forwards_total += drafted > 0;
        e->stats.decode_forwards_total += decoding;
        e->stats.decode_tokens_total += produced;
        pthread_mutex_unlock(&e->mu);
        end_request(e, r, f);
    }
}

/* A source reading the target's taps: the batch asks them for every token
   of a speculating row (its prompt chunks, last token and drafts). */
static void ask_taps(ember_engine *e, ember_batch *b) {
    int n = 0;
    for (int k = 0; k < b->n; k++)
        if (e->rows[b->row[k]].spec) e->tap_idx[n++] = k;
    if (!n) return;
    b->n_tap = n;
    b->tap = e->tap_idx;
    b->n_tap_layers = e->src->n_tap_layers;
    b->tap_layers = e->src->tap_layers;
    b->taps = e->taps;
}

/* After the forward, before verification: the taps to the source, with
   each row's history so far (it keeps what the history later confirms). */
static void give_taps(ember_engine *e, const ember_batch *b) {
    for (int k = 0; k < b->n_tap; k++) {
        int i = b->tap[k];
        e->tap_row[k] = b->row[i];
        e->tap_pos[k] = b->pos[i];
        e->tap_tok[k] = b->tok[i];
    }
    for (int i = 0; i < e->n_rows; i++) {
        e->tap_hist[i] = e->rows[i].hist;
        e->tap_nhist[i] = e->rows[i].n_hist;
    }
    ember_draft_observe(e->src, b->n_tap, e->tap_row, e->tap_pos, e->tap_tok, e->taps, e->tap_hist, e->tap_nhist);
}

/* One engine step: plan a batch (decode, prefill chunks, drafts), run the
   forward, hand out the results. Returns false when there was nothing to do. */
static bool step(ember_engine *e) {
    ember_model *m = e->m;
    ember_kv *kv = m->kv;
    for (int i = 0; i < e->n_rows; i++) /* cancellations take effect at step boundaries */
        if (e->rows[i].phase != ROW_FREE && atomic_load(&e->rows[i].s->cancel))
            release_row(e, &e->rows[i], EMBER_FINISH_CANCELLED, 0, NULL);
    make_decode_room(e); /* decode rows first: each needs its next position */
    int nt = 0, no = 0;
    plan_decode(e, &nt, &no);
    const int n_dec = nt;
    size_t spare = ember_kv_free_bytes(kv);
    for (int i = 0; i < e->n_rows; i++)
        if (e->plan[i]) spare -= ember_kv_need_bytes(kv, i, 1);
    bool paced = false;
    plan_prefill(e, &nt, &no, &spare, &paced);
    const int n_fill = nt - n_dec; /* prompt tokens */
    if (e->src) plan_drafts(e, &nt, &no, spare);
    e->steps++;
    if (nt == 0) return false;
    ember_error err = {0};
    /* every output a plain greedy row, or a plain sampled one where the backend draws: the forward
       picks the tokens (each sampled row's uniform taken from its sampler only then) */
    bool chosen = no > 0, drawn = false;
    const bool can_draw = ember_model_draws(m);
    for (int o = 0; o < no && chosen; o++) {
        const row *r = &e->rows[e->out_row[o]];
        const bool sampled = r->s->g.sampling.temperature > 0;
        chosen = plain_row(r) && (!sampled || can_draw);
        drawn |= sampled;
    }
    for (int o = 0; chosen && drawn && o < no; o++)
        e->draws[o] = ember_sampler_draw(e->rows[e->out_row[o]].sampler);
    ember_batch b = {.n = nt, .tok = m->b_tok, .pos = m->b_pos, .row = m->b_row, .n_out = no, .out = m->b_out,
                     .argmax = chosen ? e->ids : NULL, .draw = chosen && drawn ? e->draws : NULL};
    if (e->taps) ask_taps(e, &b);
    const double t0 = ember_now();
    int rc = ember_llm_forward(m->llm, m->st, kv, &b, m->logits, &err);
    if (rc) { /* nothing was stored: every row in the batch fails */
        for (int k = 0; k < nt; k++) {
            row *r = &e->rows[m->b_row[k]];
            if (r->phase == ROW_FREE) continue;
            ember_kv_clear(kv, (int)(r - e->rows));
            release_row(e, r, EMBER_FINISH_ERROR, rc, err.msg);
        }
        return true;
    }
    if (e->px) /* prompts' full blocks go into the prefix cache as they are prefilled */
        for (int i = 0; i < e->n_rows; i++) {
            row *r = &e->rows[i];
            if (r->phase == ROW_PREFILL && r->stamp == e->steps - 1 && !r->s->g.no_prompt_cache)
                (void)ember_kv_prefix_publish(e->px, i, r->hist, ember_kv_len(kv, i), r->s->g.cache_salt);
        }
    if (b.n_tap) give_taps(e, &b);
    take_outputs(e, no, chosen);
    pace_measure(e, ember_now() - t0, n_dec, n_fill, nt - n_dec - n_fill);
    pthread_mutex_lock(&e->mu);
    e->stats.prefill_paced_steps += paced;
    double fit_f, fit_c;
    if (pace_fit_get(&e->fit, &fit_f, &fit_c)) {
        e->stats.step_decode_seconds = fit_f + fit_c * e->fit_dec;
        e->stats.step_prefill_token_seconds = fit_c;
    }
    pthread_mutex_unlock(&e->mu);
    return true;
}

/* The disk tier's figures into e->stats (under mu once the thread runs). */
static void disk_stats(ember_engine *e) {
    if (!e->disk) return;
    ember_kv_disk_stats ds;
    ember_kv_disk_get_stats(e->disk, &ds);
    e->stats.disk_cache_files = ds.files;
    e->stats.disk_cache_bytes = ds.bytes;
    e->stats.disk_cache_restores = ds.restores;
    e->stats.disk_cache_tokens_restored = ds.tokens_restored;
    e->stats.disk_cache_writes = ds.writes;
    e->stats.disk_cache_removed = ds.removed;
    e->stats.disk_cache_evictions = ds.evictions;
}

static void publish_stats(ember_engine *e) {
    int running = 0;
    size_t used = 0;
    for (int i = 0; i < e->n_rows; i++)
        if (e->rows[i].phase != ROW_FREE) {
            running++;
            used += ember_kv_row_bytes(e->m->kv, i);
        }
    pthread_mutex_lock(&e->mu);
    e->stats.running = running;
    e->stats.kv_bytes_used = used;
    e->stats.kv_bytes_held = ember_kv_used_bytes(e->m->kv);
    e->stats.kv_bytes_touched = ember_kv_touched_bytes(e->m->kv);
    e->stats.kv_blocks_used = ember_kv_blocks_used(e->m->kv);
    /* the prefix cache's figures come from a scan of its entries: at most every
       0.1 s while requests run, and always once the engine is idle */
    double now = ember_now();
    if (e->px && (running == 0 || now - e->px_stats_at >= 0.1)) {
        e->px_stats_at = now;
        ember_kv_prefix_stats ps;
        ember_kv_prefix_get_stats(e->px, &ps);
        e->stats.prefix_cache_entries = ps.entries;
        e->stats.prefix_cache_bytes = ps.bytes;
        e->stats.prefix_cache_bytes_unused = ps.bytes_exclusive;
        e->stats.prefix_cache_evictions = ps.evictions;
    }
    disk_stats(e);
    int waiting = 0;
    for (ember_stream *s = e->wait_head; s; s = s->next) waiting++;
    for (ember_stream *s = e->inbox; s; s = s->next) waiting++;
    e->stats.waiting = waiting;
    pthread_mutex_unlock(&e->mu);
}

static void *engine_main(void *arg) {
    ember_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        for (;;) {
            bool busy = e->wait_head != NULL;
            for (int i = 0; i < e->n_rows && !busy; i++) busy = e->rows[i].phase != ROW_FREE;
            if (e->stop || e->inbox || busy) break;
            if (e->disk_work) { /* nothing else to do: a slice of the disk tier's writing */
                pthread_mutex_unlock(&e->mu);
                e->disk_work = ember_kv_disk_work(e->disk, (size_t)4 << 20);
                publish_stats(e);
                pthread_mutex_lock(&e->mu);
                continue;
            }
            pthread_cond_wait(&e->cv, &e->mu);
        }
        bool stop = e->stop;
        ember_stream *in = e->inbox; /* take the inbox */
        e->inbox = e->inbox_tail = NULL;
        pthread_mutex_unlock(&e->mu);
        while (in) {
            ember_stream *n = in->next;
            in->next = NULL;
            if (e->wait_tail)
                e->wait_tail->next = in;
            else
                e->wait_head = in;
            e->wait_tail = in;
            in = n;
        }
        if (stop) break;
        drop_cancelled_waiting(e);
        admit(e);
        step(e);
        publish_stats(e);
    }
    /* shut down: everything still here is cancelled */
    for (int i = 0; i < e->n_rows; i++)
        if (e->rows[i].phase != ROW_FREE) release_row(e, &e->rows[i], EMBER_FINISH_CANCELLED, 0, NULL);
    while (e->wait_head) {
        ember_stream *s = e->wait_head;
        e->wait_head = s->next;
        end_stream(s, EMBER_FINISH_CANCELLED, s->g.n_prompt, 0, 0, 0, NULL);
    }
    e->wait_tail = NULL;
    while (e->disk_work) /* the queued writes, whole: a restart finds them */
        e->disk_work = ember_kv_disk_work(e->disk, SIZE_MAX);
    publish_stats(e);
    return NULL;
}

int ember_engine_new(ember_model *m, const ember_engine_params *p, ember_engine **out, ember_error *err) {
    *out = NULL;
    if (!m) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_engine_new: no model");
    ember_engine_params ep = {0};
    if (p) ep = *p;
    if (ep.spec != EMBER_SPEC_NONE && ep.spec != EMBER_SPEC_NGRAM && ep.spec != EMBER_SPEC_DRAFT &&
        ep.spec != EMBER_SPEC_EAGLE3 && ep.spec != EMBER_SPEC_DFLASH && ep.spec != EMBER_SPEC_MTP)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_engine_new: unknown speculative mode %d", (int)ep.spec);
    if (ep.draft_max <= 0) ep.draft_max = 8;
    if (ep.draft_min <= 0) ep.draft_min = 1;
    if (ep.ngram_min <= 0) ep.ngram_min = 1;
    if (ep.ngram_max <= 0) ep.ngram_max = ep.ngram_min > 3 ? ep.ngram_min : 3;
    if (ep.draft_max > EMBER_MAX_DRAFT)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "draft_max %d is above the limit of %d", ep.draft_max,
                         EMBER_MAX_DRAFT);
    if (ep.draft_min > ep.draft_max)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "draft_min %d is above draft_max %d", ep.draft_min, ep.draft_max);
    if (ep.ngram_max < ep.ngram_min || ep.ngram_max > 16)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "n-gram sizes %d..%d: want 1 <= min <= max <= 16", ep.ngram_min,
                         ep.ngram_max);
    ember_engine *e = ember_calloc(1, sizeof *e);
    if (!e) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->m = m;
    e->p = ep;
    if (e->p.max_queue <= 0) e->p.max_queue = 256;
    if (e->p.prefill_chunk <= 0 || e->p.prefill_chunk > m->params.max_batch_tokens)
        e->p.prefill_chunk = m->params.max_batch_tokens;
    if (e->p.prefill_pace == 0) e->p.prefill_pace = PACE_DEFAULT;
    else if (e->p.prefill_pace < 0) e->p.prefill_pace = -1.0f;
    e->stats.prefill_pace = e->p.prefill_pace;
    const int V = m->cfg.vocab_size;
    e->n_rows = m->params.n_rows;
    e->rows = ember_calloc((size_t)e->n_rows, sizeof *e->rows);
    e->raw = ember_malloc((size_t)V * sizeof *e->raw);
    /* logits rows of a step: one per decoding row or prompt end, and one per draft token */
    size_t n_out = (size_t)e->n_rows, drafts = e->p.spec ? n_out * (size_t)e->p.draft_max : 0;
    if (drafts > (size_t)m->params.max_batch_tokens) drafts = (size_t)m->params.max_batch_tokens;
    n_out += drafts;
    e->out_row = ember_malloc(n_out * sizeof *e->out_row);
    e->ids = ember_malloc(n_out * sizeof *e->ids);
    e->draws = ember_malloc(n_out * sizeof *e->draws);
    e->pick_o = ember_malloc(n_out * sizeof *e->pick_o);
    e->picked = ember_calloc(n_out, sizeof *e->picked);
    e->pick_ev = ember_calloc(n_out, sizeof *e->pick_ev);
    e->d_slot = ember_malloc((size_t)e->n_rows * sizeof *e->d_slot);
    e->d_nhist = ember_malloc((size_t)e->n_rows * sizeof *e->d_nhist);
    e->d_cap = ember_malloc((size_t)e->n_rows * sizeof *e->d_cap);
    e->d_n = ember_malloc((size_t)e->n_rows * sizeof *e->d_n);
    e->d_hist = ember_malloc((size_t)e->n_rows * sizeof *e->d_hist);
    e->d_out = ember_malloc((size_t)e->n_rows * sizeof *e->d_out);
    e->plan = ember_calloc((size_t)e->n_rows, sizeof *e->plan);
    e->steps = 1;
    int rc = e->rows && e->raw && e->out_row && e->ids && e->draws && e->pick_o && e->picked && e->pick_ev &&
                     e->plan && e->d_slot && e->d_nhist && e->d_cap && e->d_n && e->d_hist && e->d_out
                 ? EMBER_OK
                 : ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    ember_sampling sp;
    ember_sampling_init(&sp);
    for (int i = 0; i < e->n_rows && !rc; i++) {
        row *r = &e->rows[i];
        r->hist = ember_malloc(((size_t)m->params.n_ctx + 1) * sizeof *r->hist);
        r->counts = ember_calloc((size_t)V, sizeof *r->counts);
        r->seen = ember_calloc((size_t)V / 8 + 1, 1);
        r->draft = e->p.spec ? ember_malloc((size_t)e->p.draft_max * sizeof *r->draft) : NULL;
        if (!r->hist || !r->counts || !r->seen || (e->p.spec && !r->draft))
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        if (!rc) rc = ember_sampler_new(&sp, V, &r->sampler, err);
        ember_kv_clear(m->kv, i);
    }
    if (!rc) rc = ember_engine_reserve_logits(m, n_out, err);
    if (!rc && e->p.spec == EMBER_SPEC_NGRAM) /* the whole context is searched, up to 8192 tokens */
        rc = ember_draft_ngram_new(e->n_rows, e->p.ngram_min, e->p.ngram_max,
                                   m->params.n_ctx < 8192 ? (m->params.n_ctx > 2 ? m->params.n_ctx : 2) : 8192, &e->src,
                                   err);
    if (!rc && e->p.spec == EMBER_SPEC_DRAFT) rc = ember_draft_model_new(e->p.draft_model, m, e->n_rows, &e->src, err);
    if (!rc && e->p.spec == EMBER_SPEC_EAGLE3) rc = ember_draft_eagle3_new(e->p.draft_model, m, e->n_rows, &e->src, err);
    if (!rc && e->p.spec == EMBER_SPEC_DFLASH) rc = ember_draft_dflash_new(e->p.draft_model, m, e->n_rows, &e->src, err);
    if (!rc && e->p.spec == EMBER_SPEC_MTP) rc = ember_draft_mtp_new(m, e->n_rows, &e->src, err);
    if (!rc && e->src && e->src->n_tap_layers > 0) { /* the taps of a whole batch, for the source */
        const size_t B = (size_t)m->params.max_batch_tokens, R = (size_t)e->n_rows;
        e->tap_idx = ember_malloc(B * sizeof *e->tap_idx);
        e->tap_row = ember_malloc(B * sizeof *e->tap_row);
        e->tap_pos = ember_malloc(B * sizeof *e->tap_pos);
        e->tap_tok = ember_malloc(B * sizeof *e->tap_tok);
        e->taps = ember_malloc(B * (size_t)e->src->tap_width * sizeof *e->taps);
        e->tap_hist = ember_malloc(R * sizeof *e->tap_hist);
        e->tap_nhist = ember_malloc(R * sizeof *e->tap_nhist);
        if (!e->tap_idx || !e->tap_row || !e->tap_pos || !e->tap_tok || !e->taps || !e->tap_hist || !e->tap_nhist)
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory for the target's taps");
    }
    if (!rc) rc = ember_kv_prefix_new(m->kv, &e->px, err);
    if (!rc && !ember_kv_prefix_supported(e->px)) { /* recurrent state: reuse stays per row (and disk) */
        ember_kv_prefix_free(e->px);
        e->px = NULL;
    }
    if (!rc && e->p.prompt_cache_dir) {
        uint64_t fp = ember_mix64(m->fingerprint ^ ember_mix64(e->p.prompt_cache_tag + 1));
        rc = ember_kv_disk_open(m->kv, e->p.prompt_cache_dir, e->p.prompt_cache_max, fp, &m->log, &e->disk, err);
    }
    e->p.prompt_cache_dir = NULL; /* the caller's string: not kept */
    disk_stats(e);
    e->stats.rows = e->n_rows;
    e->stats.kv_bytes_total = ember_kv_capacity_bytes(m->kv);
    if (!rc && pthread_create(&e->thread, NULL, engine_main, e) != 0)
        rc = ember_err(err, EMBER_ERR_NOMEM, "cannot start the engine thread");
    if (rc) {
        ember_engine_free(e);
        return rc;
    }
    e->started = true;
    *out = e;
    return EMBER_OK;
}

int ember_engine_submit(ember_engine *e, const ember_gen_params *g, ember_stream **out, ember_error *err) {
    *out = NULL;
    if (!e || !g) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_engine_submit: no engine or parameters");
    const ember_model *m = e->m;
    const int V = m->cfg.vocab_size, C = m->params.n_ctx;
    if (!g->prompt || g->n_prompt < 1) return ember_err(err, EMBER_ERR_INVALID_ARG, "the prompt is empty");
    if (g->n_prompt > C)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the prompt has %d tokens but the context holds %d", g->n_prompt,
                         C);
    if (g->max_tokens < 1) return ember_err(err, EMBER_ERR_INVALID_ARG, "max_tokens must be at least 1");
    if (ember_kv_request_bytes(m->kv, g->n_prompt) > ember_kv_capacity_bytes(m->kv))
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "the prompt of %d tokens needs %.1f MiB of KV cache, more than its whole budget of %.1f MiB",
                         g->n_prompt, (double)ember_kv_request_bytes(m->kv, g->n_prompt) / (1 << 20),
                         (double)ember_kv_capacity_bytes(m->kv) / (1 << 20));
    for (int i = 0; i < g->n_prompt; i++)
        if (g->prompt[i] < 0 || g->prompt[i] >= V)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "prompt token %d (id %d) is outside the vocabulary [0, %d)",
                             i, g->prompt[i], V);
    if (g->n_logit_bias < 0 || g->n_logit_bias > V || (g->n_logit_bias && !g->logit_bias))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "invalid logit_bias");
    for (int i = 0; i < g->n_logit_bias; i++)
        if (g->logit_bias[i].token < 0 || g->logit_bias[i].token >= V || !isfinite(g->logit_bias[i].bias))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "logit_bias: token %d / bias %g invalid",
                             g->logit_bias[i].token, (double)g->logit_bias[i].bias);
    if (g->n_stop_ids < 0 || g->n_stop_ids > 1024 || (g->n_stop_ids && !g->stop_ids))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "invalid stop ids");
    if (g->top_logprobs < 0 || g->top_logprobs > EMBER_MAX_TOP_LOGPROBS)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "top_logprobs must be between 0 and %d", EMBER_MAX_TOP_LOGPROBS);
    if (!isfinite(g->presence_penalty) || !isfinite(g->frequency_penalty) || !isfinite(g->repetition_penalty) ||
        g->repetition_penalty < 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "penalties must be finite (repetition_penalty > 0)");
    const ember_sampling *sp = &g->sampling; /* checked now, not at admission */
    if (!isfinite(sp->temperature) || sp->temperature < 0 || !(sp->top_p > 0 && sp->top_p <= 1) ||
        !(sp->min_p >= 0 && sp->min_p <= 1) || sp->top_k < 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "sampling: temperature >= 0, top_p in (0, 1], min_p in [0, 1], top_k >= 0 required");
    ember_stream *s = ember_calloc(1, sizeof *s);
    if (!s) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    s->g = *g;
    s->prompt = ember_malloc((size_t)g->n_prompt * sizeof *s->prompt);
    s->bias = g->n_logit_bias ? ember_malloc((size_t)g->n_logit_bias * sizeof *s->bias) : NULL;
    s->stop_ids = g->n_stop_ids ? ember_malloc((size_t)g->n_stop_ids * sizeof *s->stop_ids) : NULL;
    if (!s->prompt || (g->n_logit_bias && !s->bias) || (g->n_stop_ids && !s->stop_ids)) {
        free(s->prompt);
        free(s->bias);
        free(s->stop_ids);
        free(s);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    memcpy(s->prompt, g->prompt, (size_t)g->n_prompt * sizeof *s->prompt);
    if (s->bias) memcpy(s->bias, g->logit_bias, (size_t)g->n_logit_bias * sizeof *s->bias);
    if (s->stop_ids) memcpy(s->stop_ids, g->stop_ids, (size_t)g->n_stop_ids * sizeof *s->stop_ids);
    s->g.prompt = s->prompt;
    s->g.logit_bias = s->bias;
    s->g.stop_ids = s->stop_ids;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    atomic_init(&s->cancel, 0);
    s->refs = 2; /* the engine's and the caller's */
    pthread_mutex_lock(&e->mu);
    if (e->stop || e->queued >= e->p.max_queue) {
        bool stopping = e->stop;
        pthread_mutex_unlock(&e->mu);
        s->refs = 1;
        s->g.constrain_free = NULL; /* a failed submit leaves the constraint with the caller */
        stream_unref(s);
        return stopping ? ember_err(err, EMBER_ERR_LIMIT, "the engine is shutting down")
                        : ember_err(err, EMBER_ERR_LIMIT, "the queue is full (%d requests waiting)", e->p.max_queue);
    }
    e->queued++;
    e->stats.requests_total++;
    e->stats.prompt_tokens_total += (uint64_t)g->n_prompt;
    if (e->inbox_tail)
        e->inbox_tail->next = s;
    else
        e->inbox = s;
    e->inbox_tail = s;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = s;
    return EMBER_OK;
}

void ember_engine_get_stats(ember_engine *e, ember_engine_stats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->stats;
    pthread_mutex_unlock(&e->mu);
}
