/* The process's one pool of worker threads, for the helpers that split work across
 * threads (rows.c: many logits rows; trie_walk.c: many grammar masks). Workers are
 * started on demand and live as long as the process; one job runs at a time (a second
 * caller waits, its GIL released by cffi); the caller's thread works on the job too.
 * A job hands out its own items (an atomic counter in its argument). */
#include <pthread.h>
#include <stdint.h>

#include "internal.h"

#define POOL_MAX_THREADS 64

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_start = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t pool_call = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static int pool_workers = 0;         /* threads started */
static unsigned long pool_round = 0; /* bumped for each job */
static llama_cffi_pool_fn pool_fn = NULL;
static void *pool_arg = NULL;
static int pool_wanted = 0;  /* workers that take part in the current job */
static int pool_running = 0; /* of them, still working */
static int pool_atfork = 0;

static void *pool_worker(void *arg) {
    const int index = (int)(intptr_t)arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&pool_mu);
    for (;;) {
        while (pool_round == seen) pthread_cond_wait(&pool_start, &pool_mu);
        seen = pool_round;
        if (index >= pool_wanted) continue;
        llama_cffi_pool_fn fn = pool_fn;
        void *job = pool_arg;
        pthread_mutex_unlock(&pool_mu);
        fn(job, index);
        pthread_mutex_lock(&pool_mu);
        if (--pool_running == 0) pthread_cond_signal(&pool_done);
    }
    return NULL; /* not reached: workers live as long as the process */
}

/* a child made by fork() has none of the workers: start afresh */
static void pool_after_fork_child(void) {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    pool_mu = mu;
    pool_call = mu;
    pool_start = cv;
    pool_done = cv;
    pool_workers = 0;
    pool_round = 0;
    pool_fn = NULL;
    pool_arg = NULL;
    pool_wanted = pool_running = 0;
}

int llama_cffi_pool_run(int helpers, llama_cffi_pool_fn fn, void *arg) {
    if (helpers > POOL_MAX_THREADS - 1) helpers = POOL_MAX_THREADS - 1;
    if (helpers <= 0) {
        fn(arg, -1);
        return 0;
    }
    pthread_mutex_lock(&pool_call);
    pthread_mutex_lock(&pool_mu);
    if (!pool_atfork) {
        pthread_atfork(NULL, NULL, pool_after_fork_child);
        pool_atfork = 1;
    }
    while (pool_workers < helpers) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&th, &attr, pool_worker, (void *)(intptr_t)pool_workers);
        pthread_attr_destroy(&attr);
        if (rc != 0) break; /* fewer threads: the job is shared by those there are */
        ++pool_workers;
    }
    pool_wanted = pool_workers < helpers ? pool_workers : helpers;
    pool_running = pool_wanted;
    pool_fn = fn;
    pool_arg = arg;
    const int took = pool_wanted;
    ++pool_round;
    pthread_cond_broadcast(&pool_start);
    pthread_mutex_unlock(&pool_mu);
    fn(arg, -1); /* the caller's thread works too */
    pthread_mutex_lock(&pool_mu);
    while (pool_running > 0) pthread_cond_wait(&pool_done, &pool_mu);
    pool_fn = NULL;
    pool_arg = NULL;
    pthread_mutex_unlock(&pool_mu);
    pthread_mutex_unlock(&pool_call);
    return took;
}

int llama_cffi_pool_size(void) {
    pthread_mutex_lock(&pool_mu);
    const int n = pool_workers;
    pthread_mutex_unlock(&pool_mu);
    return n;
}
