/* Nonblocking collectives: a progress thread per ts_coll runs queued
 * operations in order on its own channel (own communicator and staging), so
 * they overlap the caller's computation; blocking calls keep using the main
 * channel meanwhile. Queue order is call order, identical on every rank. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"
#include "src/core/watchdog.h"

#include <stdlib.h>
#include <string.h>

#include "src/core/timer.h"

int ts_chan_create(ts_coll *c, ts_chan *ch);

static void *progress_main(void *arg)
{
    ts_coll *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->head && !c->stop) pthread_cond_wait(&c->cv_work, &c->mu);
        ts_coll_req *r = c->head;
        if (!r) { /* stopping and drained */
            pthread_mutex_unlock(&c->mu);
            break;
        }
        c->head = r->next;
        if (!c->head) c->tail = NULL;
        pthread_mutex_unlock(&c->mu);

        ts_err_clear();
        double t = ts_time_now();
        int e = r->fn ? r->fn(c, c->async, r->ctx) : ts_coll_dispatch(c, c->async, &r->args, -1);
        t = ts_time_now() - t;
        if (e) snprintf(r->msg, sizeof r->msg, "%s", ts_err_message());
        r->err = e;
        pthread_mutex_lock(&c->mu);
        c->async_busy += t;
        atomic_store_explicit(&r->done, 1, memory_order_release);
        pthread_cond_broadcast(&c->cv_done);
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

/* Collective on first use: the async channel and the thread. */
static int ensure_thread(ts_coll *c)
{
    if (c->thread_started) return 0;
    int level = MPI_THREAD_SINGLE, err = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return TS_ERR(TS_ERR_UNSUPPORTED, "nonblocking collectives need MPI initialised with MPI_THREAD_MULTIPLE");
    ts_chan *ch = TS_CALLOC(1, sizeof *ch);
    int lerr = ch ? 0 : TS_ERR_NOMEM;
    TS_CHECK(ts_err_agree(c->base_comm, lerr));
    TS_CHECK(ts_chan_create(c, ch));
    c->async = ch;
    ch = NULL;
    if (pthread_create(&c->thread, NULL, progress_main, c) != 0)
        return TS_ERR(TS_ERR_INTERNAL, "cannot start the collectives progress thread");
    c->thread_started = 1;
cleanup:
    free(ch);
    return err;
}

int ts_coll_async_stop(ts_coll *c)
{
    if (!c->thread_started) return 0;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    c->thread_started = 0;
    c->stop = 0;
    return 0;
}

static int enqueue(ts_coll *c, const ts_coll_args *a, ts_coll_task_fn fn, void *ctx, ts_coll_req **out)
{
    *out = NULL;
    TS_TRY(ensure_thread(c));
    ts_coll_req *r = TS_CALLOC(1, sizeof *r);
    if (!r) return TS_ERR_NOMEM;
    if (a) r->args = *a;
    r->fn = fn;
    r->ctx = ctx;
    r->c = c;
    pthread_mutex_lock(&c->mu);
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    pthread_cond_signal(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    *out = r;
    return 0;
}

int ts_coll_iallreduce(ts_coll *c, const void *sendbuf, void *recvbuf, size_t count, ts_dtype dt, ts_op op,
                       ts_coll_req **req)
{
    ts_coll_args a = {.kind = TS_COLL_ALLREDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dt = dt,
                      .op = op};
    return enqueue(c, &a, NULL, NULL, req);
}

int ts_coll_ireduce_scatter(ts_coll *c, const void *sendbuf, void *recvbuf, size_t count, ts_dtype dt, ts_op op,
                            ts_coll_req **req)
{
    ts_coll_args a = {.kind = TS_COLL_REDUCE_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                      .dt = dt, .op = op};
    return enqueue(c, &a, NULL, NULL, req);
}

int ts_coll_iallgather(ts_coll *c, void *buf, size_t count, ts_dtype dt, ts_coll_req **req)
{
    ts_coll_args a = {.kind = TS_COLL_ALLGATHER, .recvbuf = buf, .count = count, .dt = dt};
    return enqueue(c, &a, NULL, NULL, req);
}

int ts_coll_enqueue_task(ts_coll *c, ts_coll_task_fn fn, void *ctx, ts_coll_req **req)
{
    return enqueue(c, NULL, fn, ctx, req);
}

int ts_coll_test(ts_coll_req *req, int *done)
{
    *done = atomic_load_explicit(&req->done, memory_order_acquire);
    if (*done && req->err) return TS_ERR(req->err, "%s", req->msg);
    return 0;
}

int ts_coll_wait(ts_coll_req **reqp)
{
    if (!reqp || !*reqp) return 0;
    ts_coll_req *r = *reqp;
    ts_coll *c = r->c;
    ts_watch_enter("nonblocking collective (wait)", "collective", 0);
    pthread_mutex_lock(&c->mu);
    while (!atomic_load_explicit(&r->done, memory_order_acquire)) pthread_cond_wait(&c->cv_done, &c->mu);
    pthread_mutex_unlock(&c->mu);
    ts_watch_leave();
    int err = r->err ? TS_ERR(r->err, "%s", r->msg) : 0;
    free(r);
    *reqp = NULL;
    return err;
}

double ts_coll_async_seconds(ts_coll *c)
{
    pthread_mutex_lock(&c->mu);
    double t = c->async_busy;
    pthread_mutex_unlock(&c->mu);
    return t;
}
